"""The stores: ``bucketq.store.aio`` is their source, written async once; ``bucketq.store.sync`` is generated
from it (``devtools/unasync.py``)."""
