"""A TCP proxy on loopback for fault tests: forwards to the server, and can cut every connection or hold
traffic back. Runs its own event loop in a thread, so sync and async clients alike can go through it."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, delay_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_s  # pause before each forwarded chunk: a server slower than the producer
        self.port = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

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

    def stop(self) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            await self._cut()

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
        self._writers.update((client_w, server_w))
        await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))
        self._writers.difference_update((client_w, server_w))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ConnectionError):
            while chunk := await reader.read(65536):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(chunk)
                await writer.drain()
        writer.transport.abort()
