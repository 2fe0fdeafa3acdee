"""The HTTP client connection's and upstream connection's state machines (``State`` in connection.py and
upstream.py): their transitions on a real loop with real sockets, and a transition they do not have raised
at once (a bug, never swallowed)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sidecar.adapters.http import connection, upstream
from sidecar.adapters.http.connection import ConnectionOwner, ServerConnection
from sidecar.adapters.http.request import IncomingRequest
from sidecar.adapters.http.upstream import Exchange, Pool, UpstreamConnection, UpstreamGone, UpstreamResponse
from sidecar.adapters.transitions import InvalidTransition


class Owner(ConnectionOwner):
    def __init__(self) -> None:
        self.replay_limit = 1 << 20
        self.max_header_size = 8192
        self.stopping = False
        self.lost = asyncio.Event()

    def connection_opened(self, conn: ServerConnection) -> None:
        pass

    def connection_closed(self, conn: ServerConnection) -> None:
        self.lost.set()

    def connection_idle(self, conn: ServerConnection) -> None:
        pass

    def refused(self, status: int) -> None:
        pass


async def test_client_connection_states() -> None:
    a, peer = socket.socketpair()
    loop = asyncio.get_running_loop()
    owner = Owner()
    conn = ServerConnection(owner, loop)
    await loop.connect_accepted_socket(lambda: conn, a)  # type: ignore[arg-type, return-value]
    try:
        assert conn.state == connection.State.IDLE and not conn.busy
        with pytest.raises(InvalidTransition, match="answered is not a transition from state 'idle'"):
            conn.request_done(IncomingRequest(0.0))  # nothing was being answered
        conn.close_after_answer()
        assert conn.state == connection.State.CLOSING
        conn.close()
        await asyncio.wait_for(owner.lost.wait(), 30)  # the loop delivers connection_lost
        assert conn.state == connection.State.CLOSED
        conn.request_done(IncomingRequest(0.0))  # after the loss: nothing left to answer, no error
    finally:
        peer.close()


class _Waiting(Exchange):
    def on_response(self, response: UpstreamResponse) -> None:
        pass

    def on_gone(self, error: UpstreamGone) -> None:
        pass


async def test_upstream_connection_states() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool("e", "127.0.0.1", port, 5.0, 4)
    try:
        conn: UpstreamConnection = await pool.connect()
        assert conn.state == upstream.State.IDLE
        conn.start(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", None, False, 1, _Waiting())
        assert conn.state == upstream.State.SENT
        with pytest.raises(InvalidTransition, match="start is not a transition from state .sent."):
            conn.start(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", None, False, 2, _Waiting())  # one at a time
        conn.release()  # no response came: not reusable
        assert conn.state == upstream.State.CLOSED and conn.closed
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
