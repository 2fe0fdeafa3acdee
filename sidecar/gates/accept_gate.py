"""The connection gate at accept (the seed's SessionEstablishmentRateLimiter), for listeners that accept in
their own asyncio server (HTTP, MongoDB).

A listener whose door limits connections wraps its protocol factory (:meth:`AcceptGate.factory`). Each
accepted connection first meets a :class:`_Held` protocol, which asks the door (``Door.connection``):

- admitted (or from ``bypass_cidrs``): the listener's own protocol takes the transport at once
  (``transport.set_protocol``), so an admitted connection costs nothing more afterwards;
- over the rate with room in the queue: reading is paused, nothing is read or answered, until the borrowed
  token is due; then as admitted. A client that disconnects meanwhile gives its token back (interrupted)
  when the sidecar notices before its turn; with reading paused it mostly does not (a peer's close is seen
  by reading), and the connection is admitted on its turn and closes at once;
- over the rate with the queue full: closed at once (``abort``): the client sees a close or a reset before
  any reply, as with the seed's server.

The listener's stop closes the connections still held (:meth:`AcceptGate.close`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .door import Door, Wait

log = logging.getLogger("sidecar.admission")

ProtocolFactory = Callable[[], Any]


class AcceptGate:
    """One listener's connection gate. ``door`` is read at each accept (a reload may change it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, door: Callable[[], Door | None]) -> None:
        self.loop = loop
        self._door = door
        self.held: set[_Held] = set()

    def factory(self, inner: ProtocolFactory) -> ProtocolFactory:
        """The protocol factory to give ``create_server``: ``inner``'s protocol, behind the gate when the
        listener's door limits connections (checked per accept)."""

        def make() -> Any:
            door = self._door()
            if door is None or door.connections is None:
                return inner()
            return _Held(self, door, inner)

        return make

    def close(self) -> None:
        """The listener stops: connections still waiting are closed."""
        for h in list(self.held):
            h.drop()


class _Held(asyncio.Protocol):
    """A connection between accept and admission."""

    def __init__(self, gate: AcceptGate, door: Door, inner: ProtocolFactory) -> None:
        self.gate = gate
        self.door = door
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.wait: Wait | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.early = bytearray()  # anything read before the pause took effect, handed on with the transport

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport: Any = base  # uvloop's transports are not asyncio.Transport
        self.transport = transport
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        loop = self.gate.loop
        entry = self.door.connection(host, loop.time())
        if entry is None:
            self._hand_over()
        elif isinstance(entry, Wait):
            self.wait = entry
            transport.pause_reading()
            self.gate.held.add(self)
            self.timer = loop.call_at(entry.at, self._due)
        else:
            log.debug("%s: connection from %s refused: %s", self.door.owner, host, entry.message)
            transport.abort()

    def data_received(self, data: bytes) -> None:
        self.early += data

    def eof_received(self) -> bool:
        return False  # the client gave up while held: close (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.wait is not None:  # the client went away while held: its token goes back
            self.door.interrupted(self.wait)
            self.wait = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.gate.held.discard(self)

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()  # -> connection_lost: interrupted

    def _due(self) -> None:
        self.timer = None
        wait, self.wait = self.wait, None
        self.gate.held.discard(self)
        if wait is None:
            return
        if self.transport is None or self.transport.is_closing():
            self.door.interrupted(wait)
            return
        self.door.admitted(wait, self.gate.loop.time())
        self._hand_over()
        self.transport.resume_reading()

    def _hand_over(self) -> None:
        transport = self.transport
        assert transport is not None
        protocol = self.inner()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self.early and not transport.is_closing():
            data, self.early = bytes(self.early), bytearray()
            protocol.data_received(data)
