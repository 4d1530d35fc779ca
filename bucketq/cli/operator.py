"""``bucketq pause``, ``resume``, ``remove``, ``cancel`` and ``purge``: operator controls over a whole queue or one
message."""

from __future__ import annotations

import click

from bucketq.cli.common import BadUsage, CliError, Target, confirm, connection_options, open_queue, run
from bucketq.core.cancel import NOT_FOUND
from bucketq.core.operator_writes import producer_bucket
from bucketq.errors import MessageHeld
from bucketq.shell.pause_gate import PAUSE_REFRESH_S


@click.command()
@click.argument("queue")
@connection_options
def pause(target: Target, queue: str) -> None:
    """Pause QUEUE for every consumer: they stop claiming new buckets within a second, and finish the buckets
    they hold. Pushes still work. The pause is stored in the database and lasts until `bucketq resume`.

    \b
    Examples:
      bucketq pause events
      bucketq stats events        # shows "events (paused)"
    """
    run(_pause(target, queue, True))


@click.command()
@click.argument("queue")
@connection_options
def resume(target: Target, queue: str) -> None:
    """Resume QUEUE after `bucketq pause`: consumers claim again within a second or so.

    \b
    Examples:
      bucketq resume events
    """
    run(_pause(target, queue, False))


async def _pause(target: Target, name: str, paused: bool) -> None:
    async with open_queue(target, name) as queue:
        was = await queue.paused()
        await (queue.pause() if paused else queue.resume())
    if was == paused:
        click.echo(f"queue {name!r} was already {'paused' if paused else 'running'}")
    elif paused:
        click.echo(f"paused queue {name!r}: consumers stop claiming within {PAUSE_REFRESH_S:g}s; pushes still work")
    else:
        click.echo(f"resumed queue {name!r}")


@click.command()
@click.argument("queue")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@connection_options
def remove(target: Target, queue: str, ids: tuple[str, ...]) -> None:
    """Remove pending messages of QUEUE by id, so that no consumer delivers them.

    Ids are those `bucketq peek --json` and `bucketq drain --meta` print; another string is refused as
    malformed (exit code 2) before anything is removed. A message in a bucket that a
    consumer holds right now is not removed (it may be being handled): the command says so and exits
    with 1; try again later. Finding retried messages scans the queue.

    \b
    Examples:
      bucketq remove events 6b0340a5e418eb7f18364742:3
      bucketq peek events --json | jq -r .id | head -5 | xargs bucketq remove events
    """
    _check_ids(ids, "removed")
    run(_remove(target, queue, ids))


def _check_ids(ids: tuple[str, ...], done: str) -> None:
    malformed = [i for i in ids if producer_bucket(i) is None]
    if malformed:  # checked before connecting: nothing is done
        raise BadUsage(f"malformed message id(s) {', '.join(map(repr, malformed))}: an id looks like "
                       f"6b0340a5e418eb7f18364742:3 (<bucket as 24 hex digits>:<slot>); nothing {done}")


async def _remove(target: Target, name: str, ids: tuple[str, ...]) -> None:
    problems = []
    async with open_queue(target, name) as queue:
        for message_id in ids:
            try:
                removed = await queue.remove(message_id)
            except MessageHeld as exc:
                problems.append(str(exc))
                continue
            if removed:
                click.echo(f"removed {message_id}")
            else:
                problems.append(f"no pending message {message_id!r} in queue {name!r}")
    if problems:
        raise CliError(f"{len(problems)} of {len(ids)} message(s) not removed: {'; '.join(problems)}")


@click.command()
@click.argument("queue")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@connection_options
def cancel(target: Target, queue: str, ids: tuple[str, ...]) -> None:
    """Cancel messages of QUEUE by id: a pending one is never delivered, and its record goes to the dead letters
    (error "cancelled"); one a consumer holds is asked to stop (its handler sees `message.cancelled`) and ends
    as cancelled. Prints each id with what happened: cancelled, requested (a consumer holds it), or not_found
    (exit code 1). Malformed ids are refused (exit code 2) before anything is cancelled.

    \b
    Examples:
      bucketq cancel events 6b0340a5e418eb7f18364742:3
      bucketq dead list events      # the records: error "cancelled"
    """
    _check_ids(ids, "cancelled")
    run(_cancel(target, queue, ids))


async def _cancel(target: Target, name: str, ids: tuple[str, ...]) -> None:
    async with open_queue(target, name) as queue:
        outcomes = [(message_id, await queue.cancel(message_id)) for message_id in ids]
    for message_id, outcome in outcomes:
        click.echo(f"{outcome} {message_id}")
    missing = [message_id for message_id, outcome in outcomes if outcome == NOT_FOUND]
    if missing:
        raise CliError(f"{len(missing)} of {len(ids)} message(s) not found pending in queue {name!r}: "
                       f"{', '.join(missing)}")


@click.command()
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before purging.")
@connection_options
def purge(target: Target, queue: str, yes: bool) -> None:
    """Delete every message of QUEUE: ready, scheduled and in flight. Asks for confirmation unless given --yes.

    Dead letters and quarantined entries are kept (see `bucketq dead purge`). Consumers holding a bucket of
    QUEUE lose it: the acks they have not flushed yet are refused.

    \b
    Examples:
      bucketq purge events
      bucketq purge events --yes
    """
    run(_purge(target, queue, yes))


async def _purge(target: Target, name: str, yes: bool) -> None:
    async with open_queue(target, name) as queue:
        row = await queue.stats()
        pending = row["ready"] + row["scheduled"] + row["in_flight"]
        if not row["buckets"]:
            click.echo(f"queue {name!r} has no messages; nothing purged")
            return
        if not yes:
            confirm(f"Purge {pending:,} message(s) ({row['ready']:,} ready, {row['scheduled']:,} scheduled, "
                    f"{row['in_flight']:,} in flight) of queue {name!r}?", "purge", "purged")
        purged = await queue.purge()
    click.echo(f"purged {purged:,} message(s) of queue {name!r}")
