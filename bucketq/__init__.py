"""bucketq: a high-throughput queue on MongoDB that packs many messages into one bucket document.

    q = bucketq.Queue("mongodb://localhost:27017", name="events")
    await q.push({"hello": "world"})          # resolves once the bucket holding it is stored
    msg = await q.reserve(timeout=5)
    await msg.ack()
"""

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]).
__version__ = "0.1.0"

from bucketq.codecs import BsonCodec, Codec, CodecUnavailable, JsonCodec, MsgpackCodec
from bucketq.core.format import FORMAT_VERSION
from bucketq.core.rate_limit import RateLimit
from bucketq.core.stream_format import Position
from bucketq.errors import (
    AlreadyResolved,
    BucketqError,
    BufferFull,
    EncodeError,
    HandlerTimeout,
    InvalidOption,
    LeaseLost,
    MalformedBucket,
    MessageHeld,
    PayloadTooLarge,
    QueueClosed,
    WriteFailed,
)
from bucketq.message import Message
from bucketq.options import QueueOptions, StreamOptions
from bucketq.outbox import Outbox
from bucketq.queue import Queue
from bucketq.schedule import Schedule
from bucketq.shell.compatibility import ServerRefused
from bucketq.shell.connection import ServerUnreachable
from bucketq.shell.discovery import list_queues
from bucketq.shell.producer import Outgoing
from bucketq.shell.stream_reader import StreamMessage, StreamReader
from bucketq.stream import Stream
from bucketq.sync_producer import SyncProducer
from bucketq.worker import BatchTiming, Reject, Retry, Worker

__all__ = [
    "FORMAT_VERSION", "AlreadyResolved", "BatchTiming", "BsonCodec", "BucketqError", "BufferFull", "Codec",
    "CodecUnavailable", "EncodeError", "HandlerTimeout", "InvalidOption", "JsonCodec", "LeaseLost", "MalformedBucket",
    "Message",
    "MessageHeld", "MsgpackCodec", "Outbox", "Outgoing", "PayloadTooLarge", "Queue", "QueueClosed", "QueueOptions",
    "Position", "RateLimit", "Reject", "Retry", "Schedule", "ServerRefused", "ServerUnreachable", "Stream",
    "StreamMessage", "StreamOptions", "StreamReader", "SyncProducer", "Worker", "WriteFailed", "list_queues",
]
