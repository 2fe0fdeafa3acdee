"""The door: one listener's admission at run time (issue 12), the owner of its two token buckets.

A listener with ``admission: PROFILE`` gets one :class:`Door` (built and kept across reloads by
``Services``). It holds the profile's buckets (``sidecar.admission.RateLimiter``, the pure core) and answers
the adapters' two questions:

- **may this request go ahead?** (:meth:`Door.request`), asked once its whole head is read and before any
  upstream work: admitted now, refused now (a :class:`~sidecar.admission.Refusal` the adapter answers in its
  protocol), or queued on a borrowed token (a :class:`Wait` until ``at``, never past ``max_wait`` nor the
  request's deadline: the bucket refuses at once when it would be). Every adapter asks through one step,
  ``sidecar/admit.py``; the callback-based HTTP adapter waits on the loop's shared timer heap, the coroutine
  adapters ``await`` :meth:`Door.wait`. A queued request whose client goes away is interrupted: its borrowed
  token goes back.
- **may this connection be served?** (:meth:`Door.connection`, asked at accept by ``sidecar/gates/accept_gate.py``).

Exempt, and counted as exempted: requests from ``exempt_cidrs``, and operations the adapter knows to be
exempt (MongoDB hello, ping, killCursors, ...; gRPC health; HTTP ``exempt_paths``); connections from
``bypass_cidrs``. In ``shadow`` mode every decision is made and counted, and everything is admitted at once:
a would-be rejection is counted (labelled ``shadow="true"``), a would-be wait is not waited but stays in the
bucket's queue until its token is due (settled at the next decision), so that the queue fills and empties
as it would have.

The clock is the event loop's (``loop.time()``); the door itself never reads it: callers pass ``now``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..admission import Limiter, RateLimiter, RatePolicy, Refusal
from ..config.schema import AdmissionConfig, ConnectionLimitConfig, RequestLimitConfig
from ..telemetry.metrics import Histogram

log = logging.getLogger("sidecar.admission")

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Queue times are short (``max_wait``: 100 ms by default): finer buckets than request latencies.
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_CACHE_LIMIT = 4096
#: A share of nothing still refills (a bucket's rate must be positive): one token in about 30 years.
_LEAST_RATE = 1e-9


@dataclass(frozen=True, slots=True)
class Wait:
    """A queued request or connection: admitted at ``at`` (call :meth:`Door.admitted`), unless its client
    goes first (:meth:`Door.interrupted`). ``bucket``: the one it borrowed from (a reload may replace the
    door's; the wait ends on its own)."""

    bucket: RateLimiter
    waiter: int
    at: float
    since: float
    limiter: Limiter


class Door:
    """One listener's request gate and connection gate, under one admission profile."""

    def __init__(
        self,
        listener: str,
        profile: str,
        config: AdmissionConfig,
        now: float,
        exempt_paths: Sequence[str] = (),
    ) -> None:
        self.listener = listener
        self.owner = f"listener {listener!r}"
        self.profile = ""
        self.fleet = False  # requests.scope fleet: the bucket's rate is this sidecar's lease of the fleet's
        self.shadow = False
        self.requests: RateLimiter | None = None
        self.connections: RateLimiter | None = None
        self.policy: RatePolicy | None = None
        self.connection_policy: RatePolicy | None = None
        self.queue_seconds = {Limiter.REQUESTS: Histogram(QUEUE_BUCKETS), Limiter.CONNECTIONS: Histogram(QUEUE_BUCKETS)}
        self._exempt: tuple[IpNetwork, ...] = ()
        self._bypass: tuple[IpNetwork, ...] = ()
        self._exempt_seen: dict[str, bool] = {}
        self._bypass_seen: dict[str, bool] = {}
        self._paths: frozenset[str] = frozenset()
        self._prefixes: tuple[str, ...] = ()
        self.exemptions = False
        self._shadow_waits: deque[Wait] = deque()  # would-be waits (shadow mode), in the order they are due
        self.reconfigure(profile, config, now, exempt_paths)

    def reconfigure(
        self, profile: str, config: AdmissionConfig, now: float, exempt_paths: Sequence[str] = ()
    ) -> None:
        """A (re)loaded profile. A bucket that stays keeps its balance and its queue (requests already
        queued keep their place and time: ``RateLimiter.reconfigure``/``set_queue``); a bucket the profile
        no longer has is dropped (its queued requests still end on it). A fleet-wide request rate keeps the
        rate of its current lease (the settle task sets it: :meth:`lease`, :meth:`alone`)."""
        self.profile = profile
        self._settle_shadow(math.inf)  # would-be waits end with the mode (or the bucket) they began under
        self.shadow = config.shadow
        rq = config.requests
        self.fleet = rq is not None and rq.scope == "fleet"
        leased = self.requests if self.fleet else None
        self.requests = _bucket(self.requests, rq, now, keep_rate=leased is not None)
        self.connections = _bucket(self.connections, config.connections, now)
        rq, cn = config.requests, config.connections
        self.policy = RatePolicy.of(profile, rq.rate, rq.burst) if rq is not None else None
        self.connection_policy = RatePolicy.of(profile, cn.rate, cn.burst) if cn is not None else None
        self._exempt = tuple(ipaddress.ip_network(c) for c in (rq.exempt_cidrs if rq is not None else ()))
        self._bypass = tuple(ipaddress.ip_network(c) for c in (cn.bypass_cidrs if cn is not None else ()))
        self._exempt_seen.clear()
        self._bypass_seen.clear()
        self._paths = frozenset(p for p in exempt_paths if not p.endswith("*"))
        self._prefixes = tuple(p[:-1] for p in exempt_paths if p.endswith("*"))
        #: any exempt address or path at all (the HTTP adapter skips decoding them when there is none)
        self.exemptions = bool(self._exempt or self._paths or self._prefixes)

    # -- requests --------------------------------------------------------------------------------------
    def client_exempt(self, host: str) -> bool:
        """Is a request from ``host`` (an IP address, as the socket gave it) never limited?"""
        return _member(host, self._exempt, self._exempt_seen)

    def path_exempt(self, path: str) -> bool:
        """Is an HTTP request to ``path`` (without its query) never limited (``exempt_paths``)?"""
        return path in self._paths or (bool(self._prefixes) and path.startswith(self._prefixes))

    def exempt(self) -> None:
        """Count a request that was never limited (exempt address, operation or path)."""
        if self.requests is not None:
            self.requests.exempt()

    def request(self, now: float, deadline: float = math.inf) -> Refusal | Wait | None:
        """A request whose head was just read: ``None`` (go ahead), a refusal to answer, or a wait.
        ``deadline``: the request's own (loop time; ``inf``: none)."""
        bucket = self.requests
        if bucket is None or (not self._shadow_waits and bucket.take(now)):
            return None
        return self._decide(bucket, Limiter.REQUESTS, now, deadline, self.policy)

    async def wait(self, wait: Wait) -> None:
        """For coroutine adapters: wait until a queued request's token is due (``wait.at``), then admit it.
        Cancelled while it waits (the client went away), the token goes back."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        handle = loop.call_at(wait.at, _wake, woken)
        try:
            await woken
        except asyncio.CancelledError:
            handle.cancel()
            self.interrupted(wait)
            raise
        self.admitted(wait, loop.time())

    # -- a fleet-wide request rate (issue 15: sidecar/fleet/member.py RateLimitShare) -----------------------
    @property
    def attempted(self) -> int:
        """Requests that asked the request gate so far (the demand a fleet settle reports)."""
        return self.requests.stats.attempted if self.requests is not None else 0

    def pace(self, rate: float, burst: float, now: float) -> None:
        """This sidecar's part of the fleet's rate until the next settle: the bucket refills at ``rate``
        and holds ``burst`` seconds of it; what it holds, and what queued requests borrowed, carries over."""
        bucket = self.requests
        if bucket is not None:
            bucket.reconfigure(now, max(rate, _LEAST_RATE), burst)

    # -- connections -----------------------------------------------------------------------------------
    def bypass(self, host: str) -> bool:
        """Is a connection from ``host`` never limited (``bypass_cidrs``)?"""
        return _member(host, self._bypass, self._bypass_seen)

    def connection(self, host: str, now: float) -> Refusal | Wait | None:
        """A connection just accepted from ``host``: ``None`` (serve it), a refusal (close it at once), or a
        wait (hold it unread until ``at``)."""
        bucket = self.connections
        if bucket is None:
            return None
        if self.bypass(host):
            bucket.exempt()
            return None
        return self._decide(bucket, Limiter.CONNECTIONS, now, math.inf, self.connection_policy)

    # -- the end of a wait -----------------------------------------------------------------------------
    def admitted(self, wait: Wait, now: float) -> None:
        wait.bucket.admit_queued(wait.waiter)
        self.queue_seconds[wait.limiter].observe(max(0.0, now - wait.since))

    def interrupted(self, wait: Wait) -> None:
        wait.bucket.interrupt(wait.waiter)

    # -- shared ----------------------------------------------------------------------------------------
    def _decide(
        self, bucket: RateLimiter, limiter: Limiter, now: float, deadline: float, policy: RatePolicy | None
    ) -> Refusal | Wait | None:
        if self._shadow_waits:
            self._settle_shadow(now)
        d = bucket.acquire(now, deadline)
        if d.admitted:
            return None
        if d.queued:
            wait = Wait(bucket, d.waiter, d.at, now, limiter)
            if self.shadow:  # it would have waited: it goes on now, its place in the queue is kept till due
                self._shadow_waits.append(wait)
                return None
            return wait
        if self.shadow:
            return None
        return Refusal.of(limiter, d, now, owner=self.owner, policy=policy)


    def _settle_shadow(self, now: float) -> None:
        waits = self._shadow_waits
        while waits and waits[0].at <= now:
            wait = waits.popleft()
            self.admitted(wait, wait.at)
        if math.isinf(now):
            while waits:
                wait = waits.popleft()
                self.admitted(wait, wait.at)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _bucket(
    old: RateLimiter | None,
    config: RequestLimitConfig | ConnectionLimitConfig | None,
    now: float,
    keep_rate: bool = False,
) -> RateLimiter | None:
    if config is None:
        return None
    max_wait = config.max_wait if isinstance(config, RequestLimitConfig) else math.inf
    if old is None:
        return RateLimiter(config.rate, config.burst, now, config.max_queue, max_wait)
    if not keep_rate:
        old.reconfigure(now, config.rate, config.burst)
    old.set_queue(config.max_queue, max_wait)
    return old


def _member(host: str, nets: tuple[IpNetwork, ...], seen: dict[str, bool]) -> bool:
    if not nets:
        return False
    known = seen.get(host)
    if known is None:
        try:
            addr = ipaddress.ip_address(host.partition("%")[0])  # an IPv6 scope id is not part of it
        except ValueError:
            known = False  # not an IP address (a Unix socket): never exempt
        else:
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            known = any(addr in net for net in nets)
        if len(seen) >= _CACHE_LIMIT:
            seen.clear()
        seen[host] = known
    return known
