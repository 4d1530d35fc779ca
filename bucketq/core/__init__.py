"""The bucket protocol as pure functions and small classes: no I/O, no clock reads, no event loop.

``format`` (document layout and validation), ``accumulator`` (producer batching), ``claims`` (lease filters
and updates), ``held`` (per-message state of a claimed bucket and its flush plans), ``backoff`` and ``stats``.
The async shells in ``bucketq`` execute what these return.
"""
