"""What the upstream servers are: a monitor per server sends its own ``hello`` (with ``backpressure: true``)
every ``heartbeat`` seconds, or soon after a request saw a server fail; the topology derives from the answers
which servers may take which command.

Two kinds of upstream:
* a list of routers (mongos) or standalone servers: every server that answers is eligible for everything
  (when none answers, all are, so that a command fails with a clear error rather than waiting);
* a replica set (``replica_set: name``): members are discovered from the ``hosts`` the members report;
  writes and commands go to the primary (the one with the newest ``electionId`` if two claim it), reads to
  the members their ``$readPreference`` allows (mode and tag sets; ``maxStalenessSeconds`` is not applied).

``TopologyPicker`` is the engine's endpoint picker for one request: each pick asks the topology which
servers fit now (so a retry after an election goes to the new primary) and lets the upstream's balancer
rank them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...upstream.balancer import Balancer
from .commands import ReadPreference
from .upstream import ConnectFailure, Connection, Settings, connect, hello_command

log = logging.getLogger("sidecar.mongo.topology")

HEARTBEAT = 10.0
MIN_HEARTBEAT = 0.5
#: What the sidecar says about itself before any upstream has answered.
DEFAULT_FACTS = {
    "maxWireVersion": 21,
    "minWireVersion": 0,
    "logicalSessionTimeoutMinutes": 30,
    "maxBsonObjectSize": 16 * 1024 * 1024,
    "maxMessageSizeBytes": 48_000_000,
    "maxWriteBatchSize": 100_000,
}


@dataclass
class ServerState:
    endpoint: str
    kind: str = "unknown"  # unknown | mongos | standalone | primary | secondary | other
    set_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    election: tuple[int, bytes] = (0, b"")
    hello: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.kind != "unknown"


class Topology:
    def __init__(
        self,
        name: str,
        endpoints: Sequence[str],
        settings: Settings,
        replica_set: str | None = None,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        self.name = name
        self.seeds = list(endpoints)
        self.settings = settings
        self.replica_set = replica_set
        self.heartbeat = heartbeat
        self.servers: dict[str, ServerState] = {e: ServerState(e) for e in self.seeds}
        self._monitors: dict[str, asyncio.Task[None]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._changed = asyncio.Event()
        self._first_round = asyncio.Event()
        self._checked: set[str] = set()
        self.primary: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self, wait: float) -> None:
        for e in self.seeds:
            self._monitor(e)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._first_round.wait()

    async def stop(self) -> None:
        tasks = list(self._monitors.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._monitors.clear()

    def _monitor(self, endpoint: str) -> None:
        if endpoint in self._monitors:
            return
        self.servers.setdefault(endpoint, ServerState(endpoint))
        self._wakeups[endpoint] = asyncio.Event()
        self._monitors[endpoint] = asyncio.get_running_loop().create_task(
            self._watch(endpoint), name=f"mongo-monitor {endpoint}"
        )

    async def _watch(self, endpoint: str) -> None:
        conn: Connection | None = None
        wake = self._wakeups[endpoint]
        loop = asyncio.get_running_loop()
        try:
            while True:
                wake.clear()
                checked_at = loop.time()
                try:
                    if conn is None or conn.closed:
                        conn = await connect(endpoint, self.settings)
                        reply = dict(conn.hello)
                    else:
                        async with asyncio.timeout(self.settings.connect_timeout):
                            reply = dict(await conn.command(hello_command(handshake=False)))
                    self._update(endpoint, reply, None)
                except (ConnectFailure, OSError, asyncio.IncompleteReadError, TimeoutError, Exception) as e:
                    if conn is not None:
                        conn.close()
                        conn = None
                    self._update(endpoint, None, str(e) or type(e).__name__)
                up = self.servers[endpoint].up
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.heartbeat if up else min(self.heartbeat, 1.0)):
                        await wake.wait()
                # Checks requested by failing requests come no closer than MIN_HEARTBEAT apart.
                await asyncio.sleep(max(0.0, checked_at + MIN_HEARTBEAT - loop.time()))
        finally:
            if conn is not None:
                conn.close()

    def request_check(self, endpoint: str | None = None) -> None:
        """Check now (after a request saw a server fail or say "not primary")."""
        for e, ev in self._wakeups.items():
            if endpoint is None or e == endpoint:
                ev.set()

    def mark_unknown(self, endpoint: str, reason: str) -> None:
        if endpoint in self.servers:
            self._update(endpoint, None, reason)
            self.request_check()

    # -- state -----------------------------------------------------------------------------------------
    def _update(self, endpoint: str, reply: dict[str, Any] | None, err: str | None) -> None:
        s = self.servers[endpoint]
        before = (s.kind, self.primary)
        if reply is None or reply.get("ok") != 1:
            if s.kind != "unknown":
                log.warning("upstream %s: %s is unusable: %s", self.name, endpoint, err)
            s.kind, s.error, s.hello = "unknown", err or "hello failed", {}
        else:
            s.hello, s.error = reply, None
            s.kind = _kind(reply)
            s.set_name = reply.get("setName")
            tags = reply.get("tags")
            s.tags = {str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else {}
            eid = reply.get("electionId")
            s.election = (int(reply.get("setVersion", 0) or 0), bytes(eid.binary) if eid is not None else b"")
            if self.replica_set is not None:
                if s.set_name != self.replica_set:
                    s.kind = "other"
                    s.error = f"replica set name {s.set_name!r}, expected {self.replica_set!r}"
                else:
                    for h in list(reply.get("hosts") or []) + list(reply.get("passives") or []):
                        if isinstance(h, str):
                            self._monitor(h)
        self._choose_primary()
        self._checked.add(endpoint)
        if self._checked >= set(self.seeds):
            self._first_round.set()
        if (s.kind, self.primary) != before:
            if before[1] != self.primary and self.replica_set is not None:
                log.info("upstream %s: primary is now %s", self.name, self.primary)
            self._changed.set()
            self._changed = asyncio.Event()

    def _choose_primary(self) -> None:
        claims = [s for s in self.servers.values() if s.kind == "primary"]
        if not claims:
            self.primary = None
            return
        best = max(claims, key=lambda s: s.election)
        for s in claims:
            if s is not best:  # a stale primary that has not noticed the election yet
                s.kind = "unknown"
                s.error = f"stale primary (newer election on {best.endpoint})"
                self.request_check(s.endpoint)
        self.primary = best.endpoint

    # -- selection -------------------------------------------------------------------------------------
    def eligible(self, rp: ReadPreference) -> list[str]:
        if self.replica_set is None:
            up = [e for e, s in self.servers.items() if s.up and s.kind != "other"]
            return up or list(self.seeds)
        primary = [self.primary] if self.primary else []
        if rp.mode == "primary":
            return primary
        secondaries = self._tagged([s for s in self.servers.values() if s.kind == "secondary"], rp)
        if rp.mode == "secondary":
            return secondaries
        if rp.mode == "secondaryPreferred":
            return secondaries or primary
        if rp.mode == "primaryPreferred":
            return primary or secondaries
        members = [s for s in self.servers.values() if s.kind in ("primary", "secondary")]
        return self._tagged(members, rp)  # nearest

    @staticmethod
    def _tagged(members: list[ServerState], rp: ReadPreference) -> list[str]:
        if not rp.tag_sets:
            return [s.endpoint for s in members]
        for tag_set in rp.tag_sets:
            hits = [s.endpoint for s in members if all(s.tags.get(k) == v for k, v in tag_set)]
            if hits:
                return hits
        return []

    async def wait_selectable(self, rp: ReadPreference, timeout: float) -> bool:
        """Wait until some server fits ``rp`` (an election ends), at most ``timeout`` seconds."""
        if self.eligible(rp):
            return True
        self.request_check()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self.eligible(rp):
            left = end - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
        return True

    def describe_unselectable(self, rp: ReadPreference) -> str:
        states = ", ".join(
            f"{e}: {s.kind}" + (f" ({s.error})" if s.error else "") for e, s in self.servers.items()
        )
        target = "a primary" if rp.primary_only else f"a server for read preference {rp.describe()}"
        return f"no {target} in upstream {self.name!r} [{states}]"

    # -- what the sidecar says about itself ------------------------------------------------------------
    def facts(self) -> dict[str, Any]:
        """The upstream's limits as the sidecar's own ``hello`` reports them: the lowest value wins."""
        answered = [s.hello for s in self.servers.values() if s.up and s.hello]
        out = dict(DEFAULT_FACTS)
        if not answered:
            return out
        for key in out:
            values = [h[key] for h in answered if isinstance(h.get(key), int | float)]
            if values:
                out[key] = int(min(values))
        if any(h.get("logicalSessionTimeoutMinutes") is None for h in answered):
            out["logicalSessionTimeoutMinutes"] = None
        return out


def _kind(reply: dict[str, Any]) -> str:
    if reply.get("msg") == "isdbgrid":
        return "mongos"
    if reply.get("setName") is not None:
        if reply.get("isWritablePrimary") or reply.get("ismaster"):
            return "primary"
        if reply.get("secondary"):
            return "secondary"
        return "other"
    return "standalone"


class TopologyPicker:
    """The engine's endpoint picker for one request: the topology says which servers fit, the balancer
    ranks them. Fixed ``candidates`` (a pinned cursor or transaction) bypass the topology."""

    __slots__ = ("balancer", "eligible")

    def __init__(self, balancer: Balancer, eligible: Callable[[], list[str]]) -> None:
        self.balancer = balancer
        self.eligible = eligible

    def pick(
        self,
        now: float,
        rand: Callable[[], float],
        candidates: Sequence[str] | None = None,
        avoid: Collection[str] = (),
        deprioritized: Collection[str] = (),
    ) -> str | None:
        pool = candidates if candidates is not None else self.eligible()
        return self.balancer.pick(now, rand, pool, avoid, deprioritized)

    def started(self, endpoint: str) -> None:
        self.balancer.started(endpoint)

    def finished(self, endpoint: str) -> None:
        self.balancer.finished(endpoint)

    def penalize(self, endpoint: str, now: float) -> None:
        self.balancer.penalize(endpoint, now)
