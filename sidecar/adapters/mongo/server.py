"""The MongoDB listener: the app's driver connects here as to a mongos.

The sidecar answers ``hello``/``isMaster`` itself (OP_MSG, and the legacy OP_QUERY handshake with an
OP_REPLY), refuses authentication from the app (it authenticates upstream), answers ``endSessions`` and
passes it on, and forwards every other command through ``forward.py``. A message that cannot be read
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

from bson.raw_bson import RawBSONDocument

from ...config.schema import MongoListenerConfig
from ...config.units import split_host_port
from ...services import Services
from ..connections import Connections
from . import answer, wire
from .commands import AUTH, HELLO, RAW, describe
from .connection import AppConnection
from .pinning import Pins
from .request import Shared, forward
from .topology import Topology
from .upstream import Pools, Settings

log = logging.getLogger("sidecar.mongo")

#: How long a command waits for a server that fits it (a primary during an election), at most.
SERVER_SELECTION_TIMEOUT = 10.0
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
        self.up = Shared(
            name=config.upstream,
            runtime=runtime,
            topology=topology,
            pools=Pools(settings),
            pins=Pins(),
            policy=services.policy(config.policy),
            services=services,
            listener=config.name,
            server_selection_timeout=SERVER_SELECTION_TIMEOUT,
        )
        self._server: asyncio.Server | None = None
        self._connections: Connections[AppConnection] = Connections(config.name, log)
        self._conn_ids = itertools.count(1)
        self._background: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            host, port = split_host_port(self.config.listen)
            return host, port
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    def reconfigure(self, config: MongoListenerConfig, services: Services) -> None:
        """A reloaded config whose upstream did not change (``reload.restart_reasons`` refuses that): the
        policy may have; commands from now on use it, those in progress finish under the old one."""
        assert config.policy is not None
        self.config = config
        self.up = dataclasses.replace(
            self.up,
            runtime=services.upstream(config.upstream),
            policy=services.policy(config.policy),
            services=services,
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
        limit = self.config.max_message_size
        self._server = await asyncio.get_running_loop().create_server(
            lambda: AppConnection(next(self._conn_ids), self._message, limit, self.name, self._connections),
            host,
            port,
        )

    async def stop(self, grace: float) -> None:
        if self._server is not None:
            self._server.close()
        await self._connections.drain(grace)
        for t in list(self._background):
            t.cancel()
        await self.up.topology.stop()
        self.up.pools.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()

    # -- what each app connection hands over -----------------------------------------------------------
    async def _message(self, conn_id: int, header: wire.Header, payload: bytes) -> bytes | None:
        op = header.op_code
        if op == wire.OP_MSG:
            msg = wire.parse_msg(payload, header)
            body = await self._command(conn_id, msg)
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

    async def _command(self, conn_id: int, msg: wire.Msg) -> bytes | None:
        cmd, body = describe(msg)
        name = cmd.name
        if name in HELLO:
            return answer.hello_reply(body, self.up.topology.facts(), conn_id)
        if name in AUTH:
            return answer.error_doc(18, "AuthenticationFailed", _AUTH_REFUSED)
        if name == "endSessions":
            return self._end_sessions(msg, body)
        return await forward(self.up, msg, cmd)

    def _legacy(self, conn_id: int, header: wire.Header, q: wire.Query) -> bytes:
        doc = RawBSONDocument(q.query, RAW)
        inner = doc.get("$query")
        if isinstance(inner, RawBSONDocument):
            doc = inner
        name = next(iter(doc), "")
        if q.collection.endswith(".$cmd") and name in HELLO:
            body = answer.hello_reply(doc, self.up.topology.facts(), conn_id)
        else:
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


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
