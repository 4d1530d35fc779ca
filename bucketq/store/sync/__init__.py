# Generated from bucketq/store/aio/__init__.py by devtools/unasync.py; do not edit.
# Edit the async source and run `python -m devtools.unasync`.
"""The stores: ``bucketq.store.aio`` is their source, written async once; ``bucketq.store.sync`` is generated
from it (``devtools/unasync.py``)."""
