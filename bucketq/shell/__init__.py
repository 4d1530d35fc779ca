"""The I/O shells: the machinery that carries ``bucketq.core``'s decisions over a connection. Not public API:
import from ``bucketq`` (or the documented modules) instead."""
