"""The consume path, one job per module: ``consumer`` (``Consumer``: reserve, serve, resolve), ``claiming``,
``decoding``, ``group_turns``, ``flushing``, ``draining``, and what they share (``holding``, ``tasks``,
``dedupe_keys``)."""

from bucketq.consumer.consumer import Consumer
from bucketq.consumer.holding import Holding

__all__ = ["Consumer", "Holding"]
