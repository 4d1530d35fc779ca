"""Every command bucketq sends to MongoDB: the shells (``Queue``, ``Stream``, the readers, the outbox
relay, the CLI, ``BatchQueue`` and the Spark shells) call store methods only.

``aio``: the stores, written async once: ``AsyncQueueStore`` (a queue's collections), ``AsyncStreamStore`` (a
stream's), ``OutboxStore`` (the relay's source collection), and the helpers they share (``base``: retries,
idempotent inserts), plus what only asyncio callers need (``changes``: change streams; ``catalog``: reads of a
database's collections). ``sync``: ``QueueStore`` and ``StreamStore`` for the Spark driver, generated from
``aio`` by ``devtools/unasync.py`` (never edited by hand; ``make lint`` fails when they are stale).
"""
