"""Monitoring an upstream: a monitor per server sends its own ``hello`` (with ``backpressure: true``) every
``heartbeat`` seconds, or soon after a request saw the server fail; ``members.py`` turns the answers into
which servers may take which command.

A request's endpoint picker (``upstream.balancer.FittingPicker``) asks :meth:`Topology.eligible` which
servers fit it now (so a retry after an election goes to the new primary), and the upstream's balancer ranks
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from .commands import ReadPreference
from .members import Members, ServerState
from .upstream import ConnectFailure, Connection, Settings, connect, hello_command

log = logging.getLogger("sidecar.mongo.topology")

HEARTBEAT = 10.0
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
        self._first_round = asyncio.Event()
        self._checked: set[str] = set()
        self._started = False

    @property
    def servers(self) -> dict[str, ServerState]:
        return self.members.servers

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self, wait: float) -> None:
        self._started = True
        if not self.members.seeds:
            return  # a mongodb+srv:// name not resolved yet: reseed() starts the monitors
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
                state = self.servers.get(endpoint)
                if state is None:
                    return  # left the seed list
                up = state.up
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.heartbeat if up else min(self.heartbeat, 1.0)):
                        await wake.wait()
                # Checks requested by failing requests come no closer than MIN_HEARTBEAT apart.
                await asyncio.sleep(max(0.0, checked_at + MIN_HEARTBEAT - loop.time()))
        finally:
            if conn is not None:
                conn.close()

    def reseed(self, seeds: list[str]) -> list[str]:
        """A new seed list (``seeds.py``): new servers are monitored, the ones that left stop being
        monitored (and are returned: their pools are closed by the listener)."""
        gone = self.members.reseed(seeds)
        for e in gone:
            task = self._monitors.pop(e, None)
            if task is not None:
                task.cancel()
            self._wakeups.pop(e, None)
        if self._started:
            for e in seeds:
                self._monitor(e)
        return gone

    def set_replica_set(self, name: str) -> None:
        """Before ``start``: the replica set a mongodb+srv:// name's TXT record gave."""
        self.replica_set = name
        self.members.replica_set = name

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
        if endpoint not in self.servers:  # a router that left (reseed) while it was being checked
            return
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
        if seen.primary_changed and self.replica_set is not None:
            log.info("upstream %s: primary is now %s", self.name, self.members.primary)

    # -- selection -------------------------------------------------------------------------------------
    def eligible(self, rp: ReadPreference) -> list[str]:
        return self.members.eligible(rp)

    def describe_unselectable(self, rp: ReadPreference) -> str:
        return self.members.describe_unselectable(rp, self.name)

    def facts(self) -> dict[str, Any]:
        return self.members.facts()
