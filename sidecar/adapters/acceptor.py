"""Accepting connections for the listeners that are our own asyncio servers (HTTP, MongoDB), at most
``max_connections`` at a time.

asyncio's (and uvloop's) ``Server`` accepts whenever the listening socket is readable and cannot be paused.
This one accepts in a loop that stops while the listener holds ``max_connections``: new connections then
wait in the kernel's accept queue (``backlog``), and once that is full the kernel stops completing
handshakes (Linux drops the SYN and the client retries; with ``net.ipv4.tcp_abort_on_overflow=1`` it
answers RST). A connection that closes lets the next one in (``room()``, called by the listener). It looks
like an ``asyncio.Server`` to the listener: ``sockets``, ``is_serving()``, ``close()``, ``wait_closed()``.

With an ``ssl`` context (a MongoDB listener's ``tls``) each accepted connection's TLS handshake runs in a
task of its own, bounded by ``ssl_handshake_timeout``, so that a slow or silent client never holds up the
next accept; connections still in their handshake count towards ``max_connections``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl as _ssl
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sidecar")

#: After the process ran out of file descriptors, try accepting again this much later.
_EMFILE_PAUSE = 0.1


class Acceptor:
    def __init__(
        self,
        name: str,
        factory: Callable[[], Any],
        sockets: list[socket.socket],
        max_connections: int,
        count: Callable[[], int],
        ssl: _ssl.SSLContext | None = None,
        ssl_handshake_timeout: float = 10.0,
    ) -> None:
        self.name = name
        self.ssl = ssl
        self.ssl_handshake_timeout = ssl_handshake_timeout
        self._handshakes: set[asyncio.Task[None]] = set()
        self.max_connections = max_connections  # a reload may change it
        self.sockets = sockets
        self._factory = factory
        self._count = count
        self._room: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._full_logged = False

    @classmethod
    async def start(
        cls,
        name: str,
        factory: Callable[[], Any],
        host: str,
        port: int,
        *,
        max_connections: int,
        count: Callable[[], int],
        backlog: int = 1024,
        ssl: _ssl.SSLContext | None = None,
    ) -> Acceptor:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        socks: list[socket.socket] = []
        try:
            for family, kind, proto, _, addr in dict.fromkeys(infos):  # getaddrinfo repeats some
                sock = socket.socket(family, kind, proto)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(addr)
                except OSError as e:
                    raise OSError(
                        e.errno, f"error while attempting to bind on address {addr!r}: {e.strerror}"
                    ) from None
                sock.listen(backlog)
                sock.setblocking(False)
        except BaseException:
            for s in socks:
                s.close()
            raise
        self = cls(name, factory, socks, max_connections, count, ssl)
        self._tasks = [loop.create_task(self._accept(s), name=f"accept {name}") for s in socks]
        return self

    def is_serving(self) -> bool:
        return bool(self._tasks) and not any(t.done() for t in self._tasks)

    def room(self) -> None:
        """A connection closed: accept again if the listener was full."""
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in list(self._handshakes):
            t.cancel()
        for s in self.sockets:
            s.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self._count() + len(self._handshakes) >= self.max_connections:
                if not self._full_logged:
                    self._full_logged = True
                    log.warning(
                        "listener %s holds max_connections (%d): new connections wait in the backlog",
                        self.name,
                        self.max_connections,
                    )
                self._room = loop.create_future()
                await self._room
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.error("listener %s cannot accept: %s", self.name, e)
                    await asyncio.sleep(_EMFILE_PAUSE)
                continue  # ECONNABORTED and the like: that client is gone
            conn.setblocking(False)
            if self.ssl is not None:
                task = loop.create_task(self._handshake(conn), name=f"tls handshake {self.name}")
                self._handshakes.add(task)
                task.add_done_callback(self._handshake_over)
                continue
            try:
                await loop.connect_accepted_socket(self._factory, conn)
            except OSError as e:  # that client is gone already
                log.debug("listener %s: an accepted connection failed at once: %s", self.name, e)
                with contextlib.suppress(OSError):
                    conn.close()
            except Exception:  # a bug of ours: that one connection ends, the listener goes on
                log.exception("listener %s: internal error setting up an accepted connection", self.name)
                with contextlib.suppress(OSError):
                    conn.close()
            if self._count() < self.max_connections * 0.9:
                self._full_logged = False  # the next time it fills up is worth a line again

    async def _handshake(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                self._factory, conn, ssl=self.ssl, ssl_handshake_timeout=self.ssl_handshake_timeout
            )
        except (OSError, TimeoutError, _ssl.SSLError, ConnectionError) as e:
            log.info("listener %s: a client's TLS handshake failed: %s", self.name, e or type(e).__name__)
            with contextlib.suppress(OSError):
                conn.close()
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                conn.close()
            raise
        except Exception:  # a bug of ours: that one connection ends, the listener goes on
            log.exception("listener %s: internal error setting up an accepted connection", self.name)
            with contextlib.suppress(OSError):
                conn.close()

    def _handshake_over(self, task: asyncio.Task[None]) -> None:
        self._handshakes.discard(task)
        self.room()
