"""Credentials never reach an error, a log line or output (README, Guarantees: Credentials): a table of hostile
URIs (reserved characters in the user name and password, srv, several hosts, options, unparseable strings) over
every CLI command and every library entry that takes a URI, and the clear errors they get instead. The Spark
shells' entries are in tests/spark/test_secrets_spark.py."""

from __future__ import annotations

import functools
import logging
import re
import traceback
import warnings
from collections.abc import Awaitable, Callable, Iterator

import click
import pytest
from click.testing import CliRunner
from pymongo.errors import ServerSelectionTimeoutError

import bucketq
from bucketq.batch import BatchQueue
from bucketq.cli import cli
from bucketq.cli.common import URI_ENV
from bucketq.shell.connection import unreachable
from bucketq.shell.redaction import redact
from tests.hostile_uris import CASES, HOSTILE, UNREACHABLE, assert_hidden

# An unreachable server is waited for until the server selection times out: in the async client, with nothing
# else to do, so the clock skips that wait (tests/fast_clock.py); but the test of what the error says keeps real
# time, for the client's first connection attempt (its address resolved in a thread) to fail within it.
pytestmark = pytest.mark.fast_clock


def test_redact_hides_up_to_the_last_at() -> None:
    assert redact("see mongodb://u:p@ss@h1,h2/db?x=1 now") == "see mongodb://***@h1,h2/db?x=1 now"
    assert redact("mongodb+srv://u:S3cr/pw@h/db") == "mongodb+srv://***@h/db"
    # an '@' after the hosts hides them too: it cannot be told from a password holding '/', '?' and '@'
    assert redact("mongodb://u:p@h/?appName=a@b") == "mongodb://***@b"
    assert redact("mongodb://h:1/db") == "mongodb://h:1/db"
    # given the URI the user passed: wherever its credentials, or pieces of them, are echoed
    uri = "mongodb://alice9:S3cr/pw9@h1:1,h2:2/shop"
    assert redact(f'{uri}: Bad database name "pw9@h1:1,h2:2/shop"', uri) == \
        'mongodb://***@h1:1,h2:2/shop: Bad database name "***@h1:1,h2:2/shop"'
    assert redact("no scheme: alice9:S3cr pw9@h; unknown host PW9@h", "alice9:S3cr pw9@h") == \
        "no scheme: ***@h; unknown host ***@h"
    assert redact("short pieces stay in words: an apple@h; not alone: a@h", "mongodb://a:b@h") == \
        "short pieces stay in words: an apple@h; not alone: ***@h"


def test_redact_leaves_the_words_of_a_message_alone() -> None:
    """Echoed pieces are looked for in URI text only (``:``, ``/`` or ``@`` joining two characters): a user named
    ``user`` with the password ``password`` leaves bucketq's hint and pymongo's message readable."""
    uri = "mongodb://user:password@h:1/shop"
    words = "Username and password must be escaped; in the user name and password"
    assert redact(f"invalid MongoDB URI {uri}: {words}", uri) == f"invalid MongoDB URI mongodb://***@h:1/shop: {words}"
    assert redact("host user:1 and password@h1, not the user's password", uri) == \
        "host ***:1 and ***@h1, not the user's password"


@pytest.mark.parametrize(("uri", "says"), [
    ("mongodb://user:S3cr/pw9@127.0.0.1:{port}/shop", "an '@' follows the hosts; percent-escape ':', '/', '?', '#', "
     "'[', ']' and '@' in the user name and password"),  # bucketq's hint
    ("mongodb://user:S3cr@pw9@127.0.0.1:{port}/shop", "the user name or password holds a reserved character; "
     "percent-escape"),
], ids=["at-after-the-hosts", "reserved-character"])
def test_a_user_named_user_reads_the_error_whole(uri: str, says: str, closed_port: int) -> None:
    """The library's error and the CLI's say what to escape in words the user name does not blank."""
    uri = uri.format(port=closed_port)
    with pytest.raises(bucketq.InvalidOption) as caught:
        bucketq.Queue(uri, name="orders")
    cli_said = CliRunner().invoke(cli, ["stats", "--uri", uri]).stderr
    for said in (str(caught.value), cli_said):
        assert says in said and "mongodb://***@127.0.0.1" in said, said
        assert_hidden(said)


# -- the library ------------------------------------------------------------------------------------------------

async def _push(shell: type[bucketq.Queue] | type[bucketq.Stream], uri: str) -> None:
    opened = shell(uri, name="orders", write_timeout=0.3)
    try:
        await opened.push(1)
    finally:
        await opened.close()


async def _list_queues(uri: str) -> None:
    await bucketq.list_queues(uri)


async def _batch_queue(uri: str) -> None:
    with BatchQueue(uri, name="orders", op_timeout_s=0.3) as batches:
        batches.claim(1)


LIBRARY: dict[str, Callable[[str], Awaitable[None]]] = {
    "Queue": functools.partial(_push, bucketq.Queue), "Stream": functools.partial(_push, bucketq.Stream),
    "list_queues": _list_queues, "BatchQueue": _batch_queue}


def _shown(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)) + repr(error)


@pytest.mark.parametrize("entry", LIBRARY)
@pytest.mark.parametrize(("uri", "says"), CASES)
async def test_library_entries_hide_credentials_of_a_bad_uri(entry: str, uri: str, says: str, closed_port: int,
                                                            everything_logged: Callable[[], str]) -> None:
    with pytest.raises(bucketq.InvalidOption) as caught:
        await LIBRARY[entry](uri.format(port=closed_port))
    message = str(caught.value)
    assert message.startswith("invalid MongoDB URI ") and says in message
    assert_hidden(_shown(caught.value), everything_logged())


async def test_pymongo_uri_warnings_become_redacted_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    uri = "mongodb://alice9:S3crpw9@127.0.0.1:1/shop?w=1&w=2"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none escapes as a warning (pymongo's would show its source path)
        queue = bucketq.Queue(uri, name="orders")
    await queue.close()
    assert [r.getMessage() for r in caplog.records if r.name == "bucketq"] == [
        "MongoDB URI mongodb://***@127.0.0.1:1/shop?w=1&w=2: Duplicate URI option 'w'."]


@pytest.mark.real_time
@pytest.mark.parametrize("entry", LIBRARY)
async def test_an_unreachable_server_is_a_bucketq_error(entry: str, closed_port: int,
                                                       everything_logged: Callable[[], str]) -> None:
    with pytest.raises(bucketq.ServerUnreachable) as caught:
        await LIBRARY[entry](UNREACHABLE.format(port=closed_port))
    message = str(caught.value)
    assert message.startswith(f"cannot reach MongoDB at mongodb://***@127.0.0.1:{closed_port}/shop?"
                              "serverSelectionTimeoutMS=100: tried "), message
    assert f": 127.0.0.1:{closed_port}: " in message  # what the server said
    assert isinstance(caught.value, ServerSelectionTimeoutError)  # caught as before bucketq wrapped it
    assert_hidden(_shown(caught.value), everything_logged())


@pytest.mark.parametrize("entry", ["Queue", "Stream", "BatchQueue"])
async def test_an_unreachable_server_fails_within_the_write_timeout_the_error_names(entry: str,
                                                                                   closed_port: int) -> None:
    # no serverSelectionTimeoutMS in the URI: the driver's own is 30 s, which the first contact must not wait out
    with pytest.raises(bucketq.ServerUnreachable) as caught:
        await LIBRARY[entry](f"mongodb://127.0.0.1:{closed_port}/shop")
    tried = re.search(r"tried [a-z ]+ for ([0-9.]+) s \((?:write|op)_timeout(?:_s)? 0.3 s\)", str(caught.value))
    assert tried is not None, str(caught.value)
    assert float(tried[1]) < 10, "it waited for the driver's server selection, not its own timeout"


def test_an_unreachable_server_is_said_once_with_its_uri_and_without_pymongos_topology() -> None:
    uri = "mongodb://alice:Pa55word@db.example:27017/shop"
    pymongos = ServerSelectionTimeoutError(
        "db.example:27017: [Errno 111] Connection refused (configured timeouts: socketTimeoutMS: 20000.0ms, "
        "connectTimeoutMS: 20000.0ms), Timeout: 0.2s, Topology Description: <TopologyDescription id: 1, "
        "topology_type: Unknown, servers: [<ServerDescription ('db.example', 27017) server_type: Unknown>]>")
    said = unreachable(uri, pymongos)
    assert said == "cannot reach MongoDB at mongodb://***@db.example:27017/shop: db.example:27017: [Errno 111] " \
                   "Connection refused"
    # what bucketq raised already (reaching: what was tried, for how long) is said as it is, not wrapped again
    assert unreachable(uri, bucketq.ServerUnreachable(said)) == said


# -- the CLI ------------------------------------------------------------------------------------------------------

ARGS: dict[tuple[str, ...], list[str]] = {  # each command, with what it needs besides the URI
    ("stats",): [], ("peek",): ["q"], ("push",): ["q", "1"], ("drain",): ["q"],
    ("worker",): ["tests.entrypoints.cli_handlers:record", "--queue", "q", "--log-level", "debug"],
    ("relay",): ["orders", "--queue", "q", "--once", "--log-level", "debug"],
    ("dead", "list"): ["q"], ("dead", "requeue"): ["q", "--yes"], ("dead", "purge"): ["q", "--yes"],
    ("quarantine", "list"): ["q"], ("quarantine", "requeue"): ["q", "--yes"], ("quarantine", "purge"): ["q", "--yes"],
    ("stream", "list"): ["s"], ("stream", "lag"): ["s"], ("stream", "reset"): ["s", "g", "--beginning"],
    ("pause",): ["q"], ("resume",): ["q"], ("remove",): ["q", "6536f3a2c1d2e3f4a5b6c7d8:0"],
    ("cancel",): ["q", "6536f3a2c1d2e3f4a5b6c7d8:0"], ("purge",): ["q", "--yes"],
    ("web",): ["--port", "0"],
}


def _commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found = set()
    for name, command in group.commands.items():
        found |= _commands(command, (*path, name)) if isinstance(command, click.Group) else {(*path, name)}
    return found


NO_URI = {("shard",)}  # prints commands, connects to nothing: takes no URI


def test_the_table_covers_every_command() -> None:
    assert _commands() == set(ARGS) | NO_URI


@pytest.fixture
def root_logging() -> Iterator[None]:
    """``--log-level`` reconfigures the root logger: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("via_env", [False, True], ids=["--uri", URI_ENV])
@pytest.mark.parametrize("command", sorted(ARGS), ids=" ".join)
def test_no_cli_command_shows_credentials(command: tuple[str, ...], via_env: bool, closed_port: int,
                                          root_logging: None, everything_logged: Callable[[], str]) -> None:
    for uri, says in [(uri, says) for _, uri, says in HOSTILE] + [(UNREACHABLE, "cannot reach MongoDB at")]:
        uri = uri.format(port=closed_port)
        args = [*command, *ARGS[command], "--connect-timeout", "0.1", *([] if via_env else ["--uri", uri])]
        result = CliRunner().invoke(cli, args, env={URI_ENV: uri if via_env else None})
        assert result.exit_code in (1, 2) and "Traceback" not in result.stderr, (uri, result.output)
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith("Error: ") and says in error, (uri, result.stderr)
        assert_hidden(result.output, result.stderr, everything_logged())


@pytest.mark.parametrize("uri", [pytest.param(uri, id=case) for case, uri, _ in HOSTILE if "://" in uri])
def test_a_uri_typed_for_a_command_is_hidden(uri: str, closed_port: int) -> None:
    """Any argument with ``://`` is taken for a URI: its credentials are hidden wherever it was typed."""
    result = CliRunner().invoke(cli, [uri.format(port=closed_port)])
    assert result.exit_code == 2 and "No such command" in result.stderr
    assert_hidden(result.output, result.stderr)
