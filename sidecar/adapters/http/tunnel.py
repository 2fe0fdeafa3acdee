"""A tunnel: a client connection and an upstream connection joined after ``101 Switching Protocols``
(WebSocket), carrying bytes both ways as they come (issue 22).

The handshake before it was a request like any other (retried under the policy, its deadline and per-try
timeout its own); from the 101 on there are no retries and nothing is parsed: each read is written to the
other side at once, and a side whose socket backs up stops the other side's reading (no buffering beyond a
read's worth). The tunnel ends, and closes both connections, when

- either side closes (``client``: the app's side closed its TCP connection first; ``upstream``: the
  upstream's did). A half-close is passed on (the other side's write end is shut), so a closing handshake
  that the protocol carries (WebSocket's close frames) completes before the connections go;
- nothing passed either way for the listener's ``tunnel_idle_timeout`` (``idle``);
- the sidecar stops: open tunnels keep carrying messages during the drain's grace, and end with it
  (``drain``).

``sidecar_http_tunnels{listener}`` counts those open; ``sidecar_http_tunnels_total{listener, upstream, end}``
those ended. The two connections keep their own state machines (``connection.State.TUNNEL``,
``upstream.State.TUNNEL``) and hand their events here; the tunnel calls only their methods.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from ...telemetry.metrics import HttpListenerMeters

log: Final = logging.getLogger("sidecar.http")


class ClientEnd(Protocol):
    """The client connection's side of a tunnel (``connection.ServerConnection`` in state TUNNEL)."""

    def write(self, data: bytes) -> None: ...
    def tunnel_write_eof(self) -> bool: ...
    def pause_for(self, why: str) -> None: ...
    def resume_for(self, why: str) -> None: ...
    def close(self) -> None: ...


class UpstreamEnd(Protocol):
    """The upstream connection's side (``upstream.UpstreamConnection`` in state TUNNEL)."""

    def tunnel_write(self, data: bytes) -> None: ...
    def tunnel_write_eof(self) -> bool: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def tunnel_close(self) -> None: ...


class Tunnel:
    __slots__ = (
        "client",
        "upstream",
        "loop",
        "meters",
        "upstream_name",
        "last_activity",
        "first",
        "shut",
        "over",
    )

    def __init__(
        self,
        client: ClientEnd,
        upstream: UpstreamEnd,
        loop: asyncio.AbstractEventLoop,
        meters: HttpListenerMeters,
        upstream_name: str,
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.loop = loop
        self.meters = meters
        self.upstream_name = upstream_name
        self.last_activity = loop.time()
        self.first: str | None = None  # the side that ended its sending first (client, upstream)
        self.shut = 0  # how many sides ended their sending: both, and the tunnel is over
        self.over = False
        meters.tunnel_opened()

    # -- bytes ---------------------------------------------------------------------------------------
    def from_client(self, data: bytes) -> None:
        self.last_activity = self.loop.time()
        self.upstream.tunnel_write(data)

    def from_upstream(self, data: bytes) -> None:
        self.last_activity = self.loop.time()
        self.client.write(data)

    # -- flow control: a side whose socket backs up holds the other side's reading -------------------
    def client_backed_up(self, paused: bool) -> None:
        if paused:
            self.upstream.pause_reading()
        else:
            self.upstream.resume_reading()

    def upstream_backed_up(self, paused: bool) -> None:
        if paused:
            self.client.pause_for("tunnel")
        else:
            self.client.resume_for("tunnel")

    # -- ends ----------------------------------------------------------------------------------------
    def client_eof(self) -> bool:  # (also when the client shut its side before the 101 came)
        """The client shut its sending side: the upstream's is shut too, its answer still comes back."""
        return self._shut("client", self.upstream.tunnel_write_eof())

    def upstream_eof(self) -> bool:
        return self._shut("upstream", self.client.tunnel_write_eof())

    def _shut(self, side: str, passed_on: bool) -> bool:
        """``side`` sends nothing more; ``passed_on``: the other side was told (its write end shut). Whether
        the transport that got the EOF stays open (for what the other side still sends)."""
        if self.first is None:
            self.first = side
        self.shut += 1
        if not passed_on or self.shut >= 2:
            self.close(self.first)
            return False
        return True

    def client_lost(self) -> None:
        self.close(self.first or "client")

    def upstream_lost(self) -> None:
        self.close(self.first or "upstream")

    def close(self, end: str) -> None:
        """End the tunnel (``end``: client, upstream, idle, drain): both connections close, what each was
        sent still delivered."""
        if self.over:
            return
        self.over = True
        self.meters.tunnel_ended(self.upstream_name, end)
        log.debug("tunnel to %s ended (%s)", self.upstream_name, end)
        self.upstream.tunnel_close()
        self.client.close()
