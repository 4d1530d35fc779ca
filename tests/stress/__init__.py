"""The crash and fault harness (issue 6); see ``tests/stress/harness.py`` for the run and
``tests/stress/accounting.py`` for what each number of the report means and what the design allows."""
