"""The ``bucketq`` command line: inspect, feed, drain and work queues. ``bucketq --help`` lists the commands.

One module per family of commands: ``queues`` (stats, peek, drain), ``push``, ``entries`` (dead, quarantine),
``worker``, ``relay`` (the outbox relay). Shared pieces: ``common`` (options, connection, finding queues, running,
one-line redacted errors, signals), ``params`` (durations), ``output`` (rich tables; the JSON and short human
forms it shares with the dashboard are ``bucketq.shell.text_views``).
``operator`` has the operator controls (pause, resume, remove, cancel, purge); ``streams`` a stream's reader groups;
``shard`` prints the commands that shard a queue (docs/SCALING.md); ``web`` serves the dashboard (``bucketq.web``).
"""

from __future__ import annotations

from typing import Any

import click

from bucketq.cli.common import log_to_stderr, redacted, remember_uris
from bucketq.cli.entries import group
from bucketq.cli.operator import cancel, pause, purge, remove, resume
from bucketq.cli.push import push
from bucketq.cli.queues import drain, peek, stats
from bucketq.cli.relay import relay
from bucketq.cli.shard import shard
from bucketq.cli.streams import stream
from bucketq.cli.web import web
from bucketq.cli.worker import worker
from bucketq.shell.text_views import DEAD, QUARANTINE

__all__ = ["cli", "main"]


class _Group(click.Group):
    """The top-level group: parsing and running every command happens within ``redacted``."""

    def make_context(self, info_name: str | None, args: list[str], *rest: Any, **kwargs: Any) -> click.Context:
        remember_uris(args)
        with redacted():
            return super().make_context(info_name, args, *rest, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with redacted():
            return super().invoke(ctx)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             no_args_is_help=True)
@click.version_option(package_name="bucketq")
def cli() -> None:
    """Inspect and operate bucketq queues on MongoDB.

    Every command takes --uri (default: $BUCKETQ_MONGODB_URI) and --db (default: the URI's database, else
    'bucketq'); `shard`, which only prints, takes --db. Run `bucketq COMMAND --help` for its options and examples.

    \b
    Examples:
      export BUCKETQ_MONGODB_URI=mongodb://localhost:27017/app
      bucketq push events '{"user": 1}'
      bucketq stats
      bucketq worker myapp.tasks:handle --queue events
      bucketq pause events
    """


for command in (stats, peek, push, drain, worker, relay, group(DEAD), group(QUARANTINE), stream, shard, web):
    cli.add_command(command)
for command in (pause, resume, remove, cancel, purge):  # operator controls
    cli.add_command(command)


def main() -> None:
    log_to_stderr("warning")
    cli.main(prog_name="bucketq")
