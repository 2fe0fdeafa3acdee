"""The MongoDB listener: the app's driver connects here as to a mongos (over TLS with ``tls``).

The sidecar answers ``hello``/``isMaster`` itself (OP_MSG, and the legacy OP_QUERY handshake with an
OP_REPLY), with what this connection negotiates there: compression (``compressors``) and, with
``app_auth``, the app's own login (``saslSupportedMechs``, ``speculativeAuthenticate``; ``login.py``). It
runs the login's ``saslStart``/``saslContinue`` (without ``app_auth``: code 18, as before), refuses other
commands before a login (code 13), answers ``endSessions`` and passes it on, and forwards every other
command through ``request.py``, as the connection's user. A message that cannot be read (bad framing, bad
BSON, over ``max_message_size`` once inflated, an unknown opcode or compressor) closes that connection only,
with a log line naming what was wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import itertools
import logging
import ssl
from typing import TYPE_CHECKING, Any

from bson.errors import BSONError
from bson.raw_bson import RawBSONDocument

from ...admit import Way
from ...config.schema import ListenerTlsConfig, MongoListenerConfig, UpstreamConfig
from ...config.units import split_host_port
from ...gates.accept_gate import AcceptGate
from ...services import Services
from ..acceptor import Acceptor
from ..connections import Connections
from . import answer, compression, wire
from .attempt import PassOn
from .commands import AUTH, HELLO, RAW, Command, describe
from .connection import AppConnection, Limits
from .login import AppUser, AppUsers, Login, LoginFailed
from .pinning import Pins
from .request import Shared, end_sessions, forward
from .scram import ScramFailure
from .topology import Topology
from .upstream import Logins, Settings

if TYPE_CHECKING:
    from .seeds import SrvSeeds

log = logging.getLogger("sidecar.mongo")

#: How long a command waits for a server that fits it (a primary during an election), at most.
SERVER_SELECTION_TIMEOUT = 10.0
#: Pooled upstream connections idle this long are closed (a burst's extra connections do not stay forever).
POOL_IDLE_TIMEOUT = 30.0
SWEEP_EVERY = 1.0


class MongoListener:
    def __init__(self, config: MongoListenerConfig, services: Services) -> None:
        self.name = config.name
        self.config = config
        runtime = services.upstream(config.upstream)
        ucfg = runtime.config
        uri = ucfg.mongo_uri
        self._seeds: SrvSeeds | None = None
        if uri is not None and uri.srv is not None:
            from .seeds import SrvSeeds  # dnspython: imported for a mongodb+srv:// upstream only (issue 27)

            self._seeds = SrvSeeds(config.upstream, uri, lambda: services.discovery.resolver, services.rand)
        settings = Settings.from_config(ucfg)
        if self._seeds is not None:
            settings = dataclasses.replace(settings, address=self._seeds.address)
        self.settings = settings
        topology = Topology(config.upstream, ucfg.endpoints, settings, ucfg.replica_set)
        assert config.policy is not None  # the loader fills in the protocol's preset
        policy = services.policy(config.policy)
        logins = Logins(settings)
        self.up = Shared(
            name=config.upstream,
            runtime=runtime,
            topology=topology,
            logins=logins,
            pins=Pins(),
            policy=policy,
            services=services,
            listener=config.name,
            server_selection_timeout=SERVER_SELECTION_TIMEOUT,
            way=Way(services, config.name, "mongodb", policy, runtime),
            passing=PassOn(settings.connect_timeout),
        )
        self._users = _app_users(config, ucfg)
        self._tls = _tls_context(config.tls)
        self._server: Acceptor | None = None
        self._limits = _limits(config)
        self._connections: Connections[AppConnection] = Connections(config.name, log)
        self._conn_ids = itertools.count(1)
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
        timeouts, ``app_auth`` users, ``tls`` and ``compressors`` apply to connections accepted from now on
        (a connection keeps the login it made)."""
        assert config.policy is not None
        self.config = config
        self._limits = _limits(config)
        self._users = _app_users(config, services.upstream(config.upstream).config)
        self._tls = _tls_context(config.tls)
        if self._server is not None:
            self._server.max_connections = config.max_connections
            self._server.ssl = self._tls
        runtime, policy = services.upstream(config.upstream), services.policy(config.policy)
        self.up = dataclasses.replace(
            self.up,
            runtime=runtime,
            policy=policy,
            services=services,
            way=Way(services, config.name, "mongodb", policy, runtime),
        )

    async def start(self) -> None:
        if self._seeds is not None:
            await self._first_seeds(self._seeds)
        await self.up.topology.start(wait=self.settings.connect_timeout)
        if self._seeds is not None and (self.up.topology.replica_set is None or not self._seeds.hosts):
            # routers: the record is polled (a replica set's members are followed by its monitoring, once
            # the record gave its first members)
            self._seeds.follow(self._reseed)
        host, port = split_host_port(self.config.listen)
        auth = self.config.app_auth
        if not _loopback(host) and (auth is None or auth.allow_unauthenticated):
            log.warning(
                "mongodb listener %s listens on %s: apps connect to it without logging in, and it uses "
                "the upstream's credentials for them; keep it on loopback (127.0.0.1), or give it app_auth",
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
                    Login(self._users) if self._users is not None else None,
                )
            ),
            host,
            port,
            max_connections=self.config.max_connections,
            ssl=self._tls,
            count=self._connections.__len__,
        )
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_EVERY, self._sweep)

    async def _first_seeds(self, seeds: SrvSeeds) -> None:
        """A mongodb+srv:// upstream: its members (SRV) and options (TXT) before the listener opens; without
        them, it opens all the same (commands get code 133 naming the name) and keeps looking."""
        resolver = self.up.services.discovery.resolver
        try:
            async with asyncio.timeout(2 * resolver.lifetime + 1.0):
                hosts, options, problem = await seeds.first()
        except TimeoutError:
            hosts, options, problem = [], {}, f"no answer for {seeds.record} in time"
        replica_set = options.get("replicaset")
        if isinstance(replica_set, str) and self.up.topology.replica_set is None:
            self.up.topology.set_replica_set(replica_set)
        source = options.get("authsource")
        if isinstance(source, str) and self.settings.auth is not None:
            self._txt_auth_source(source)
        if problem:
            log.warning(
                "upstream %s: %s: no members yet (%s); looking again every few seconds",
                self.up.name,
                seeds.name,
                problem,
            )
        else:
            self.up.topology.reseed(hosts)
            log.info("upstream %s: %s lists %s", self.up.name, seeds.record, ", ".join(hosts))

    def _txt_auth_source(self, source: str) -> None:
        """The TXT record's authSource (the URI gave none): the upstream login's database."""
        auth = self.settings.auth
        assert auth is not None
        settings = dataclasses.replace(self.settings, auth=auth.model_copy(update={"source": source}))
        self.settings = settings
        self.up.topology.settings = settings
        self.up.logins.settings = settings
        self.up.logins.own.settings = settings
        if (
            self.config.app_auth is not None
            and self.config.app_auth.users is None
            and self._users is not None
        ):
            own = settings.auth
            assert own is not None
            self._users = AppUsers(
                [AppUser(own.username, own.password, own.source)], self._users.allow_unauthenticated
            )

    def _reseed(self, hosts: list[str]) -> None:
        topology = self.up.topology
        if topology.replica_set is not None and topology.members.seeds:
            return  # a replica set, seeded: its monitoring follows its members
        for gone in topology.reseed(hosts):
            self.up.logins.drop(gone)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        self.up.logins.sweep(loop.time(), POOL_IDLE_TIMEOUT)
        self._sweeper = loop.call_later(SWEEP_EVERY, self._sweep)

    async def stop(self, grace: float) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        if self._gate is not None:
            self._gate.close()
        await self._connections.drain(grace)
        self.up.passing.cancel()
        if self._seeds is not None:
            await self._seeds.stop()
        await self.up.topology.stop()
        self.up.logins.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()

    def _room(self) -> None:
        if self._server is not None:
            self._server.room()

    # -- what each app connection hands over -----------------------------------------------------------
    async def _message(self, conn: AppConnection, header: wire.Header, payload: bytes) -> bytes | None:
        compressor: str | None = None
        if header.op_code == wire.OP_COMPRESSED:
            if not self.config.compressors:
                raise wire.ProtocolError("OP_COMPRESSED received, but the listener offers no compression")
            header, payload, compressor = compression.unwrap(
                header, payload, self._limits.max_size, frozenset(self.config.compressors)
            )
        op = header.op_code
        if op == wire.OP_MSG:
            msg = wire.parse_msg(payload, header)
            cmd, body = describe(msg)
            reply = await self._command(conn, msg, cmd, body)
            if reply is None or msg.more_to_come:
                return None
            out = wire.encode_body_msg(wire.next_request_id(), header.request_id, reply)
            if compressor is not None and cmd.name not in compression.NEVER:
                out = compression.wrap(out, compressor)  # as mongod: compressed like the request
            return out
        if op == wire.OP_QUERY:
            return self._legacy(conn, header, wire.parse_query(payload))
        raise wire.ProtocolError(
            f"opcode {op} is not one the sidecar accepts (OP_MSG, or OP_QUERY for hello)"
        )

    async def _command(
        self, conn: AppConnection, msg: wire.Msg, cmd: Command, body: RawBSONDocument
    ) -> bytes | None:
        name = cmd.name
        login = conn.login
        if name in HELLO:
            self._exempt()
            return answer.hello_reply(body, self.up.topology.facts(), conn.conn_id, self._hello(conn, body))
        if name in AUTH:
            return self._sasl(conn, name, body) if login is not None else answer.auth_refused_doc()
        if login is not None and not login.allows(name):
            self.up.services.telemetry.metrics.listener(self.name).reject("unauthorized")
            return answer.unauthorized_doc(name)
        user = login.user if login is not None else None
        if name == "endSessions":
            self._exempt()
            return end_sessions(self.up, msg, body, user)
        return await forward(self.up, msg, cmd, conn.host, user)

    def _exempt(self) -> None:
        door = self.up.services.door(self.name)
        if door is not None:
            door.exempt()  # answered by the sidecar itself: exempt, as the seed's server has them

    def _hello(self, conn: AppConnection, body: RawBSONDocument) -> dict[str, Any]:
        """What this connection negotiates in its hello: compression, mechanisms for the user it names, and
        a login begun at once (``speculativeAuthenticate``)."""
        extra: dict[str, Any] = {}
        if self.config.compressors:
            agreed = compression.negotiate(self.config.compressors, body.get("compression"))
            if agreed:
                extra["compression"] = agreed
        login = conn.login
        if login is None:
            return extra
        mechs = body.get("saslSupportedMechs")
        if isinstance(mechs, str) and "." in mechs:
            source, _, username = mechs.partition(".")
            found = login.users.mechanisms(source, username)
            if found:
                extra["saslSupportedMechs"] = found
        spec = body.get("speculativeAuthenticate")
        if isinstance(spec, RawBSONDocument) and spec.get("saslStart"):
            source = spec.get("db")
            step = self._start(conn, login, source if isinstance(source, str) else "admin", spec, True)
            if step is not None:
                extra["speculativeAuthenticate"] = answer.sasl_doc(step.conversation, step.done, step.payload)
        return extra

    def _sasl(self, conn: AppConnection, name: str, body: RawBSONDocument) -> bytes:
        login = conn.login
        assert login is not None
        if name == "logout":
            login.logout()
            return answer.ok_doc()
        if name == "saslStart":
            db = body.get("$db")
            step = self._start(conn, login, db if isinstance(db, str) else "admin", body)
        elif name == "saslContinue":
            try:
                step = login.proceed(body.get("conversationId"), _payload(body))
            except LoginFailed as e:
                self._failed(conn, e)
                step = None
        else:  # authenticate (x.509, MONGODB-CR), getnonce: mechanisms the sidecar does not run
            step = None
        if step is None:
            return answer.auth_failed_doc()
        if step.done and login.user is not None:
            log.debug(
                "mongodb listener %s: the client at %s logged in as %r (source %r, %s%s)",
                self.name,
                conn.peer,
                login.user.username,
                login.user.source,
                login.mechanism,
                ", speculative" if login.speculative else "",
            )
        return answer.sasl_reply(step.conversation, step.done, step.payload)

    def _start(
        self, conn: AppConnection, login: Login, source: str, doc: RawBSONDocument, speculative: bool = False
    ) -> Any:
        mechanism = doc.get("mechanism")
        options = doc.get("options")
        skip = isinstance(options, RawBSONDocument) and bool(options.get("skipEmptyExchange"))
        try:
            return login.start(source, str(mechanism), _payload(doc), skip, speculative)
        except LoginFailed as e:
            self._failed(conn, e)
        except ScramFailure:  # a mechanism the sidecar does not run
            log.warning(
                "mongodb listener %s: the client at %s asked to log in with %s, which the sidecar does not "
                "run (SCRAM-SHA-256, SCRAM-SHA-1)",
                self.name,
                conn.peer,
                mechanism,
            )
        return None

    def _failed(self, conn: AppConnection, e: LoginFailed) -> None:
        self.up.services.telemetry.metrics.listener(self.name).reject("auth-failed")
        log.warning(
            "mongodb listener %s: login failed for user %r (source %r, %s) from %s",
            self.name,
            e.username,
            e.source,
            e.mechanism,
            conn.peer,
        )

    def _legacy(self, conn: AppConnection, header: wire.Header, q: wire.Query) -> bytes:
        conn_id = conn.conn_id
        try:
            doc = RawBSONDocument(q.query, RAW)
            inner = doc.get("$query")
            if isinstance(inner, RawBSONDocument):
                doc = inner
            name = next(iter(doc), "")
            hello = q.collection.endswith(".$cmd") and name in HELLO
            body = (
                answer.hello_reply(doc, self.up.topology.facts(), conn_id, self._hello(conn, doc))
                if hello
                else b""
            )
        except (BSONError, ValueError) as e:  # the framing held, the document inside did not
            log.warning(
                "mongodb listener %s: connection %d sent an OP_QUERY whose document is not valid BSON (%s); "
                "answered with an error",
                self.name,
                conn_id,
                e,
            )
            return wire.encode_reply(wire.next_request_id(), header.request_id, [answer.invalid_query_doc(e)])
        if not hello:
            body = answer.unsupported_query_doc(name)
        return wire.encode_reply(wire.next_request_id(), header.request_id, [body])


def _payload(doc: RawBSONDocument) -> bytes:
    p = doc.get("payload")
    if isinstance(p, bytes | bytearray | memoryview):
        return bytes(p)
    if isinstance(p, str):
        return p.encode()
    return b""


def _app_users(config: MongoListenerConfig, upstream: UpstreamConfig) -> AppUsers | None:
    """Who may log in (``app_auth``): its ``users``, or the upstream's own user; ``None``: no login."""
    auth = config.app_auth
    if auth is None:
        return None
    if auth.users is not None:
        users = [AppUser(u.username, u.password, u.source) for u in auth.users]
    elif upstream.auth is not None:
        users = [AppUser(upstream.auth.username, upstream.auth.password, upstream.auth.source)]
    else:
        users = []  # the loader refuses this
    return AppUsers(users, auth.allow_unauthenticated)


def _tls_context(tls: ListenerTlsConfig | None) -> ssl.SSLContext | None:
    """The listener's TLS (``tls``): its certificate; with ``ca_file``, client certificates required."""
    if tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.ca_file is not None:
        ctx.load_verify_locations(tls.ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _limits(config: MongoListenerConfig) -> Limits:
    return Limits(config.max_message_size, config.idle_timeout, config.message_timeout)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
