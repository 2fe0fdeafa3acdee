"""Keep-alive connections to one upstream endpoint, at most ``max_connections`` at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from .client import ConnectFailed, UpstreamConnection


class Pool:
    """Keep-alive connections to one endpoint, at most ``max_connections`` at a time (then requests wait
    for one to come back)."""

    def __init__(
        self, endpoint: str, host: str, port: int, connect_timeout: float, max_connections: int
    ) -> None:
        self.endpoint = endpoint
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.loop = asyncio.get_running_loop()
        self.idle: list[UpstreamConnection] = []
        self.count = 0
        self.waiters: deque[asyncio.Future[UpstreamConnection | None]] = deque()
        self.closing = False

    def take_idle(self) -> UpstreamConnection | None:
        """An idle kept-alive connection, if there is one (no await on the hot path)."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def acquire(self) -> tuple[UpstreamConnection, bool]:
        """A connection (reused when one is idle) and whether it was reused. Raises :class:`ConnectFailed`."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn, True
        if self.count >= self.max_connections:
            fut = self.loop.create_future()
            self.waiters.append(fut)
            try:
                conn = await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled() and fut.result() is not None:
                    self.release(fut.result())  # handed over just as we were cancelled: pass it on
                elif fut.done() and not fut.cancelled():
                    self._wake()  # a free slot was ours: pass it on
                raise
            if conn is not None:
                return conn, True
        return await self.connect(), False

    async def connect(self) -> UpstreamConnection:
        self.count += 1
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await self.loop.create_connection(  # type: ignore[type-var]  # a protocol by its methods
                    lambda: UpstreamConnection(self), self.host, self.port
                )
        except TimeoutError:
            self._lost_slot()
            raise ConnectFailed(f"connect timeout to {self.endpoint}", timeout=True) from None
        except OSError as e:
            self._lost_slot()
            raise ConnectFailed(f"{self.endpoint}: {e.strerror or e}") from None
        except BaseException:
            self._lost_slot()
            raise
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        if conn.closed:
            return
        if self.closing:
            conn.abort()
            return
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(conn)
                return
        conn.idle_since = self.loop.time()
        self.idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        """``conn`` closed: free its slot."""
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self._lost_slot()

    def _lost_slot(self) -> None:
        self.count -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def sweep(self, now: float, idle_timeout: float) -> None:
        """Close connections idle longer than ``idle_timeout``."""
        for conn in [c for c in self.idle if now - c.idle_since > idle_timeout]:
            conn.abort()

    def close(self) -> None:
        self.closing = True
        for conn in list(self.idle):
            conn.abort()
        self.idle.clear()
