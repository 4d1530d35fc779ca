"""The modules a test runs in another process: as ``python -m tests.entrypoints.NAME``, or loaded by name
(``tests.entrypoints.NAME:FUNCTION``) by a ``bucketq worker`` that a test starts. Such modules live here only
(tests/test_test_layout.py checks it)."""
