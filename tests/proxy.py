"""A TCP proxy on loopback for fault tests: forwards to the server, and can cut every connection, hold
traffic back, or act on single MongoDB commands. Runs its own event loop in a thread, so sync and async
clients alike can go through it.

Command faults (``lose_reply``, ``lose_request``, ``delay``) need the wire protocol's framing: every
message starts with a 16-byte header ``(length, requestID, responseTo, opCode)``, little-endian int32s.
A command is an OP_MSG (opCode 2013) whose kind-0 section is a BSON document whose first key is the
command's name (``insert``, ``update``, ``delete``, ``findAndModify``...) and its value the collection;
kind-1 sections carry document sequences (``documents`` of an insert, ``updates``, ``deletes``). While no
rule is armed, bytes are forwarded in whatever chunks they arrive, as by a plain proxy; only message
boundaries are tracked, so that a rule armed at any moment acts on whole commands. A proxy made with ``meter``
(a predicate on collection names) inspects every request and counts the bytes and the number of the write
commands sent to those collections (``written``, ``writes``, by command name).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import bson

OP_MSG = 2013
HEADER = struct.Struct("<iiii")  # messageLength, requestID, responseTo, opCode
CHECKSUM_PRESENT = 1
# Where each write command keeps what it addresses: a retry of the same write addresses the same things.
TARGETS = {"insert": ("documents", "_id"), "update": ("updates", "q"), "delete": ("deletes", "q")}


@dataclass(frozen=True)
class Command:
    """An OP_MSG command as the server reads it."""

    name: str
    body: dict[str, Any]  # the kind-0 document, with each kind-1 document sequence added under its identifier
    request_id: int

    @property
    def collection(self) -> str | None:
        value = self.body.get(self.name)
        return value if isinstance(value, str) else None

    @property
    def fingerprint(self) -> bytes:
        """Equal for a command and its retry: the name, the collection, and what it writes to (the ``_id``s of
        an insert's documents, the filters of an update or delete, the query of a findAndModify)."""
        if self.name in TARGETS:
            items, key = TARGETS[self.name]
            targets = [d.get(key) for d in self.body.get(items, []) if isinstance(d, dict)]
        else:
            targets = [self.body.get("query")]
        return bson.encode({"n": self.name, "c": self.collection, "t": targets})


def command_name(message: bytes) -> str | None:
    """The command name of an OP_MSG request, read from its body section without decoding the body; None
    for other messages."""
    _, _, _, opcode = HEADER.unpack_from(message)
    if opcode != OP_MSG:
        return None
    for kind, start, _ in _sections(message):
        if kind == 0:
            end = message.index(b"\x00", start + 5)  # type byte at start+4, then the key as a C string
            return message[start + 5:end].decode("utf-8", "replace")
    return None


def command_target(message: bytes) -> tuple[str, str | None] | None:
    """The command name of an OP_MSG request and the collection it addresses (the first key's value, when a
    string), read without decoding the body; None for other messages."""
    _, _, _, opcode = HEADER.unpack_from(message)
    if opcode != OP_MSG:
        return None
    for kind, start, _ in _sections(message):
        if kind == 0:
            end = message.index(b"\x00", start + 5)
            name = message[start + 5:end].decode("utf-8", "replace")
            if message[start + 4] != 0x02:  # the value is not a string
                return name, None
            (size,) = struct.unpack_from("<i", message, end + 1)
            return name, message[end + 5:end + 4 + size].decode("utf-8", "replace")
    return None


def parse_command(message: bytes) -> Command:
    """Decode a whole OP_MSG command (``command_name`` must have found one)."""
    _, request_id, _, _ = HEADER.unpack_from(message)
    body: dict[str, Any] = {}
    sequences: dict[str, list[dict[str, Any]]] = {}
    for kind, start, end in _sections(message):
        if kind == 0:
            body = bson.decode(message[start:end])
        else:
            name_end = message.index(b"\x00", start)
            sequences[message[start:name_end].decode()] = bson.decode_all(message[name_end + 1:end])
    name = next(iter(body))
    return Command(name, {**body, **sequences}, request_id)


def _sections(message: bytes) -> list[tuple[int, int, int]]:
    """``(kind, start, end)`` of each section of an OP_MSG; kind 1 spans its identifier and documents."""
    length = len(message)
    (flags,) = struct.unpack_from("<I", message, 16)
    end_all = length - 4 if flags & CHECKSUM_PRESENT else length
    pos = 20
    out = []
    while pos < end_all:
        kind = message[pos]
        (size,) = struct.unpack_from("<i", message, pos + 1)  # kind 0: the BSON size; kind 1: the section's
        out.append((kind, pos + 1 if kind == 0 else pos + 5, pos + 1 + size))
        pos += 1 + size
    return out


class Framer:
    """Splits a byte stream of wire messages at their boundaries, chunk by chunk (sans I/O).

    ``feed(data, inspect)`` returns ``(whole, bytes)`` pieces in stream order. With ``inspect`` false the
    data comes back as it is (one raw piece) and only the boundaries are tracked. With ``inspect`` true,
    every message that starts in this data comes back whole (``True``), and the beginning of one not yet
    complete is held back until it is; the end of a message already partly passed on stays raw."""

    def __init__(self) -> None:
        self._rest = 0  # bytes still to come of a message already partly passed on raw
        self._head = b""  # the part of such a message's length field seen so far
        self._held = b""  # an incomplete message held back for inspection, from its first byte

    def feed(self, data: bytes, inspect: bool) -> list[tuple[bool, bytes]]:
        if self._held:
            data, self._held = self._held + data, b""
        out: list[tuple[bool, bytes]] = []
        raw_from = pos = 0
        n = len(data)
        while pos < n:
            if self._rest:
                step = min(self._rest, n - pos)
                self._rest -= step
                pos += step
            elif self._head or not inspect:
                take = data[pos:pos + 4 - len(self._head)]
                self._head += take
                pos += len(take)
                if len(self._head) == 4:
                    self._rest = max(4, int.from_bytes(self._head, "little")) - 4
                    self._head = b""
            else:
                # (a length below the header's size is not MongoDB: taken as a header alone, to move on)
                length = max(HEADER.size, int.from_bytes(data[pos:pos + 4], "little") if n - pos >= 4 else 0)
                if n - pos < length:
                    self._held = data[pos:]
                    break
                if pos > raw_from:
                    out.append((False, data[raw_from:pos]))
                out.append((True, data[pos:pos + length]))
                pos += length
                raw_from = pos
        if pos > raw_from:
            out.append((False, data[raw_from:pos]))
        return out


@dataclass(eq=False)
class Rule:
    """What to do to the next ``times`` commands named in ``commands`` (on ``collection``, if given, and for
    which ``where`` holds, if given). ``hits`` counts the commands it acted on; ``retries_delayed`` counts
    the retries held back after a lost reply or request."""

    action: str  # lose_reply | lose_request | delay
    commands: frozenset[str]
    times: int
    collection: str | None = None
    where: Callable[[Command], bool] | None = None
    delay_s: float = 0.0  # delay: how long to hold the command; lose_*: how long to hold its retry back
    fingerprint: bytes | None = None  # only the command with this fingerprint (the retry of a lost one)
    parent: Rule | None = None
    hits: int = 0
    retries_delayed: int = 0

    def matches(self, command: Command) -> bool:
        return (self.times > 0 and command.name in self.commands
                and (self.collection is None or command.collection == self.collection)
                and (self.fingerprint is None or command.fingerprint == self.fingerprint)
                and (self.where is None or bool(self.where(command))))


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    lost_replies: set[int] = field(default_factory=set)  # requestIDs whose reply must not reach the client

    def abort(self) -> None:
        self.client.transport.abort()
        self.server.transport.abort()


WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify"})


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, delay_s: float = 0.0,
                 meter: Callable[[str], bool] | None = None) -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_s  # pause before each forwarded chunk: a server slower than the producer
        self.meter = meter
        self.written: Counter[str] = Counter()  # bytes of write commands to metered collections, by command
        self.writes: Counter[str] = Counter()  # their number
        self.port = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._rules: list[Rule] = []  # touched only on the proxy's loop
        self._stopping = asyncio.Event()

    @classmethod
    def to(cls, uri: str, **options: Any) -> TcpProxy:
        """A proxy (not started) in front of the first server that ``uri`` (``mongodb://host:port[,...]/...``) lists."""
        host, port = uri.split("//")[1].split("/")[0].split(",")[0].split(":")
        return cls(host, int(port), **options)

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def start(self) -> TcpProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """Close every open connection, in both directions, at once (in-flight requests get no reply)."""
        self._call(self._cut())

    def lose_reply(self, *commands: str, times: int = 1, collection: str | None = None,
                   where: Callable[[Command], bool] | None = None, retry_delay_s: float = 0.0) -> Rule:
        """The next ``times`` matching commands reach the server and are applied, but their replies are
        dropped and their client connections aborted: the client sees a network error (an ambiguous
        outcome). With ``retry_delay_s``, the command's retry (the same command on the same targets, see
        ``Command.fingerprint``) is held back that long before it goes on."""
        return self._arm(Rule("lose_reply", frozenset(commands), times, collection, where, retry_delay_s))

    def lose_request(self, *commands: str, times: int = 1, collection: str | None = None,
                     where: Callable[[Command], bool] | None = None, retry_delay_s: float = 0.0) -> Rule:
        """Like ``lose_reply``, but the commands never reach the server: their connections are aborted
        before they are forwarded."""
        return self._arm(Rule("lose_request", frozenset(commands), times, collection, where, retry_delay_s))

    def delay(self, *commands: str, seconds: float, times: int = 1, collection: str | None = None,
              where: Callable[[Command], bool] | None = None) -> Rule:
        """Hold the next ``times`` matching commands back ``seconds`` before forwarding them (other
        connections go on meanwhile). A client that gives up on one meanwhile does not stop it: it still
        reaches the server, late."""
        return self._arm(Rule("delay", frozenset(commands), times, collection, where, seconds))

    def disarm(self) -> None:
        """Forget every rule not yet used up (commands already held back still go on when their time comes)."""
        self._call(self._set_rules([]))

    def stop(self) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            self._stopping.set()  # commands held back are dropped
            await self._cut()
            pipes = asyncio.all_tasks() - {asyncio.current_task()}
            if pipes:
                await asyncio.wait(pipes, timeout=5)

        self._call(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _arm(self, rule: Rule) -> Rule:
        if rule.times < 1 or not rule.commands:
            raise ValueError("a rule needs at least one command name and times >= 1")

        async def add() -> None:
            self._rules.append(rule)

        self._call(add())
        return rule

    async def _set_rules(self, rules: list[Rule]) -> None:
        self._rules = rules

    async def _cut(self) -> None:
        self.cuts += 1
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        conn = _Connection(client_w, server_w)
        self._writers.update((client_w, server_w))
        await asyncio.gather(
            self._pipe(client_r, server_w, lambda: bool(self._rules) or self.meter is not None,
                       partial(self._on_request, conn)),
            self._pipe(server_r, client_w, lambda: bool(conn.lost_replies), partial(self._on_reply, conn)))
        self._writers.difference_update((client_w, server_w))

    def _rule_for(self, message: bytes) -> tuple[Rule, Command] | None:
        name = command_name(message)
        if name is None or not any(name in r.commands for r in self._rules):
            return None
        command = parse_command(message)
        for rule in self._rules:
            if rule.matches(command):
                rule.times -= 1
                rule.hits += 1
                if rule.parent is not None:
                    rule.parent.retries_delayed += 1
                if not rule.times:
                    self._rules.remove(rule)
                if rule.action != "delay" and rule.delay_s:
                    self._rules.append(Rule("delay", frozenset([command.name]), 1, command.collection,
                                            delay_s=rule.delay_s, fingerprint=command.fingerprint, parent=rule))
                return rule, command
        return None

    def _count(self, message: bytes) -> None:
        assert self.meter is not None
        target = command_target(message)
        if target is not None and target[0] in WRITE_COMMANDS and target[1] is not None and self.meter(target[1]):
            self.written[target[0]] += len(message)
            self.writes[target[0]] += 1

    async def _on_request(self, conn: _Connection, message: bytes) -> bool:
        if self.meter is not None:
            self._count(message)
        found = self._rule_for(message)
        if found is None:
            return True
        rule, command = found
        if rule.action == "lose_request":
            conn.abort()
            return False
        if rule.action == "lose_reply":
            conn.lost_replies.add(command.request_id)
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), rule.delay_s)
        return not self._stopping.is_set()

    async def _on_reply(self, conn: _Connection, message: bytes) -> bool:
        if HEADER.unpack_from(message)[2] in conn.lost_replies:
            conn.abort()  # the server applied the command; the client never hears so
            return False
        return True

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, inspect: Callable[[], bool],
                    on_message: Callable[[bytes], Awaitable[bool]]) -> None:
        """Forward ``reader`` to ``writer``. While ``inspect()`` holds, each whole message goes through
        ``on_message`` first, which returns False when it ended the connection instead."""
        framer = Framer()
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ConnectionError):
            while chunk := await reader.read(65536):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                for whole, data in framer.feed(chunk, inspect()):
                    if whole and not await on_message(data):
                        return
                    writer.write(data)
                await writer.drain()
        writer.transport.abort()
