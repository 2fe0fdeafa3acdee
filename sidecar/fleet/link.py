"""The thin driver between a ``FleetMember`` and Redis: one settle (one EVALSHA) every ``lease``, in the
background, never on a request's path.

Nothing waits for Redis longer than ``fleet.redis.timeout``: a settle that takes longer is abandoned and
counts as a failure (the member falls back to its local share at once); the next period tries again, and
redis-py reconnects by itself, so the sidecar rejoins within a lease period or two of Redis answering. A
Redis restart loses the script cache (EVALSHA answers NOSCRIPT: the script is loaded again, inside the same
timeout) and the pools (they start again from empty, as for a new fleet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..config import Config
from ..config.redact import redact_userinfo
from ..config.schema import FleetConfig
from ..gates.door import Door
from ..services import Services
from .member import FleetMember, RateLimitShare, RetryBudgetShare, Share
from .script import SETTLE

log = logging.getLogger("sidecar.fleet")


def fleet_link(config: Config, services: Services) -> FleetLink | None:
    """The settle task for every upstream whose retry budget is fleet-wide and every listener whose request
    rate is (None: there is none)."""
    shares: list[Share] = []
    for name, up in services.upstreams.items():
        rb = up.config.retry_budget
        if up.retry_budget is not None and rb is not None and rb.scope == "fleet":
            shares.append(RetryBudgetShare(name, up.retry_budget, rb.min_per_second))
    for lc in config.listeners:
        door = services.door(lc.name)
        profile = config.admission.get(lc.admission) if lc.admission is not None else None
        rq = profile.requests if profile is not None else None
        if door is not None and rq is not None and rq.scope == "fleet":
            limit = _DoorLimit(door)
            shares.append(RateLimitShare(f"admission:{lc.name}", limit, rq.rate, rq.burst, listener=lc.name))
    if config.fleet is None or not shares:
        return None
    link = FleetLink(config.fleet, shares)
    services.telemetry.metrics.watch_fleet(link.member)
    return link


class _DoorLimit:
    """A listener's door as a fleet-wide rate's local limiter (``member.LeasedLimit``): the settle task
    sets its pace on the event loop's clock."""

    def __init__(self, door: Door) -> None:
        self.door = door

    @property
    def attempted(self) -> int:
        return self.door.attempted

    def pace(self, rate: float, burst: float) -> None:
        self.door.pace(rate, burst, time.monotonic())


def member_id() -> str:
    """A name for this sidecar in the members set: host, process, and a random part (pids repeat)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class FleetLink:
    def __init__(self, config: FleetConfig, shares: list[Share], name: str | None = None) -> None:
        self.config = config
        self.member = FleetMember(
            name or member_id(), config.redis.key_prefix, shares, config.lease, config.fallback_members
        )
        timeout = config.redis.timeout
        self.client = aioredis.Redis.from_url(
            config.redis.url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # the next settle is the retry
            health_check_interval=0,
            single_connection_client=True,
        )
        self.script = self.client.register_script(SETTLE)
        self._task: asyncio.Task[None] | None = None
        self._settled = asyncio.Condition()
        self._crashed = False
        self._stopping = False

    async def start(self) -> None:
        log.info(
            "fleet: settling with %s every %.3fs (timeout %.3fs)",
            redact_userinfo(self.config.redis.url),
            self.config.lease,
            self.config.redis.timeout,
        )
        self._task = asyncio.create_task(self._run(), name="fleet-settle")

    async def stop(self) -> None:
        """End the settle task and close the connection. The task is also told by a flag: a cancellation
        that meets a settle's own timeout can be lost (``asyncio.timeout`` in Python 3.11), and the task
        must end anyway; the wait for it is bounded, and a cancellation of the caller is never swallowed."""
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True
            task.cancel()
            await asyncio.wait([task], timeout=2 * (self.config.redis.timeout + self.config.lease))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.aclose(), self.config.redis.timeout)

    async def wait_for(self, predicate: Callable[[FleetMember], bool]) -> None:
        """Until ``predicate(member)`` holds after a settle (or already does): for tests and tools."""
        async with self._settled:
            await self._settled.wait_for(lambda: predicate(self.member))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        period = self.config.lease
        next_at = loop.time()
        while not self._stopping:
            try:
                await self.settle()
            except Exception:  # a bug here must not end the fleet's task: the next period tries again
                if not self._crashed:
                    log.exception("fleet: settle failed unexpectedly; budgets stay as they are")
                self._crashed = True
            next_at += period
            now = loop.time()
            if next_at < now:  # a stalled loop: do not settle in a burst to catch up
                next_at = now + period
            await asyncio.sleep(next_at - now)

    async def settle(self) -> None:
        """One settle, bounded by the timeout; whatever happens, the member ends up leased or alone."""
        loop = asyncio.get_running_loop()
        member = self.member
        args = member.request()
        started = loop.time()
        try:
            async with asyncio.timeout(self.config.redis.timeout):
                reply = await self.script(keys=member.keys, args=args)
        except (RedisError, OSError, TimeoutError, ValueError) as e:
            message = member.failed(_describe(e), loop.time() - started)
            if message is not None:
                log.warning(message)
        else:
            message = member.settled(reply, loop.time() - started)
            if message is not None:
                log.info(message)
        async with self._settled:
            self._settled.notify_all()


def _describe(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "no answer within fleet.redis.timeout"
    text = str(e) or type(e).__name__
    return text if len(text) < 200 else text[:200] + "..."
