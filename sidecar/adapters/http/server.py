"""The HTTP listener: accepts client connections (``connection.py``), hands their requests to the forwarder
(``request.py``), drains on stop, and sweeps idle connections (clients and pooled upstream ones)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from ...config.schema import HttpListenerConfig
from ...config.units import split_host_port
from ...gates.accept_gate import AcceptGate
from ...gates.door import Door
from ...services import Services
from ..acceptor import Acceptor
from ..connections import Connections
from .connection import ConnectionOwner, ServerConnection
from .plan import DEFAULT_REPLAY_BUFFER
from .request import Forwarder

log: Final = logging.getLogger("sidecar.http")

#: Pooled upstream connections idle this long are closed (below common server keep-alive timeouts).
POOL_IDLE_TIMEOUT: Final = 30.0
SWEEP_EVERY: Final = 1.0


class HttpListener(ConnectionOwner):
    def __init__(self, config: HttpListenerConfig, services: Services) -> None:
        self.name = config.name
        self.config = config
        self.services = services
        self.host, self.port = split_host_port(config.listen)
        self._address: tuple[str, int] = (self.host, self.port)
        self.connections: Connections[ServerConnection] = Connections(config.name, log)
        self.stopping = False
        self.server: Acceptor | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self.forwarder = Forwarder(config, services)
        self.replay_limit = _replay_limit(config, services)
        self.buffers = services.buffers
        self.max_header_size = config.max_header_size
        self._rejected = services.telemetry.metrics.listener(config.name)
        self.gate: AcceptGate | None = None  # set by start(): the connection gate (admission.connections)

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def serving(self) -> bool:
        return self.server is not None and not self.stopping and bool(self.server.is_serving())

    def reconfigure(self, config: HttpListenerConfig, services: Services) -> None:
        """A reloaded config (same address): requests from now on are routed and retried under it; those in
        progress finish with the forwarder they began with. Pools of unchanged upstreams carry over; those of
        changed ones close (their idle connections now, the busy ones once their response is done)."""
        old = self.forwarder
        self.config = config
        self.services = services
        forwarder = Forwarder(config, services)
        if self.loop is not None:
            forwarder.bind(self.loop, self._address)
        for upstream, pools in old.pools.items():
            runtime = old.services.upstreams.get(upstream)
            if services.upstreams.get(upstream) is runtime:
                forwarder.pools[upstream] = pools
            else:
                if runtime is not None:
                    runtime.endpoints.unwatch(pools)
                pools.close()
        self.forwarder = forwarder
        self.replay_limit = _replay_limit(config, services)
        self.max_header_size = config.max_header_size
        if self.server is not None:
            self.server.max_connections = config.max_connections

    async def start(self) -> None:
        loop = self.loop = asyncio.get_running_loop()

        def connection() -> Any:  # an asyncio protocol by its methods, not by inheritance
            return ServerConnection(self, loop)

        gate = self.gate = AcceptGate(loop, self._door)
        server: Any = await Acceptor.start(
            self.name,
            gate.factory(connection),
            self.host,
            self.port,
            max_connections=self.config.max_connections,
            count=self.connections.__len__,
        )
        self.server = server
        self._address = tuple(server.sockets[0].getsockname()[:2])
        self.forwarder.bind(loop, self._address)
        self._sweeper = loop.call_later(_sweep_every(self.config), self._sweep)

    async def stop(self, grace: float) -> None:
        """Stop accepting; answer what is in progress (for up to ``grace`` seconds); close everything."""
        self.stopping = True
        if self.server is not None:
            self.server.close()
        if self.gate is not None:
            self.gate.close()
        await self.connections.drain(grace)
        for upstream, pools in self.forwarder.pools.items():
            runtime = self.services.upstreams.get(upstream)
            if runtime is not None:
                runtime.endpoints.unwatch(pools)
            pools.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            await self.server.wait_closed()

    def _door(self) -> Door | None:
        return self.services.door(self.name)

    # -- from connections (connection.ConnectionOwner) ------------------------------------------------
    def connection_opened(self, conn: ServerConnection) -> None:
        self.connections.add(conn)

    def connection_closed(self, conn: ServerConnection) -> None:
        self.connections.discard(conn)
        if self.server is not None:
            self.server.room()

    def connection_idle(self, conn: ServerConnection) -> None:
        self.connections.idle(conn)

    def refused(self, status: int) -> None:
        self._rejected.reject(str(status))

    def _sweep(self) -> None:
        loop = self.loop
        assert loop is not None
        now = loop.time()
        config = self.config
        idle_timeout = config.idle_timeout
        for conn in self.connections:
            conn.sweep(now, config.header_timeout, idle_timeout, config.request_body_timeout)
        for pool in self.forwarder.all_pools():
            pool.sweep(now, min(POOL_IDLE_TIMEOUT, idle_timeout))
        self._sweeper = loop.call_later(_sweep_every(config), self._sweep)


def _sweep_every(config: HttpListenerConfig) -> float:
    """Look often enough that a short header_timeout is kept to within half of itself."""
    return min(SWEEP_EVERY, config.header_timeout / 2)


def _replay_limit(config: HttpListenerConfig, services: Services) -> int:
    """A body is read before its route is known to need it: keep as much as the largest route allows."""
    limits = [
        services.policy(name).config.replay_buffer
        for name in {config.policy, *(r.policy for r in config.routes)}
        if name is not None
    ]
    return max((DEFAULT_REPLAY_BUFFER if v is None else v for v in limits), default=DEFAULT_REPLAY_BUFFER)
