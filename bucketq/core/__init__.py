"""The bucket protocol as pure functions and small classes: no I/O, no clock reads, no event loop.

``format`` (document layout and validation), ``accumulator`` (producer batching), ``claims`` (lease filters
and updates), ``held`` (per-message state of a claimed bucket and its flush plans), ``backoff`` and ``stats``.
The multi-step conversations are generators that yield the next store call and take its reply back:
``group_turn`` (an ordered group's turn), ``batch_attempt`` (the batch consumer's attempts); ``outbox_plan``
plans an outbox relay pass. Streams have modules of their own, named after the queue's where the topic is the
same (``stream_format``, ``stream_claims``, ``stream_held``, ``stream_stats``, ...). The shells in ``bucketq.shell``
(and the public modules of ``bucketq``) execute what these return.
"""
