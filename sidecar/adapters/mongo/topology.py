"""Monitoring an upstream: a monitor per server sends its own ``hello`` (with ``backpressure: true``) every
``heartbeat`` seconds, or soon after a request saw the server fail; ``members.py`` turns the answers into
which servers may take which command. Requests wait here for a server that fits (an election ending).

``TopologyPicker`` is the engine's endpoint picker for one request: each pick asks the topology which
servers fit now (so a retry after an election goes to the new primary) and lets the upstream's balancer
rank them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ...policy import EndpointPicker
from ...upstream.balancer import Balancer
from .commands import ReadPreference
from .members import Members, ServerState
from .upstream import ConnectFailure, Connection, Settings, connect, hello_command

log = logging.getLogger("sidecar.mongo.topology")

HEARTBEAT = 10.0
#: While no server fits a retry (an election), how often the engine asks the picker again.
SELECTION_POLL = 0.02
INF = math.inf
MIN_HEARTBEAT = 0.5


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
        self.settings = settings
        self.replica_set = replica_set
        self.heartbeat = heartbeat
        self.members = Members(endpoints, replica_set)
        self._monitors: dict[str, asyncio.Task[None]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._changed = asyncio.Event()
        self._first_round = asyncio.Event()
        self._checked: set[str] = set()

    @property
    def servers(self) -> dict[str, ServerState]:
        return self.members.servers

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self, wait: float) -> None:
        for e in self.members.seeds:
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
        seen = self.members.observe(endpoint, reply, err)
        if seen.went_down:
            log.warning("upstream %s: %s is unusable: %s", self.name, endpoint, err)
        for h in seen.discovered:
            self._monitor(h)
        for h in seen.stale:
            self.request_check(h)
        self._checked.add(endpoint)
        if self._checked >= set(self.members.seeds):
            self._first_round.set()
        if seen.changed:
            if seen.primary_changed and self.replica_set is not None:
                log.info("upstream %s: primary is now %s", self.name, self.members.primary)
            self._changed.set()
            self._changed = asyncio.Event()

    # -- selection -------------------------------------------------------------------------------------
    def eligible(self, rp: ReadPreference) -> list[str]:
        return self.members.eligible(rp)

    async def wait_selectable(self, rp: ReadPreference, timeout: float) -> bool:
        """Wait until some server fits ``rp`` (an election ends), at most ``timeout`` seconds."""
        members = self.members
        if members.eligible(rp):
            return True
        self.request_check()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not members.eligible(rp):
            left = end - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
        return True

    def describe_unselectable(self, rp: ReadPreference) -> str:
        return self.members.describe_unselectable(rp, self.name)

    def facts(self) -> dict[str, Any]:
        return self.members.facts()


class TopologyPicker(EndpointPicker):
    """The engine's endpoint picker for one request: the topology says which servers fit, the balancer
    ranks them. Fixed ``candidates`` (a pinned cursor or transaction) bypass the topology. Results are not
    passed on to outlier detection (``observe``): the topology's monitoring already takes unusable members
    out, and a replica set's primary cannot be ejected.

    When no server fits, the engine waits on its own timer (``ready_at``): a first attempt for up to
    ``selection_timeout`` (the driver's server selection loop; the monitor is asked to look at once), a retry
    only where ``retries_wait`` (a replica set electing a primary; a mongos that failed is not waited for)."""

    __slots__ = (
        "balancer",
        "eligible",
        "selection_timeout",
        "retries_wait",
        "check",
        "picked",
        "selecting_since",
    )

    def __init__(
        self,
        balancer: Balancer,
        eligible: Callable[[], list[str]],
        selection_timeout: float = 0.0,
        retries_wait: bool = False,
        check: Callable[[], None] | None = None,
    ) -> None:
        self.balancer = balancer
        self.eligible = eligible
        self.selection_timeout = selection_timeout
        self.retries_wait = retries_wait
        self.check = check  # ask the topology's monitor to look now
        self.picked = False  # an attempt went out: a later wait is a retry's
        self.selecting_since = INF  # when the current wait for a fitting server began (inf: none)

    def pick(
        self,
        now: float,
        rand: Callable[[], float],
        candidates: Sequence[str] | None = None,
        avoid: Collection[str] = (),
        deprioritized: Collection[str] = (),
    ) -> str | None:
        pool = candidates if candidates is not None else self.eligible()
        endpoint = self.balancer.pick(now, rand, pool, avoid, deprioritized)
        if endpoint is not None:
            self.selecting_since = INF
            self.picked = True
        return endpoint

    def ready_at(self, now: float) -> float:
        """No server fits (no primary during an election, every member unknown): the engine looks again in
        ``SELECTION_POLL`` seconds, for up to ``selection_timeout``."""
        if self.picked and not self.retries_wait:
            return INF
        if self.selecting_since == INF:
            self.selecting_since = now
            if self.check is not None:
                self.check()
        if now - self.selecting_since >= self.selection_timeout:
            return INF
        return now + SELECTION_POLL

    def started(self, endpoint: str) -> None:
        self.balancer.started(endpoint)

    def finished(self, endpoint: str) -> None:
        self.balancer.finished(endpoint)

    def penalize(self, endpoint: str, now: float) -> None:
        self.balancer.penalize(endpoint, now)
