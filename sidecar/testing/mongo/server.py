"""A MongoDB test server that behaves like mongod and mongos for what the sidecar touches.

It speaks OP_MSG (and the legacy OP_QUERY handshake), answers ``hello`` in its role (standalone, mongos,
replica-set primary or secondary), runs CRUD on in-memory collections, deduplicates retried writes, keeps
enough transaction state to notice a statement sent to the wrong server, authenticates with SCRAM, and obeys
the ``failCommand`` fail point. Users have roles (``read``: reads only; ``readWrite``: everything), checked
as mongod would (code 13 for a command the role does not allow). Every command it receives is logged with a
timestamp and the user its connection logged in as, so tests count upstream attempts, measure the gaps
between them and see who ran what.

    server = MongoTestServer(role="mongos")
    await server.start()
    server.fail_command(["find"], times=2, error_code=462, error_labels=["SystemOverloadedError", "RetryableError"])
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson import CodecOptions
from bson.objectid import ObjectId

from ...adapters.mongo import compression, wire
from .admission import REJECTION, IngressRateLimiter
from .failpoints import FailCommand, FailPointError
from .handlers import (
    NO_SECONDARY_OK,
    NOT_PRIMARY,
    READ_COMMANDS,
    WRITE_COMMANDS,
    Handlers,
    error,
)
from .scram import Conversation, Credential, ScramError
from .storage import Storage

log = logging.getLogger("sidecar.testing.mongo")
Doc = dict[str, Any]
_DECODE = CodecOptions(tz_aware=False)
_HELLO = frozenset({"hello", "isMaster", "ismaster"})
_AUTH = frozenset({"saslStart", "saslContinue", "authenticate"})
_OPEN = frozenset(
    {"hello", "isMaster", "ismaster", "saslStart", "saslContinue", "ping", "buildInfo", "buildinfo"}
)
ROLES = ("standalone", "mongos", "primary", "secondary")


@dataclass(frozen=True)
class LoggedCommand:
    """One command as the server received it. ``t``: ``time.monotonic()`` on arrival."""

    t: float
    name: str
    body: Doc
    connection: int
    sequences: dict[str, list[Doc]] = field(default_factory=dict)
    user: str | None = None  # who the connection logged in as
    compressor: str | None = None  # the message came in OP_COMPRESSED with this compressor


class MongoTestServer:
    def __init__(
        self,
        role: str = "standalone",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        set_name: str | None = None,
        users: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_wire_version: int = 21,
        logical_session_timeout: int = 30,
        tags: Mapping[str, str] | None = None,
        storage: Storage | None = None,
        record: bool = True,
        compressors: tuple[str, ...] = ("zstd", "snappy", "zlib"),
    ) -> None:
        """``record=False``: keep no command log (benchmarks, the demo: the log grows with every command)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        self.role = role
        self.host = host
        self.port = port
        self.set_name = set_name
        self.hosts: list[str] = []
        self.primary: str | None = None
        self.election_id = ObjectId()
        self.set_version = 1
        self.tags = dict(tags or {})
        self.compressors = compressors  # what it agrees to in a hello (OP_COMPRESSED)
        self.ssl_context = ssl_context
        self.max_wire_version = max_wire_version
        self.logical_session_timeout = logical_session_timeout
        self.storage = storage or Storage()
        self.handlers = Handlers(self.storage)
        self.users: dict[str, dict[str, Credential]] = {}
        self.roles: dict[str, str] = {}
        for user, password in (users or {}).items():
            self.add_user(user, password)
        self.fail_point: FailCommand | None = None
        self.limiter: IngressRateLimiter | None = None  # the ingress request rate limiter, when enabled
        self.log: list[LoggedCommand] = []
        self.record = record
        self._waiters: list[asyncio.Future[None]] = []
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._conn_ids = itertools.count(1)
        self.accepting = True  # False: close new connections at once (an ingress connection limiter)
        self.in_flight = 0  # commands being run now (hello and authentication excluded)
        self.peak_in_flight = 0  # the most at once
        self.hold: asyncio.Event | None = (
            None  # when set to an unset event, held commands wait for it (tests)
        )
        self.held: frozenset[str] = frozenset()  # the commands ``hold`` holds (names)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> MongoTestServer:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.role in ("primary", "secondary") and not self.hosts:
            self.hosts = [self.endpoint]
            if self.role == "primary":
                self.primary = self.endpoint
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def __aenter__(self) -> MongoTestServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def uri(self) -> str:
        return f"mongodb://{self.endpoint}/?directConnection=true"

    def close_connections(self) -> None:
        """Drop every open connection (a restart, as the clients see it)."""
        for w in list(self._conns):
            w.close()

    # -- configuration tests use -----------------------------------------------------------------------
    def add_user(self, user: str, password: str, role: str = "readWrite") -> None:
        """``role``: ``readWrite`` (everything) or ``read`` (reads only: a write is refused with code 13)."""
        if role not in ("read", "readWrite"):
            raise ValueError("role must be read or readWrite")
        self.users[user] = {m: Credential.make(m, user, password) for m in ("SCRAM-SHA-256", "SCRAM-SHA-1")}
        self.roles[user] = role

    def fail_command(self, commands: list[str], *, times: int | None = None, **data: Any) -> None:
        """Configure ``failCommand`` directly: ``times=None`` is alwaysOn. ``data`` keys as in the server's
        failpoint (``error_code=462`` or ``errorCode=462``, ``error_labels``, ``close_connection``, ...)."""
        spec: Doc = {"failCommands": commands}
        for k, v in data.items():
            spec[_camel(k)] = v
        mode: Any = "alwaysOn" if times is None else {"times": times}
        self.fail_point = FailCommand.from_command({"mode": mode, "data": spec})

    def limit_rate(self, rate: float | None, burst_seconds: float = 0.1) -> None:
        """Enable (or, with ``None``, disable) the ingress request rate limiter at ``rate`` commands/s."""
        if rate is None:
            self.limiter = None
        elif self.limiter is None:
            self.limiter = IngressRateLimiter(rate, burst_seconds)
        else:
            self.limiter.set_rate(rate, burst_seconds)

    def clear_fail_point(self) -> None:
        self.fail_point = None

    def set_role(self, role: str, primary: str | None = None) -> None:
        """Change role (an election, as this member sees it)."""
        self.role = role
        if primary is not None:
            self.primary = primary
        if role == "primary":
            self.primary = self.endpoint
            self.election_id = ObjectId()

    # -- what tests read -------------------------------------------------------------------------------
    def commands(self, name: str | None = None, *, include_hello: bool = False) -> list[LoggedCommand]:
        return [
            c
            for c in self.log
            if (name is None or c.name == name) and (include_hello or c.name not in _HELLO)
        ]

    def count(self, name: str) -> int:
        return sum(1 for c in self.log if c.name == name)

    async def wait_for(self, predicate: Callable[[MongoTestServer], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate(server)`` holds, checked after each command received."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                fut = asyncio.get_running_loop().create_future()
                self._waiters.append(fut)
                await fut

    # -- protocol --------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.accepting:
            writer.close()
            return
        conn = _Connection(next(self._conn_ids))
        self._conns.add(writer)
        try:
            while True:
                head = await reader.readexactly(wire.HEADER_SIZE)
                header = wire.parse_header(head, 64 * 1024 * 1024)
                payload = await reader.readexactly(header.length - wire.HEADER_SIZE)
                out = await self._message(conn, header, payload)
                if out is _CLOSE:
                    return
                if out:
                    writer.write(out)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, wire.ProtocolError, ssl.SSLError):
            pass
        except Exception:
            log.exception("test server %s: closing a connection after an unexpected error", self.endpoint)
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _message(self, conn: _Connection, header: wire.Header, payload: bytes) -> bytes | object:
        compressor = None
        if header.op_code == wire.OP_COMPRESSED:
            header, payload, compressor = compression.unwrap(
                header, payload, 64 * 1024 * 1024, frozenset(self.compressors)
            )
        conn.compressor = compressor
        reply = await self._plain_message(conn, header, payload)
        if compressor is not None and isinstance(reply, bytes) and reply:
            return compression.wrap(reply, compressor)  # as mongod: compressed like the request
        return reply

    async def _plain_message(self, conn: _Connection, header: wire.Header, payload: bytes) -> bytes | object:
        if header.op_code == wire.OP_QUERY:
            q = wire.parse_query(payload)
            cmd = bson.decode(q.query, _DECODE)
            name = next(iter(cmd), "")
            self._record(conn, name, cmd, {})
            if name in _HELLO:
                reply = self._hello(conn, cmd)
            else:
                reply = error(352, "UnsupportedOpQueryCommand", f"Unsupported OP_QUERY command: {name}")
            return wire.encode_reply(wire.next_request_id(), header.request_id, [bson.encode(reply)])
        if header.op_code != wire.OP_MSG:
            return _CLOSE
        msg = wire.parse_msg(payload, header)
        cmd = bson.decode(msg.body, _DECODE)
        seqs = {s.identifier: [bson.decode(d, _DECODE) for d in s.documents()] for s in msg.sequences}
        name = next(iter(cmd), "")
        self._record(conn, name, cmd, seqs)
        counted = name not in _HELLO and name not in _AUTH
        if counted:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            self._wake()
        try:
            if self.hold is not None and name in self.held:
                await self.hold.wait()
            reply = await self._command(conn, name, cmd, seqs)
        finally:
            if counted:
                self.in_flight -= 1
        if reply is _CLOSE:
            return _CLOSE
        if msg.more_to_come:
            return b""
        return wire.encode_body_msg(wire.next_request_id(), header.request_id, bson.encode(reply))

    def _record(self, conn: _Connection, name: str, cmd: Doc, seqs: dict[str, list[Doc]]) -> None:
        if not self.record:
            return
        self.log.append(LoggedCommand(time.monotonic(), name, cmd, conn.id, seqs, conn.user, conn.compressor))
        self._wake()

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def _command(
        self, conn: _Connection, name: str, cmd: Doc, seqs: dict[str, list[Doc]]
    ) -> Doc | object:
        if self.limiter is not None and name not in _OPEN and not self.limiter.admit():
            return dict(REJECTION)
        fp = self.fail_point
        if fp is not None and name != "configureFailPoint" and fp.take(name, conn.app_name):
            if fp.exhausted:
                self.fail_point = None
            if fp.block_ms:
                await asyncio.sleep(fp.block_ms / 1000.0)
            if fp.close_connection:
                return _CLOSE
            if fp.error_code is not None:
                doc = error(int(fp.error_code), _code_name(int(fp.error_code)), fp.errmsg, fp.error_labels)
                if fp.base_backoff_ms is not None:
                    doc["baseBackoffMS"] = fp.base_backoff_ms
                return doc
            if fp.write_concern_error is not None:
                reply = self._run(conn, name, cmd, seqs)
                if isinstance(reply, dict) and reply.get("ok") == 1.0:
                    reply = dict(reply)
                    wce = dict(fp.write_concern_error)
                    reply["writeConcernError"] = wce
                    if wce.get("errorLabels"):
                        reply["errorLabels"] = list(wce.pop("errorLabels"))
                return reply
        return self._run(conn, name, cmd, seqs)

    def _run(self, conn: _Connection, name: str, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        if name in _HELLO:
            return self._hello(conn, cmd)
        if name == "saslStart":
            return self._sasl_start(conn, cmd)
        if name == "saslContinue":
            return self._sasl_continue(conn, cmd)
        if self.users and conn.user is None and name not in _OPEN:
            return error(13, "Unauthorized", f"command {name} requires authentication")
        if conn.user is not None and self.roles.get(conn.user) == "read" and name in WRITE_COMMANDS:
            db = cmd.get("$db")
            return error(13, "Unauthorized", f"not authorized on {db} to execute command {{ {name}: ... }}")
        if name == "configureFailPoint":
            return self._configure(cmd)
        if self.role == "secondary":
            if name in WRITE_COMMANDS or (name in ("commitTransaction", "abortTransaction")):
                labels = ["RetryableWriteError"] if "txnNumber" in cmd else None
                return error(NOT_PRIMARY, "NotWritablePrimary", "not primary", labels)
            mode = (cmd.get("$readPreference") or {}).get("mode", "primary")
            if name in READ_COMMANDS and mode == "primary":
                return error(NO_SECONDARY_OK, "NotPrimaryNoSecondaryOk", "not primary and secondaryOk=false")
        return self.handlers.run(name, cmd, seqs)

    def _configure(self, cmd: Doc) -> Doc:
        if cmd.get("configureFailPoint") != "failCommand":
            return error(2, "BadValue", f"unknown fail point {cmd.get('configureFailPoint')!r}")
        try:
            self.fail_point = FailCommand.from_command(cmd)
        except (FailPointError, ValueError, TypeError) as e:
            return error(2, "BadValue", str(e))
        return {"count": 0, "ok": 1.0}

    def _hello(self, conn: _Connection, cmd: Doc) -> Doc:
        client = cmd.get("client")
        if isinstance(client, Mapping):
            app = client.get("application")
            if isinstance(app, Mapping):
                conn.app_name = app.get("name")
        conn.backpressure = cmd.get("backpressure")
        legacy = "hello" not in cmd
        writable = self.role in ("standalone", "mongos", "primary")
        doc: Doc = {"ismaster" if legacy else "isWritablePrimary": writable}
        if cmd.get("helloOk"):
            doc["helloOk"] = True
        if self.role == "mongos":
            doc["msg"] = "isdbgrid"
        elif self.role in ("primary", "secondary"):
            doc.update(
                setName=self.set_name or "rs0",
                setVersion=self.set_version,
                hosts=list(self.hosts),
                me=self.endpoint,
                secondary=self.role == "secondary",
            )
            if self.primary:
                doc["primary"] = self.primary
            if self.role == "primary":
                doc["electionId"] = self.election_id
            if self.tags:
                doc["tags"] = dict(self.tags)
        doc.update(
            topologyVersion={"processId": ObjectId(), "counter": 0} if self.role != "mongos" else None,
            maxBsonObjectSize=16 * 1024 * 1024,
            maxMessageSizeBytes=48_000_000,
            maxWriteBatchSize=100_000,
            localTime=bson.datetime.datetime.now(bson.datetime.timezone.utc),
            logicalSessionTimeoutMinutes=self.logical_session_timeout,
            connectionId=conn.id,
            minWireVersion=0,
            maxWireVersion=self.max_wire_version,
            readOnly=False,
            ok=1.0,
        )
        if doc["topologyVersion"] is None:
            del doc["topologyVersion"]
        offered = cmd.get("compression")
        if isinstance(offered, list) and self.compressors:
            doc["compression"] = [c for c in offered if c in self.compressors]
        mechs = cmd.get("saslSupportedMechs")
        if isinstance(mechs, str) and self.users:
            user = mechs.split(".", 1)[-1]
            if user in self.users:
                doc["saslSupportedMechs"] = ["SCRAM-SHA-256", "SCRAM-SHA-1"]
        return doc

    def _sasl_start(self, conn: _Connection, cmd: Doc) -> Doc:
        try:
            conv = Conversation(str(cmd.get("mechanism")), self.users)
            first = conv.start(bytes(cmd["payload"]))
        except (ScramError, KeyError, ValueError) as e:
            return error(18, "AuthenticationFailed", str(e) or "Authentication failed.")
        conn.conversation = conv
        return {"conversationId": 1, "done": False, "payload": bson.Binary(first), "ok": 1.0}

    def _sasl_continue(self, conn: _Connection, cmd: Doc) -> Doc:
        conv = conn.conversation
        if conv is None:
            return error(17, "ProtocolError", "No SASL session state found")
        payload = bytes(cmd.get("payload", b""))
        if conv.credential is not None and conn.user is None and not conn.server_final_sent:
            try:
                final = conv.finish(payload)
            except (ScramError, ValueError) as e:
                conn.conversation = None
                return error(18, "AuthenticationFailed", str(e) or "Authentication failed.")
            conn.server_final_sent = True
            conn.user = conv.user
            return {"conversationId": 1, "done": True, "payload": bson.Binary(final), "ok": 1.0}
        return {"conversationId": 1, "done": True, "payload": bson.Binary(b""), "ok": 1.0}


_CLOSE = object()


class _Connection:
    __slots__ = ("id", "app_name", "backpressure", "user", "conversation", "server_final_sent", "compressor")

    def __init__(self, conn_id: int) -> None:
        self.id = conn_id
        self.app_name: str | None = None
        self.backpressure: Any = None
        self.user: str | None = None
        self.conversation: Conversation | None = None
        self.server_final_sent = False
        self.compressor: str | None = None  # of the message being handled


_CODE_NAMES = {
    462: "IngressRequestRateLimitExceeded",
    91: "ShutdownInProgress",
    189: "PrimarySteppedDown",
    10107: "NotWritablePrimary",
    11600: "InterruptedAtShutdown",
    50: "MaxTimeMSExpired",
    2: "BadValue",
    8000: "AtlasError",
    112: "WriteConflict",
    6: "HostUnreachable",
}


def _code_name(code: int) -> str:
    return _CODE_NAMES.get(code, f"Error{code}")


def _camel(key: str) -> str:
    if "_" not in key:
        return key
    head, *rest = key.split("_")
    return head + "".join(p.upper() if p == "ms" else p.title() for p in rest)  # block_time_ms: blockTimeMS


class TestReplicaSet:
    """``n`` test servers forming a replica set: the first is primary. ``elect(i)`` makes member ``i``
    primary and the others secondaries (as the members would report it after an election)."""

    __test__ = False  # not a pytest class

    def __init__(self, n: int = 3, set_name: str = "rs0", **kwargs: Any) -> None:
        self.set_name = set_name
        self.members = [
            MongoTestServer("primary" if i == 0 else "secondary", set_name=set_name, **kwargs)
            for i in range(n)
        ]

    async def start(self) -> TestReplicaSet:
        for m in self.members:
            await m.start()
        hosts = [m.endpoint for m in self.members]
        for m in self.members:
            m.hosts = hosts
            m.primary = hosts[0]
        return self

    async def stop(self) -> None:
        for m in self.members:
            await m.stop()

    async def __aenter__(self) -> TestReplicaSet:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def elect(self, index: int) -> None:
        new = self.members[index].endpoint
        for i, m in enumerate(self.members):
            m.set_role("primary" if i == index else "secondary", primary=new)
            m.set_version += 1
