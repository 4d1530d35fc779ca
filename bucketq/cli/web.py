"""``bucketq web``: serve the dashboard (``bucketq.web``) of one database until SIGTERM or Ctrl-C."""

from __future__ import annotations

import click

from bucketq.cli.common import BadUsage, CliError, Target, connection_options, database, log_options, log_to_stderr, run
from bucketq.cli.params import DURATION
from bucketq.errors import InvalidOption
from bucketq.web.security import TOKEN_ENV, check_bind


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to serve on. Any address but a loopback one needs --token.")
@click.option("--port", type=click.IntRange(0, 65535), default=8089, show_default=True)
@click.option("--token", envvar=TOKEN_ENV, show_envvar=True, metavar="TOKEN",
              help="Every page then asks for it (a log-in form; or the header Authorization: Bearer TOKEN).")
@click.option("--allow-actions", is_flag=True,
              help="Offer requeue, purge, pause, resume and reader-group resets (each asks for confirmation). "
                   "Needs --token.")
@click.option("--interval", type=DURATION, default=10.0, show_default=True, metavar="DURATION",
              help="How often the charts are sampled (they keep the last hour, in memory).")
@log_options
@connection_options
def web(target: Target, host: str, port: int, token: str | None, allow_actions: bool, interval: float,
        log_level: str, driver_log_level: str) -> None:
    """Serve a web dashboard of the queues and streams of the database: counts, charts of the last hour, dead
    letters and quarantine, reader groups, and (with --allow-actions and --token) the operator actions.

    Read-only by default. Open http://HOST:PORT/ in a browser.

    \b
    Examples:
      bucketq web
      bucketq web --port 9000
      BUCKETQ_WEB_TOKEN=$(openssl rand -hex 16) bucketq web --host 0.0.0.0 --allow-actions
    """
    try:
        check_bind(host, token)
        if allow_actions and not token:
            raise InvalidOption(f"--allow-actions needs a token: --token or ${TOKEN_ENV}")
    except InvalidOption as exc:
        raise BadUsage(str(exc)) from None
    log_to_stderr(log_level, driver_log_level)
    run(_serve(target, host, port, token, allow_actions, interval))


async def _serve(target: Target, host: str, port: int, token: str | None, allow_actions: bool,
                 interval: float) -> None:
    try:
        import uvicorn

        from bucketq.web.app import create_app
    except ImportError as exc:
        raise CliError(f"bucketq web needs the web extra: pip install 'bucketq[web]' ({exc})") from None
    async with database(target) as db:
        app = create_app(db, token=token, allow_actions=allow_actions, interval_s=interval)
        click.echo(f"dashboard of database {db.name!r} on http://{host}:{port}/ "
                   f"({'actions allowed' if allow_actions else 'read-only'}); stop with Ctrl-C", err=True)
        # log_config=None: uvicorn's lines go through the redacting handler of log_to_stderr
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None)).serve()
