"""Whole-collection reads: only what an operator asks for (``stats``, listings and purges by error text,
``purge``, ``list_queues``) reads a collection through, and says so with MongoDB's ``comment`` (shown by the
profiler, ``currentOp`` and the slow-query log; the in-memory database's ``notablescan`` mode lets these through).
Every other query bucketq sends is served by an index: docs/FORMAT.md, "Indexes"."""

SCAN_COMMENT = "bucketq:scan"
SCAN: dict[str, str] = {"comment": SCAN_COMMENT}  # keyword arguments of a driver call that scans
