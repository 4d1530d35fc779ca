"""``bucketq shard``: the mongosh commands that shard a queue's collections (docs/SCALING.md). It prints them and
connects to nothing: sharding is a cluster administrator's step, run once on a mongos."""

from __future__ import annotations

import click

from bucketq.cli.common import BadUsage
from bucketq.core.format import STREAM_SUFFIXES  # .positions, .claims, .seq
from bucketq.core.sharding import MAX_PARTITIONS, QUEUE_UNSHARDED, shard_commands
from bucketq.core.stream_format import STREAM_SHARD_KEYS
from bucketq.errors import InvalidOption
from bucketq.options import check_names

DEFAULT_DB = "bucketq"


@click.command()
@click.argument("queue")
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), default=1, show_default=True,
              help="The queue's `partitions` option (every client of the queue uses the same).")
@click.option("--shards", type=click.IntRange(1, MAX_PARTITIONS), default=None, metavar="N",
              help="Zones to split the partitions into, one per shard [default: one zone per partition].")
@click.option("--db", default=DEFAULT_DB, show_default=True, metavar="NAME", help="Database of the queue.")
@click.option("--stream", is_flag=True, help="QUEUE is a stream: its buckets are sharded on {pt: 1, s: 1} "
              "(docs/SCALING.md, Streams).")
def shard(queue: str, partitions: int, shards: int | None, db: str, stream: bool) -> None:
    """Print the mongosh commands that shard QUEUE (or a stream, with --stream) on a sharded cluster; run them
    on a mongos.

    The buckets collection is sharded (sh.shardCollection) on {pt: 1, _id: 1}: every claim names one
    partition (pt) and every later write names pt and _id, so each is routed to one shard (only the operator
    commands stats, remove and purge scatter to every shard). The createIndex line builds the shard
    key's index, which a collection holding documents needs first. Zones: the partitions are split into
    ranges, each range a zone (sh.updateZoneKeyRange), so that a partition's chunks stay on one shard; give
    each zone a shard with the commented sh.addShardToZone line (shard names are your cluster's). The side
    collections stay unsharded (listed at the end, with why); the inbox's line is commented out: shard it only
    when it outgrows a shard. Connects to nothing (no --uri): it only prints.

    \b
    Examples:
      bucketq shard events --partitions 8 --shards 4
      bucketq shard events --partitions 8 --db app | mongosh "mongodb://mongos:27017"
    """
    try:
        check_names(queue, db)
    except InvalidOption as exc:
        raise BadUsage(str(exc)) from None
    if stream:
        lines = shard_commands(db, queue, partitions, keys=STREAM_SHARD_KEYS, optional={}, shards=shards)
        unsharded = dict(zip(STREAM_SUFFIXES, ("a document per reader group", "a document per claim being served",
                                               "a counter per partition"), strict=True))
    else:
        lines, unsharded = shard_commands(db, queue, partitions, shards=shards), QUEUE_UNSHARDED
    for line in lines:
        click.echo(line)
    for suffix, why in unsharded.items():
        click.echo(f"// {db}.{queue}{suffix}: unsharded ({why})")
