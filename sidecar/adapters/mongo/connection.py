"""One app connection: frames messages off the socket, hands them one at a time to the listener, writes the
answers back; and when the app goes away mid-request, cancels that request (its attempts stop: the engine
sees the client gone).

A protocol rather than streams so that a closed connection is noticed while a request is out (a stream
reader only learns of it on the next read). Messages the app sends ahead are queued (at most
``_QUEUE_LIMIT``, then reading pauses). A message that cannot be framed (length below 16 or above the
listener's limit) closes the connection with a log line; so does any :class:`wire.ProtocolError` raised
while handling one.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable

from ..connections import Connections
from . import wire
from .commands import CommandError
from .patch import PatchError

log = logging.getLogger("sidecar.mongo")

Handler = Callable[[int, wire.Header, bytes], Awaitable[bytes | None]]
_QUEUE_LIMIT = 16
_BAD_INPUT = (wire.ProtocolError, CommandError, PatchError)


class AppConnection(asyncio.Protocol):
    def __init__(
        self,
        conn_id: int,
        handler: Handler,
        max_size: int,
        listener: str,
        connections: Connections[AppConnection],
    ) -> None:
        self.conn_id = conn_id
        self.handler = handler
        self.max_size = max_size
        self.listener = listener
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.buffer = bytearray()
        self.queue: collections.deque[tuple[wire.Header, bytes]] = collections.deque()
        self.wakeup: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.busy = False
        self.closed = False
        self.closing = False  # close once the answer in progress is out (a drain)
        self.paused = False

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"mongo-app {self.peer}")

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        while len(buf) >= wire.HEADER_SIZE:
            try:
                header = wire.parse_header(buf, self.max_size)
            except wire.ProtocolError as e:
                self.refuse(e)
                return
            if len(buf) < header.length:
                break
            payload = bytes(buf[wire.HEADER_SIZE : header.length])
            del buf[: header.length]
            self.queue.append((header, payload))
        if len(self.queue) >= _QUEUE_LIMIT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        if self.buffer:
            log.warning(
                "mongodb listener %s: the connection from %s closed in the middle of a message",
                self.listener,
                self.peer,
            )
        return False  # close: drivers never half-close and wait for an answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        if self.busy and self.task is not None:
            self.task.cancel()  # the app is gone: stop the request's attempts
        self._wake()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    # -- the requests, in order ------------------------------------------------------------------------
    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self.queue:
                    if self.closed:
                        return
                    self.wakeup = loop.create_future()
                    await self.wakeup
                    self.wakeup = None
                header, payload = self.queue.popleft()
                if self.paused and len(self.queue) < _QUEUE_LIMIT // 2 and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                self.busy = True
                try:
                    out = await self.handler(self.conn_id, header, payload)
                finally:
                    self.busy = False
                if out and not self.closed and self.transport is not None:
                    self.transport.write(out)
                    if self.writable is not None:
                        await self.writable
                if self.closing:
                    self.close()
                self.connections.idle(self)
        except _BAD_INPUT as e:
            self.refuse(e)
        except asyncio.CancelledError:
            if not self.closed:
                raise
        except Exception:  # a bug of ours: this connection ends, the listener goes on
            log.exception(
                "mongodb listener %s: internal error on the connection from %s", self.listener, self.peer
            )
            self.close()

    def refuse(self, reason: Exception) -> None:
        log.warning(
            "mongodb listener %s: closing the connection from %s: %s", self.listener, self.peer, reason
        )
        self.queue.clear()
        self.buffer.clear()
        self.close()

    def close_after_answer(self) -> None:
        self.closing = True

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()
