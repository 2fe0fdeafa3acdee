"""The MongoDB listener: the app's driver connects here as to a mongos.

The sidecar answers ``hello``/``isMaster`` itself (OP_MSG, and the legacy OP_QUERY handshake with an
OP_REPLY), refuses authentication from the app (it authenticates upstream), answers ``endSessions`` and
passes it on, and forwards every other command through ``request.py``. A message that cannot be read
(bad framing, bad BSON, over ``max_message_size``, compressed, an unknown opcode) closes that connection only,
with a log line naming what was wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import itertools
import logging

from bson.errors import BSONError
from bson.raw_bson import RawBSONDocument

from ...admit import Way
from ...config.schema import MongoListenerConfig
from ...config.units import split_host_port
from ...gates.accept_gate import AcceptGate
from ...services import Services
from ..acceptor import Acceptor
from ..connections import Connections
from . import answer, wire
from .commands import AUTH, HELLO, RAW, describe
from .connection import AppConnection, Limits
from .pinning import Pins
from .request import Shared, forward
from .topology import Topology
from .upstream import Pools, Settings

log = logging.getLogger("sidecar.mongo")

#: How long a command waits for a server that fits it (a primary during an election), at most.
SERVER_SELECTION_TIMEOUT = 10.0
#: Pooled upstream connections idle this long are closed (a burst's extra connections do not stay forever).
POOL_IDLE_TIMEOUT = 30.0
SWEEP_EVERY = 1.0
_AUTH_REFUSED = (
    "retry-sidecar does not authenticate applications: it authenticates to the upstream itself "
    "(upstreams.<name>.auth). Connect to the sidecar without credentials."
)


class MongoListener:
    def __init__(self, config: MongoListenerConfig, services: Services) -> None:
        self.name = config.name
        self.config = config
        runtime = services.upstream(config.upstream)
        ucfg = runtime.config
        settings = Settings.from_config(ucfg)
        self.settings = settings
        topology = Topology(config.upstream, ucfg.endpoints, settings, ucfg.replica_set)
        assert config.policy is not None  # the loader fills in the protocol's preset
        policy = services.policy(config.policy)
        self.up = Shared(
            name=config.upstream,
            runtime=runtime,
            topology=topology,
            pools=Pools(settings),
            pins=Pins(),
            policy=policy,
            services=services,
            listener=config.name,
            server_selection_timeout=SERVER_SELECTION_TIMEOUT,
            way=Way(services, config.name, "mongodb", policy, runtime),
        )
        self._server: Acceptor | None = None
        self._limits = _limits(config)
        self._connections: Connections[AppConnection] = Connections(config.name, log)
        self._conn_ids = itertools.count(1)
        self._background: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._gate: AcceptGate | None = None  # the connection gate (admission.connections), set by start()

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            host, port = split_host_port(self.config.listen)
            return host, port
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.is_serving()

    def reconfigure(self, config: MongoListenerConfig, services: Services) -> None:
        """A reloaded config whose upstream did not change (``reload.restart_reasons`` refuses that): the
        policy may have; commands from now on use it, those in progress finish under the old one. New
        timeouts apply to connections accepted from now on."""
        assert config.policy is not None
        self.config = config
        self._limits = _limits(config)
        if self._server is not None:
            self._server.max_connections = config.max_connections
        runtime, policy = services.upstream(config.upstream), services.policy(config.policy)
        self.up = dataclasses.replace(
            self.up,
            runtime=runtime,
            policy=policy,
            services=services,
            way=Way(services, config.name, "mongodb", policy, runtime),
        )

    async def start(self) -> None:
        await self.up.topology.start(wait=self.settings.connect_timeout)
        host, port = split_host_port(self.config.listen)
        if not _loopback(host):
            log.warning(
                "mongodb listener %s listens on %s: apps connect to it without authentication, and it uses "
                "the upstream's credentials for them; keep it on loopback (127.0.0.1)",
                self.name,
                self.config.listen,
            )
        gate = self._gate = AcceptGate(asyncio.get_running_loop(), lambda: self.up.services.door(self.name))
        self._server = await Acceptor.start(
            self.name,
            gate.factory(
                lambda: AppConnection(
                    next(self._conn_ids),
                    self._message,
                    self._limits,
                    self.name,
                    self._connections,
                    self.up.services.buffers,
                    self._room,
                )
            ),
            host,
            port,
            max_connections=self.config.max_connections,
            count=self._connections.__len__,
        )
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_EVERY, self._sweep)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        self.up.pools.sweep(loop.time(), POOL_IDLE_TIMEOUT)
        self._sweeper = loop.call_later(SWEEP_EVERY, self._sweep)

    async def stop(self, grace: float) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        if self._gate is not None:
            self._gate.close()
        await self._connections.drain(grace)
        for t in list(self._background):
            t.cancel()
        await self.up.topology.stop()
        self.up.pools.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()

    def _room(self) -> None:
        if self._server is not None:
            self._server.room()

    # -- what each app connection hands over -----------------------------------------------------------
    async def _message(self, conn_id: int, host: str, header: wire.Header, payload: bytes) -> bytes | None:
        op = header.op_code
        if op == wire.OP_MSG:
            msg = wire.parse_msg(payload, header)
            body = await self._command(conn_id, host, msg)
            if body is None or msg.more_to_come:
                return None
            return wire.encode_body_msg(wire.next_request_id(), header.request_id, body)
        if op == wire.OP_QUERY:
            return self._legacy(conn_id, header, wire.parse_query(payload))
        if op == wire.OP_COMPRESSED:
            raise wire.ProtocolError("OP_COMPRESSED received, but the sidecar offered no compression")
        raise wire.ProtocolError(
            f"opcode {op} is not one the sidecar accepts (OP_MSG, or OP_QUERY for hello)"
        )

    async def _command(self, conn_id: int, host: str, msg: wire.Msg) -> bytes | None:
        cmd, body = describe(msg)
        name = cmd.name
        door = self.up.services.door(self.name)
        if door is not None and (name in HELLO or name == "endSessions"):
            door.exempt()  # answered by the sidecar itself: exempt, as the seed's server has them
        if name in HELLO:
            return answer.hello_reply(body, self.up.topology.facts(), conn_id)
        if name in AUTH:
            return answer.error_doc(18, "AuthenticationFailed", _AUTH_REFUSED)
        if name == "endSessions":
            return self._end_sessions(msg, body)
        return await forward(self.up, msg, cmd, host)

    def _legacy(self, conn_id: int, header: wire.Header, q: wire.Query) -> bytes:
        try:
            doc = RawBSONDocument(q.query, RAW)
            inner = doc.get("$query")
            if isinstance(inner, RawBSONDocument):
                doc = inner
            name = next(iter(doc), "")
            hello = q.collection.endswith(".$cmd") and name in HELLO
            body = answer.hello_reply(doc, self.up.topology.facts(), conn_id) if hello else b""
        except (BSONError, ValueError) as e:  # the framing held, the document inside did not
            log.warning(
                "mongodb listener %s: connection %d sent an OP_QUERY whose document is not valid BSON (%s); "
                "answered with an error",
                self.name,
                conn_id,
                e,
            )
            body = answer.error_doc(22, "InvalidBSON", f"the OP_QUERY document is not valid BSON: {e}")
            return wire.encode_reply(wire.next_request_id(), header.request_id, [body])
        if not hello:
            body = answer.error_doc(
                352,
                "UnsupportedOpQueryCommand",
                f"OP_QUERY is only accepted for hello/isMaster, not {name!r}",
            )
        return wire.encode_reply(wire.next_request_id(), header.request_id, [body])

    def _end_sessions(self, msg: wire.Msg, body: RawBSONDocument) -> bytes:
        """Answer at once; forget the sessions' transaction pins; tell every reachable server."""
        ids = body.get("endSessions")
        if isinstance(ids, list):
            self.up.pins.sessions_ended(d.raw for d in ids if isinstance(d, RawBSONDocument))
        for endpoint, state in self.up.topology.servers.items():
            if state.up:
                task = asyncio.get_running_loop().create_task(self._pass_on(endpoint, msg))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        return answer.ok_doc()

    async def _pass_on(self, endpoint: str, msg: wire.Msg) -> None:
        pool = self.up.pools.get(endpoint)
        try:
            conn = await pool.acquire()
        except Exception:
            return
        rid = wire.next_request_id()
        try:
            async with asyncio.timeout(self.settings.connect_timeout):
                await conn.roundtrip(wire.encode_msg(rid, 0, 0, msg.sections), rid)
        except BaseException:
            pool.discard(conn)
            return
        pool.release(conn)


def _limits(config: MongoListenerConfig) -> Limits:
    return Limits(config.max_message_size, config.idle_timeout, config.message_timeout)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
