"""Streams, sans I/O: the stream bucket document, positions, partitions and the sequence counter. The rules are in
docs/FORMAT.md (Streams); the other stream modules of ``bucketq.core``: ``reader_groups`` (a group's state,
commits), ``stream_claims``, ``stream_held`` (a bucket a reader holds), ``stream_gaps`` (hole filling),
``stream_retention``, ``stream_stats`` (lag) and ``stream_step`` (a reader's next step).

A stream ``S`` keeps its buckets in the collection ``S`` with ``_id`` = *sequence*, an int allocated by ``$inc`` on
the counter document in ``S.seq`` (one round trip per write of up to 8 buckets, no lock held while writing), so
buckets of concurrent writes may land out of order, or never (a producer killed between allocation and insert:
``stream_gaps``). A stream of ``partitions > 1`` (format version 2) has one such sequence per partition: its
buckets carry ``pt`` and ``s`` (unique together, the shard key) and every rule holds per partition
(``Partition`` says where a partition's documents are). A message's *position* is ``(sequence, slot)`` in its
partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from bson import ObjectId

from bucketq.core.format import FORMAT_VERSION, payload_size
from bucketq.core.sharding import MAX_PARTITIONS
from bucketq.errors import InvalidOption

COUNTER_ID = "seq"
LAYOUT_ID = "layout"  # in ``S.seq``: a partitioned stream's version and partition count
PARTITIONED_VERSION = 2  # the format version of a partitioned stream's documents
STREAM_SHARD_KEYS = {"": {"pt": 1, "s": 1}}  # by collection suffix; the side collections stay unsharded
FIRST_SEQUENCE = 1


class Position(NamedTuple):
    """Where a message sits in a stream: its bucket's sequence and its slot, in its ``partition`` (0 in a stream
    of one partition). Within a partition ordered like the stream; its text form is ``"<sequence>:<slot>"``, or
    ``"<partition>/<sequence>:<slot>"`` in a partition other than 0. A group's committed position (one per
    partition) is the first one it has not read."""

    seq: int
    slot: int = 0
    partition: int = 0

    def __str__(self) -> str:
        return f"{self.partition}/{self.seq}:{self.slot}" if self.partition else f"{self.seq}:{self.slot}"

    @classmethod
    def parse(cls, value: Position | str | tuple[int, ...]) -> Position:
        """A Position from itself, ``"[<partition>/]<sequence>[:<slot>]"``, a pair (sequence, slot) or a triple
        (sequence, slot, partition); ``InvalidOption`` else."""
        if isinstance(value, str):
            partition, _, rest = value.rpartition("/")
            seq, _, slot = rest.partition(":")
            try:
                value = (int(seq), int(slot or 0), int(partition or 0))
            except ValueError:
                raise InvalidOption(f"a position is '[<partition>/]<sequence>:<slot>', got {value!r}") from None
        if (not isinstance(value, tuple) or len(value) not in (2, 3)
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                or not (0 <= value[0] <= 2**62 and 0 <= value[1] < 65536)
                or len(value) == 3 and not 0 <= value[2] < MAX_PARTITIONS):
            raise InvalidOption(f"a position is a sequence (0 to 2**62), a slot (0 to 65535) and a partition "
                                f"(0 to {MAX_PARTITIONS - 1}, 0 when left out), got {value!r}")
        return cls(*value)


@dataclass(frozen=True)
class Partition:
    """Where the documents of one partition of a stream of ``of`` partitions are, in each collection. A stream
    of one partition keeps format version 1: bucket ``_id`` = sequence, one counter ``"seq"``, a group's ``s``
    and ``i`` are ints. Of more: version 2, buckets ``{pt, s}`` (the shard key; ``_id`` ``"<pt>/<s>"``), counters
    ``"seq.<pt>"``, a group's ``s`` and ``i`` are arrays indexed by partition, claims keyed by ``pt`` too."""

    number: int = 0
    of: int = 1

    @property
    def partitioned(self) -> bool:
        return self.of > 1

    @property
    def version(self) -> int:
        return PARTITIONED_VERSION if self.partitioned else FORMAT_VERSION

    @property
    def seq_field(self) -> str:
        """The field of ``S`` holding a document's sequence."""
        return "s" if self.partitioned else "_id"

    def seqs(self, condition: Any) -> dict[str, Any]:
        """A filter on ``S``: this partition's documents whose sequence matches ``condition``."""
        return {"pt": self.number, "s": condition} if self.partitioned else {"_id": condition}

    def seq_of(self, doc: Mapping[str, Any]) -> int:
        return int(doc[self.seq_field])

    def doc_fields(self, seq: int) -> dict[str, Any]:
        """Where a document of ``S`` at ``seq`` is: version 1, ``_id`` = sequence; version 2, ``pt`` and ``s``,
        and ``_id`` = ``"<pt>/<s>"``. Either way ``_id`` is unique for a sequence of the partition (on a sharded
        cluster ``_id`` is unique per shard, and every ``{pt, s}`` lives on one shard, its chunk's)."""
        if self.partitioned:
            return {"_id": f"{self.number}/{seq}", "pt": self.number, "s": seq}
        return {"_id": seq}

    @property
    def counter_id(self) -> str:
        return f"{COUNTER_ID}.{self.number}" if self.partitioned else COUNTER_ID

    def group_field(self, name: str) -> str:
        """A group document's ``s`` or ``i`` of this partition."""
        return f"{name}.{self.number}" if self.partitioned else name

    def label(self, seq: int) -> str | int:
        """What a pushed message's position starts with (``"<label>:<slot>"``)."""
        return f"{self.number}/{seq}" if self.number else seq


def partitions_of(count: int) -> list[Partition]:
    return [Partition(number, count) for number in range(count)]


def layout_doc(partitions: int) -> tuple[dict, dict]:
    """(filter, update) for an upsert in ``S.seq``: a partitioned stream's layout, written once."""
    return {"_id": LAYOUT_ID}, {"$setOnInsert": {"v": PARTITIONED_VERSION, "partitions": partitions}}


def stored_partitions(layout: Mapping[str, Any] | None, has_counter: bool, wanted: int | None) -> int:
    """The stream's partition count: its layout's, 1 for a version-1 stream (a counter but no layout), else
    ``wanted`` (a new stream; default 1). ``InvalidOption`` when ``wanted`` differs from what is stored."""
    stored = int(layout["partitions"]) if layout else 1 if has_counter else None
    if stored is not None and wanted is not None and wanted != stored:
        what = "a version-1 stream (one sequence)" if not layout else f"partitioned in {stored}"
        raise InvalidOption(f"the stream is {what}: partitions={wanted} cannot apply; a stream's partitions are "
                            f"fixed when it is created (push to a new stream to change them)")
    return stored if stored is not None else wanted or 1


# -- producer ------------------------------------------------------------------------------------------------

def allocate(part: Partition, count: int) -> tuple[dict, dict]:
    """(filter, update) for findOneAndUpdate(upsert, return after): reserve ``count`` sequences of ``part``. The
    last one reserved is the counter's new ``last``; the first is ``last - count + 1``."""
    return {"_id": part.counter_id}, {"$inc": {"last": count}}


def stream_bucket(sealed: Mapping[str, Any], part: Partition) -> dict[str, Any]:
    """The stream bucket holding the slots of a bucket the producer's accumulator sealed, once its sequence is
    ``s`` and its own ObjectId moved to ``b`` (so that a retried insert can tell its document from a gap
    marker). The queue-only fields (due, done, c, lease) go; ``bytes`` (payload bytes) serves size retention.
    Where it is: ``Partition.doc_fields``."""
    payloads = sealed["p"]
    doc: dict[str, Any] = {**part.doc_fields(sealed["s"]), "v": part.version, "b": sealed["b"], "enc": sealed["enc"],
                           "created": sealed["created"], "n": sealed["n"], "p": payloads,
                           "bytes": sum(map(payload_size, payloads))}
    for per_slot in ("h", "k"):
        if per_slot in sealed:
            doc[per_slot] = sealed[per_slot]
    return doc


def own_bucket(part: Partition, seq: int, bucket_id: ObjectId) -> dict:
    """Matches the bucket at ``seq`` only if this producer's insert stored it (not a gap marker)."""
    return {**part.seqs(seq), "b": bucket_id}
