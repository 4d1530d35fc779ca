"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from hypothesis import settings
from pymongo import monitoring
from pymongo.errors import AutoReconnect

import bucketq
from bucketq.shell.collection_setup import stop
from tests.proxy import TcpProxy

# For a pytest run in a subprocess on a file of its own: this venv's plugins that such a run does not need (xdist,
# anyio's, Hypothesis's) turned off, and the cache: they were two thirds of its start-up CPU time.
SUBPROCESS_PYTEST_PLUGINS_OFF = tuple(arg for plugin in ("cacheprovider", "xdist", "anyio", "hypothesispytest")
                                      for arg in ("-p", f"no:{plugin}"))
PATIENCE_S = 20.0  # how long a test waits for what must happen: generous, so a loaded CI machine cannot fail it


def utc_now() -> dt.datetime:
    """The wall clock as bucketq and the in-memory database read it: ``time.time``, which moves on with the clock
    that skips idle waits (tests/fast_clock.py), where ``datetime.now`` stays behind."""
    return dt.datetime.fromtimestamp(time.time(), dt.timezone.utc)


def seconds_ago(seconds: float = 5) -> dt.datetime:
    """``utc_now()`` less ``seconds``: a due time or lease already past."""
    return utc_now() - dt.timedelta(seconds=seconds)


def step_local_clock(monkeypatch: Any, seconds: float) -> None:
    """Step this host's wall clock by ``seconds``, as an NTP step or a hand would: ``time.time`` and
    ``datetime.now`` (and ``utcnow``) read it moved for the rest of the test; the monotonic clock, and so
    bucketq's reading of the server's clock once measured, do not move. ``datetime.datetime`` becomes a subclass
    whose ``isinstance`` checks still take every real datetime (those the driver decodes)."""
    real_time, real_datetime, step = time.time, dt.datetime, dt.timedelta(seconds=seconds)

    class _Real(type):
        def __instancecheck__(cls, value: object) -> bool:
            return isinstance(value, real_datetime)

        def __subclasscheck__(cls, other: type) -> bool:
            return issubclass(other, real_datetime)

    class SteppedDatetime(dt.datetime, metaclass=_Real):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return real_datetime.now(tz) + step

        @classmethod
        def utcnow(cls) -> dt.datetime:  # type: ignore[override]
            return real_datetime.now(dt.timezone.utc).replace(tzinfo=None) + step

    monkeypatch.setattr(time, "time", lambda: real_time() + seconds)
    monkeypatch.setattr(dt, "datetime", SteppedDatetime)


def examples(n: int) -> int:
    """A property test's ``max_examples``: ``n`` under Hypothesis's default profile (100 examples), scaled like the
    loaded profile's (tests/conftest.py: a tenth for make unit)."""
    return max(1, n * settings.default.max_examples // 100)


async def eventually(condition: Callable[[], bool | Awaitable[bool]], timeout: float = PATIENCE_S,
                     what: str = "the condition") -> None:
    """Wait until ``condition()`` (a bool, or an awaitable of one) holds, checking every 10 ms; fail when it
    still does not after ``timeout`` seconds. For a test that waits for something to happen, rather than for
    a fixed time that a slow machine may overrun."""
    deadline = time.monotonic() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout:g} s"
        await asyncio.sleep(0.01)


def answers(port: int) -> bool:
    """Whether something accepts connections on the loopback ``port``: how a test knows a server it started
    serves (a log line such as uvicorn's "Application startup complete" comes before the port is bound)."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def read_all(reader: Any, *, ack: bool = True, timeout: float = 0.3, n: int = 100,
                   want: int | None = None) -> list[Any]:
    """Every message a ``bucketq.StreamReader`` gets until none comes for ``timeout`` seconds, acked. Given
    ``want``, a test that knows how many must come (as ``consume_all``): they may take up to PATIENCE_S
    (``timeout`` unused), their acks are written, as the silence gave them time to be, and then no other may come
    within a short silence."""
    out: list[Any] = []
    wait = timeout if want is None else PATIENCE_S
    while (want is None or len(out) < want) and (batch := await reader.read_many(n, timeout=wait)):
        for message in batch:
            if ack:
                await message.ack()
        out.extend(batch)
    if want is not None and len(out) >= want:
        if ack:
            await reader.flush()
        extra = await reader.read(timeout=0.1)
        assert extra is None, f"a message past the {want} wanted: {extra.payload!r}"
    return out


async def read_together(readers: list[Any], want: int, *, n: int = 100) -> list[Any]:
    """The messages that ``readers`` of one group read side by side (``read_many(n)`` each), acked, until ``want``
    came (within PATIENCE_S), their acks then written. A reader whose read brings nothing tries again while some are
    missing: in a process starved of CPU every reader's read may time out at once."""
    got: list[Any] = []

    async def read(reader: Any) -> None:
        while len(got) < want:
            for message in await reader.read_many(n, timeout=0.3):
                await message.ack()
                got.append(message)
            await asyncio.sleep(0)  # the others read too

    await asyncio.wait_for(asyncio.gather(*(read(r) for r in readers)), PATIENCE_S)
    await asyncio.gather(*(r.flush() for r in readers))
    return got


def race_processes(module: str, args: list[str], barrier: Any, *, processes: int = 3) -> list[str]:
    """Run ``python -m module *args`` in ``processes`` processes at once and return what each printed after its
    first line: each prints "ready" once set up, then waits for the document ``{_id: "go"}`` that this inserts
    into the collection ``barrier``, so that their work starts together. Fails unless each exits with 0."""
    procs = [subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        barrier.insert_one({"_id": "go"})
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(proc.returncode == 0 for proc in procs)
    return outputs


async def next_message(q: Any) -> Any:
    """The next message of queue ``q``, which the test knows must come: fails unless one comes within PATIENCE_S."""
    message = await q.reserve(timeout=PATIENCE_S)
    assert message is not None, f"no message came within {PATIENCE_S} s"
    return message


async def _drain(q: Any, timeout: float, want: int | None) -> AsyncIterator[Any]:
    """The messages a drain takes from ``q``: until none comes for ``timeout`` seconds; or, given ``want``, that
    many (``next_message`` each), then, once the caller has handled the last, none other within 0.1 s."""
    if want is None:
        while (message := await q.reserve(timeout=timeout)) is not None:
            yield message
        return
    for _ in range(want):
        yield await next_message(q)
    extra = await q.reserve(timeout=0.1)
    assert extra is None, f"a message past the {want} wanted: {extra.payload!r}"


async def drained(q: Any, timeout: float = 0.3, *, want: int | None = None) -> list[Any]:
    """Every message of queue ``q`` until none comes for ``timeout`` seconds, each acked (and the ack written) once;
    fails on a message delivered twice. Given ``want``, a test that knows how many must come (as ``consume_all``):
    they may take up to PATIENCE_S each (``timeout`` unused), and then no other may come within a short silence."""
    seen: list[Any] = []
    async for m in _drain(q, timeout, want):
        assert m.id not in {s.id for s in seen}, f"{m.id} delivered twice"
        seen.append(m)
        await m.ack(wait=True)
    return seen


async def consume_all(q: bucketq.Queue, *, timeout: float = 1.0, want: int | None = None) -> list[bucketq.Message]:
    """Every message ``q`` delivers until none comes for ``timeout`` seconds, each acked. Given ``want``, a test
    that knows how many must come: they may take up to PATIENCE_S each, each ack is written before the next reserve
    (the silence gave the last ones time to be), and then no other may come within a short silence."""
    got = []
    async for message in _drain(q, timeout, want):
        got.append(message)
        await message.ack(wait=want is not None)
    return got


async def served(q: Any, timeout: float = 0.5, *, want: int | None = None) -> list[Any]:
    """The payloads of ``drained(q, timeout, want=want)``'s messages, in the order they were served."""
    return [message.payload for message in await drained(q, timeout, want=want)]


async def no_background_housekeeping(owner: bucketq.Queue | bucketq.Stream) -> None:
    """Stop the background housekeeping round of ``owner``, so that the test's own ``purge_expired()`` or
    ``apply_retention()`` is the only one to delete: a round, slowed by a loaded machine, could delete what the test
    counts. A ``Queue``'s round starts at its first claim (call this after it); a ``Stream``'s at its first write,
    made ready here."""
    if isinstance(owner, bucketq.Stream):
        await owner.ready()
    assert owner._life.housekeeping is not None, "no housekeeping started yet"
    await stop(owner._life.housekeeping)


def lossy_queue(backend: str, make_queue: Callable[..., Any], request: Any, name: str = "events",
                **options: Any) -> tuple[Any, Callable[[str, str], Any]]:
    """A queue and ``lose_reply(command, collection)``, which makes its next ``command`` ("insert", "update",
    "findAndModify") on ``collection`` get applied but its reply lost: the in-memory database's fault, or the TCP
    proxy's on the test server. It returns the fault, which counts its ``hits``."""
    if backend == "memory":
        faults = request.getfixturevalue("memory_db").faults
        memory_command = {"insert": "insert_many", "update": "update_one", "findAndModify": "find_one_and_update"}
        return make_queue(name, **options), lambda command, collection: faults.lose_reply(
            memory_command[command], collection=collection)
    proxy = server_proxy(request, make_queue)
    return make_queue(name, target=proxy.uri, **options), lambda command, collection: proxy.lose_reply(
        command, collection=collection)


def server_proxy(request: Any, make_queue: Callable[..., Any]) -> TcpProxy:
    """A started proxy in front of the test server, stopped once ``make_queue``'s queues closed through it."""
    proxy = TcpProxy.to(request.getfixturevalue("mongo_uri")).start()
    make_queue.after_close(proxy.stop)
    return proxy


class StartedCommands(monitoring.CommandListener):
    """Every command a client starts, in order (``event_listeners=[...]``): each test picks what it counts."""

    def __init__(self) -> None:
        self.events: list[monitoring.CommandStartedEvent] = []

    def named(self, name: str) -> list[dict[str, Any]]:
        """The commands started of that name (``insert``, ``findAndModify``...), as sent."""
        return [event.command for event in self.events if event.command_name == name]

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.events.append(event)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None: ...

    def failed(self, event: monitoring.CommandFailedEvent) -> None: ...


class LosableWatch:
    """A change stream's ``watch`` (a queue's ``_watches`` entry) whose streams the test can lose once, as a server
    restart would: after ``lose()`` the next ``try_next`` of one of its streams raises ``AutoReconnect``; before
    and after, the real stream answers."""

    def __init__(self, watch: Callable[[Any], Awaitable[Any]]) -> None:
        self._watch = watch
        self._armed = self.lost = False

    def lose(self) -> None:
        self._armed = True

    async def __call__(self, start: Any) -> _Losable:
        return _Losable(self, await self._watch(start))


class _Losable:
    def __init__(self, watch: LosableWatch, stream: Any) -> None:
        self.watch = watch
        self.stream = stream

    async def try_next(self) -> Any:
        if self.watch._armed and not self.watch.lost:
            self.watch.lost = True
            raise AutoReconnect("connection closed (a server restart)")
        return await self.stream.try_next()

    async def close(self) -> None:
        await self.stream.close()
