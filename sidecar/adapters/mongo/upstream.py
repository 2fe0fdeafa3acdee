"""Connections to upstream servers: connect (TLS optional), handshake with ``backpressure: true``, SCRAM
authentication, one command at a time; a pool of them per endpoint; and a set of pools per login
(:class:`Logins`: each app user's commands go upstream over connections logged in as that user).

Every failure to get a ready connection is a :class:`ConnectFailure` (stage ``connect``: nothing was sent;
stage ``auth``: the upstream refused the sidecar's credentials). Failures after a command went out are
``OSError`` / ``asyncio.IncompleteReadError`` / ``wire.ProtocolError`` from :meth:`Connection.roundtrip`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import platform
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import bson
from bson import CodecOptions
from bson.raw_bson import RawBSONDocument

from ... import __version__
from ...config.schema import AuthConfig, TlsConfig, UpstreamConfig
from . import compression, wire
from .scram import ScramClient, ScramFailure

log = logging.getLogger("sidecar.mongo.upstream")
RAW = CodecOptions(document_class=RawBSONDocument)
#: Replies may be a little larger than the largest document (mongod's own limit is 48 MB messages).
MAX_REPLY = 64 * 1024 * 1024

CLIENT_METADATA = {
    "driver": {"name": "retry-sidecar", "version": __version__},
    "os": {"type": platform.system() or "unknown", "architecture": platform.machine() or "unknown"},
    "platform": f"Python {platform.python_version()}",
    "application": {"name": "retry-sidecar"},
}


class ConnectFailure(Exception):
    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


def ssl_context(tls: TlsConfig | None) -> ssl.SSLContext | None:
    if tls is None:
        return None
    ctx = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass(frozen=True)
class Settings:
    connect_timeout: float
    max_connections: int
    tls: ssl.SSLContext | None
    server_name: str | None
    auth: AuthConfig | None
    compressors: tuple[str, ...] = ()  # offered to the upstream in each handshake, in this order
    zlib_level: int = -1
    #: where to connect for a member ``(host, port)`` (a mongodb+srv:// upstream's members are names
    #: resolved through the sidecar's resolver: ``seeds.SrvSeeds.address``); ``None``: the host as written
    address: Callable[[str, int], Awaitable[str]] | None = None

    @classmethod
    def from_config(cls, cfg: UpstreamConfig) -> Settings:
        u = cfg.mongo_uri
        return cls(
            connect_timeout=cfg.connect_timeout,
            max_connections=cfg.max_connections,
            tls=ssl_context(cfg.tls),
            server_name=cfg.tls.server_name if cfg.tls is not None else None,
            auth=cfg.auth,
            compressors=tuple(cfg.compressors),
            zlib_level=u.zlib_level if u is not None else -1,
        )


def split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class Connection:
    """One upstream connection, used by one request at a time."""

    __slots__ = (
        "endpoint",
        "reader",
        "writer",
        "hello",
        "generation",
        "idle_since",
        "compressor",
        "zlib_level",
    )

    def __init__(self, endpoint: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.endpoint = endpoint
        self.reader = reader
        self.writer = writer
        self.hello: Mapping[str, Any] = {}
        self.generation = 0
        self.idle_since = 0.0  # loop time it went back to its pool
        self.compressor: str | None = None  # agreed in the handshake (compression.py)
        self.zlib_level = -1

    @property
    def closed(self) -> bool:
        return self.writer.is_closing() or self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()

    def _packed(self, message: bytes, compressible: bool) -> bytes:
        if compressible and self.compressor is not None:
            return compression.wrap(message, self.compressor, self.zlib_level)
        return message

    async def send(self, message: bytes, compressible: bool = False) -> None:
        self.writer.write(self._packed(message, compressible))
        await self.writer.drain()

    async def roundtrip(
        self, message: bytes, request_id: int, compressible: bool = False
    ) -> tuple[wire.Header, bytes]:
        """Send a command (compressed when the handshake agreed a compressor and ``compressible``: not a
        command the spec never compresses) and read its reply (an OP_MSG answering ``request_id``,
        inflated when it came compressed)."""
        self.writer.write(self._packed(message, compressible))
        await self.writer.drain()
        return await self.read_reply(request_id)

    async def read_reply(self, request_id: int) -> tuple[wire.Header, bytes]:
        head = await self.reader.readexactly(wire.HEADER_SIZE)
        header = wire.parse_header(head, MAX_REPLY)
        payload = await self.reader.readexactly(header.length - wire.HEADER_SIZE)
        if header.op_code == wire.OP_COMPRESSED:
            header, payload, _ = compression.unwrap(header, payload, MAX_REPLY, compression.ALL)
        if header.response_to != request_id:
            raise wire.ProtocolError(f"reply answers request {header.response_to}, expected {request_id}")
        if header.op_code != wire.OP_MSG:
            raise wire.ProtocolError(
                f"reply is {wire.OP_NAMES.get(header.op_code, header.op_code)}, not OP_MSG"
            )
        return header, payload

    async def command(self, doc: Mapping[str, Any]) -> RawBSONDocument:
        """Run a command the sidecar originates (handshake, auth, monitoring) and return its reply body."""
        rid = wire.next_request_id()
        header, payload = await self.roundtrip(wire.encode_body_msg(rid, 0, bson.encode(doc)), rid)
        msg = wire.parse_msg(payload, header)
        return RawBSONDocument(msg.body, RAW)


def hello_command(handshake: bool, compressors: tuple[str, ...] = ()) -> dict[str, Any]:
    cmd: dict[str, Any] = {"hello": 1, "helloOk": True, "backpressure": True}
    if handshake:
        cmd["client"] = CLIENT_METADATA
        if compressors:
            cmd["compression"] = list(compressors)
    cmd["$db"] = "admin"
    return cmd


async def connect(endpoint: str, settings: Settings, auth: AuthConfig | None = None) -> Connection:
    """A ready connection: TCP (+TLS), ``hello`` with ``backpressure: true``, SCRAM as ``auth`` (default:
    the upstream's own login, ``settings.auth``)."""
    auth = settings.auth if auth is None else auth
    host, port = split(endpoint)
    try:
        async with asyncio.timeout(settings.connect_timeout):
            where = host
            if settings.address is not None:
                where = split(await settings.address(host, port))[0]
            reader, writer = await asyncio.open_connection(
                where,
                port,
                ssl=settings.tls,
                server_hostname=(settings.server_name or host) if settings.tls is not None else None,
            )
    except TimeoutError:
        raise ConnectFailure("connect", f"connecting to {endpoint} timed out") from None
    except (OSError, ssl.SSLError) as e:
        raise ConnectFailure("connect", f"connecting to {endpoint} failed: {e}") from None
    conn = Connection(endpoint, reader, writer)
    try:
        async with asyncio.timeout(settings.connect_timeout):
            conn.hello = await conn.command(hello_command(handshake=True, compressors=settings.compressors))
            if conn.hello.get("ok") != 1:
                raise ConnectFailure("connect", f"hello to {endpoint} failed: {conn.hello.get('errmsg')}")
            agreed = compression.negotiate(settings.compressors, conn.hello.get("compression"))
            conn.compressor = agreed[0] if agreed else None
            conn.zlib_level = settings.zlib_level
            if auth is not None:
                await authenticate(conn, auth)
    except TimeoutError:
        conn.close()
        raise ConnectFailure("connect", f"handshake with {endpoint} timed out") from None
    except (OSError, asyncio.IncompleteReadError, wire.ProtocolError, ssl.SSLError) as e:
        conn.close()
        raise ConnectFailure(
            "connect", f"handshake with {endpoint} failed: {e or type(e).__name__}"
        ) from None
    except ConnectFailure:
        conn.close()
        raise
    return conn


async def authenticate(conn: Connection, auth: AuthConfig) -> None:
    client = ScramClient(auth.mechanism, auth.username, auth.password)
    try:
        reply = await conn.command(
            {
                "saslStart": 1,
                "mechanism": auth.mechanism,
                "payload": bson.Binary(client.first()),
                "autoAuthorize": 1,
                "options": {"skipEmptyExchange": True},
                "$db": auth.source,
            }
        )
        _check(reply, conn.endpoint)
        final = client.final(bytes(reply["payload"]))
        reply = await conn.command(
            {
                "saslContinue": 1,
                "conversationId": reply["conversationId"],
                "payload": bson.Binary(final),
                "$db": auth.source,
            }
        )
        _check(reply, conn.endpoint)
        client.verify(bytes(reply["payload"]))
        while not reply.get("done"):
            reply = await conn.command(
                {
                    "saslContinue": 1,
                    "conversationId": reply["conversationId"],
                    "payload": b"",
                    "$db": auth.source,
                }
            )
            _check(reply, conn.endpoint)
    except ScramFailure as e:
        raise ConnectFailure("auth", f"authenticating to {conn.endpoint} as {auth.username!r}: {e}") from None


def _check(reply: Mapping[str, Any], endpoint: str) -> None:
    if reply.get("ok") != 1:
        raise ConnectFailure(
            "auth", f"{endpoint} refused authentication: {reply.get('errmsg', 'no reason given')}"
        )


class Pool:
    """Idle connections to one endpoint, at most ``max_connections`` open (waiters queue). The most recently
    used is taken first, so the ones a burst opened age at the other end and ``sweep`` closes them."""

    def __init__(self, endpoint: str, settings: Settings, auth: AuthConfig | None = None) -> None:
        self.endpoint = endpoint
        self.settings = settings
        self.auth = auth
        self.idle: collections.deque[Connection] = collections.deque()
        self.slots = asyncio.Semaphore(settings.max_connections)
        self.generation = 0
        self.closed = False

    async def acquire(self) -> Connection:
        await self.slots.acquire()
        try:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed and conn.generation == self.generation:
                    return conn
                conn.close()
            conn = await connect(self.endpoint, self.settings, self.auth)
            conn.generation = self.generation
            return conn
        except BaseException:
            self.slots.release()
            raise

    def release(self, conn: Connection) -> None:
        """Return a connection whose last reply was read completely."""
        self.slots.release()
        if self.closed or conn.closed or conn.generation != self.generation:
            conn.close()
        else:
            conn.idle_since = asyncio.get_running_loop().time()
            self.idle.append(conn)

    def sweep(self, now: float, idle_timeout: float) -> None:
        """Close connections idle for ``idle_timeout`` (the oldest are at the left)."""
        idle = self.idle
        while idle and now - idle[0].idle_since > idle_timeout:
            idle.popleft().close()

    def discard(self, conn: Connection) -> None:
        """Close a connection left in an unknown state (error, cancellation mid-command)."""
        self.slots.release()
        conn.close()

    def clear(self) -> None:
        """The endpoint failed: close idle connections; ones in use close when returned."""
        self.generation += 1
        while self.idle:
            self.idle.pop().close()

    def close(self) -> None:
        self.closed = True
        self.clear()


class Pools:
    """One login's pools, one per endpoint (``auth``: ``None`` is the upstream's own login, if any)."""

    def __init__(self, settings: Settings, auth: AuthConfig | None = None) -> None:
        self.settings = settings
        self.auth = auth
        self._pools: dict[str, Pool] = {}

    def get(self, endpoint: str) -> Pool:
        pool = self._pools.get(endpoint)
        if pool is None:
            pool = self._pools[endpoint] = Pool(endpoint, self.settings, self.auth)
        return pool

    def sweep(self, now: float, idle_timeout: float) -> None:
        for p in self._pools.values():
            p.sweep(now, idle_timeout)

    def drop(self, endpoint: str) -> None:
        """The endpoint left (a router no longer in its SRV record): its idle connections close now, the
        ones in use once their command is answered (drained)."""
        pool = self._pools.pop(endpoint, None)
        if pool is not None:
            pool.close()

    def close(self) -> None:
        for p in self._pools.values():
            p.close()


class Logins:
    """The pools of every login the sidecar uses upstream: the upstream's own (``settings.auth``; none
    without credentials), and one per app user who logged in to the listener (``app_auth``), logged in
    upstream as that same user with the same mechanism, so that the server's own authorization applies.
    An upstream without a login has one set of pools for everyone: there is nobody to log in as."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.own = Pools(settings)
        self._users: dict[tuple[str, str], Pools] = {}

    def of(self, user: Any) -> Pools:
        """The pools for an app user (``login.AppUser``; ``None``: the upstream's own identity)."""
        own = self.settings.auth
        if user is None or own is None:
            return self.own
        pools = self._users.get(user.key)
        if pools is None:
            auth = AuthConfig(
                username=user.username, password=user.password, source=user.source, mechanism=own.mechanism
            )
            pools = self._users[user.key] = Pools(self.settings, auth)
        return pools

    def all(self) -> list[Pools]:
        return [self.own, *self._users.values()]

    def sweep(self, now: float, idle_timeout: float) -> None:
        for p in self.all():
            p.sweep(now, idle_timeout)

    def drop(self, endpoint: str) -> None:
        for p in self.all():
            p.drop(endpoint)

    def close(self) -> None:
        for p in self.all():
            p.close()
