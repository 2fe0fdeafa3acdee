"""What every listener shares: compiled policies, upstream state (balancer, throttles), admission (each
listener's door), telemetry, randomness.

Built once by the composition root (``app.py``) from a validated config. Adapters ask it for a policy by
name and for their listener's door (``door``: the request and connection gates, issue 12); the one way in
(``admit.py``) asks it for a request's new engine ``Call``, bound to an upstream's shared balancer and retry
budget (``begin_request``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .buffer_budget import BufferBudget
from .config import Config, PolicyConfig, UpstreamConfig, retry_policy
from .gates.concurrency import UpstreamConcurrency
from .gates.door import Door
from .policy import (
    BudgetedThrottle,
    Call,
    EndpointPicker,
    OutcomeClass,
    RetryBudget,
    RetryPolicy,
    Throttle,
    ThrottleSpec,
    make_throttle,
)
from .telemetry import RequestObserver, Telemetry
from .telemetry.metrics import Meters
from .upstream.balancer import Balancer
from .upstream.discovery import Discovery, UpstreamEndpoints
from .upstream.outlier import OutlierSpec


def outlier_spec(config: UpstreamConfig) -> OutlierSpec | None:
    od = config.outlier_detection
    if not od.enabled:
        return None
    return OutlierSpec(
        od.consecutive_connect_failures,
        od.consecutive_errors,
        od.consecutive_timeouts,
        od.base_ejection_time,
        od.max_ejection_time,
        od.max_ejection_percent,
    )


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A named policy: the engine's part, and the whole config (protocol classifiers read their keys)."""

    name: str
    engine: RetryPolicy
    config: PolicyConfig


class UpstreamRuntime:
    """One upstream's shared state: its set of endpoints (``endpoints``: every address behind its names,
    ``upstream/discovery.py``) and their balancer, one throttle per throttle setting, the upstream's own
    retry budget (``retry_budget``, consulted on top of each: ``BudgetedThrottle``) and its endpoints'
    execution control (``concurrency``: ``None`` when it limits nothing)."""

    def __init__(
        self,
        name: str,
        config: UpstreamConfig,
        telemetry: Telemetry,
        previous: UpstreamRuntime | None = None,
        discovery: Discovery | None = None,
        discovered: bool = True,
    ) -> None:
        """``previous``: this upstream's state under the config being replaced (a reload): its balancer
        (the state of each address that remains: outstanding attempts, cooldown, ejection) and its execution
        control carry over, reconfigured, so that tickets held and attempts queued are not dropped.
        ``discovered``: its names are resolved to addresses, each an endpoint (``False``: a MongoDB
        upstream's members, as written)."""
        self.name = name
        self.config = config
        self.discovered = discovered
        outliers = outlier_spec(config)
        self.balancer: Balancer
        if previous is not None:
            self.balancer = previous.balancer
            self.balancer.reconfigure(config.overload_cooldown, outliers)
            previous.retire()
        else:
            self.balancer = Balancer([], cooldown=config.overload_cooldown, outliers=outliers)
        metrics = telemetry.metrics
        metrics.watch_outliers(name, self.balancer)
        if discovery is None:
            discovery = Discovery(Config().resolver, random.Random().random)
        dns = metrics.dns(name)
        self.endpoints = UpstreamEndpoints(
            name, discovery.targets(name, config, discovered), self.balancer, dns.count
        )
        metrics.watch_endpoints(name, self.endpoints)
        self._telemetry = telemetry
        self._throttles: dict[ThrottleSpec, Throttle] = {}
        self._by_id: dict[int, tuple[ThrottleSpec, Throttle]] = {}  # hashing a spec costs a Python call
        rb = config.retry_budget
        self.retry_budget: RetryBudget | None = None
        if rb is not None:
            self.retry_budget = RetryBudget(rb.ratio, rb.min_per_second, rb.window)
            telemetry.metrics.watch_retry_budget(name, rb.scope, self.retry_budget)
        cc = config.concurrency
        self.concurrency: UpstreamConcurrency | None = None
        if cc is not None:
            carried = previous.concurrency if previous is not None else None
            if carried is not None:
                carried.reconfigure(cc)
                self.concurrency = carried
            else:
                self.concurrency = UpstreamConcurrency(name, cc)
        telemetry.metrics.watch_concurrency(name, self.concurrency)
        if self.concurrency is not None:
            self.endpoints.watch(_Tickets(self.concurrency))

    def retire(self) -> None:
        """A reload replaced this upstream's config: its set stops following its targets."""
        self.endpoints.close()

    def throttle(self, spec: ThrottleSpec | None) -> Throttle | None:
        """The upstream's budget for ``spec``: one per distinct throttle setting, shared by every policy
        that has it (with the upstream's retry budget on top, when it has one)."""
        if spec is None:
            return self.retry_budget
        known = self._by_id.get(id(spec))
        if known is not None and known[0] is spec:
            return known[1]
        bucket = self._throttles.get(spec)
        if bucket is None:
            inner = make_throttle(spec)
            self._telemetry.metrics.watch_throttle(self.name, spec.kind.value, inner)
            budget = self.retry_budget
            bucket = self._throttles[spec] = inner if budget is None else BudgetedThrottle(inner, budget)
        self._by_id[id(spec)] = (spec, bucket)
        return bucket


class _Tickets:
    """An address that drained gives its ticket pools and prober back (a pod gone for good is not kept)."""

    def __init__(self, concurrency: UpstreamConcurrency) -> None:
        self.concurrency = concurrency

    def left(self, address: str) -> None:
        pass

    def drained(self, address: str) -> None:
        self.concurrency.forget(address)


class Services:
    def __init__(
        self,
        config: Config,
        telemetry: Telemetry,
        rand: Callable[[], float] | None = None,
        previous: Services | None = None,
    ) -> None:
        """``previous``: the services of the config this one replaces (a reload); an upstream whose config
        did not change keeps its state (balancer, cooldowns, retry budgets)."""
        self.config = config
        self.telemetry = telemetry
        self.rand = rand if rand is not None else random.Random().random
        self.policies = {
            name: CompiledPolicy(name, retry_policy(name, pc), pc) for name, pc in config.policies.items()
        }
        #: The resolver and every name being followed, for the process's life (``upstream/discovery.py``).
        self.discovery: Discovery = (
            previous.discovery if previous is not None else Discovery(config.resolver, self.rand)
        )
        self.discovery.reconfigure(config.resolver)
        discovered = config.discovered_upstreams()
        self.upstreams: dict[str, UpstreamRuntime] = {}
        for name, uc in config.upstreams.items():
            kept = previous.upstreams.get(name) if previous is not None else None
            same = kept is not None and kept.config == uc and (name in discovered) == kept.discovered
            self.upstreams[name] = (
                kept
                if same and kept is not None
                else UpstreamRuntime(name, uc, telemetry, kept, self.discovery, name in discovered)
            )
        if previous is not None:
            for name, gone in previous.upstreams.items():
                if name not in self.upstreams:
                    gone.retire()
                    telemetry.metrics.forget_upstream(name)
            self.discovery.retain(w for up in self.upstreams.values() for w in up.endpoints.watches)
        # One budget for the process's life: a reload resizes it, what is held stays accounted.
        self.buffers: BufferBudget = (
            previous.buffers if previous is not None else BufferBudget(config.limits.max_buffered_bytes)
        )
        self.buffers.resize(config.limits.max_buffered_bytes)
        self.doors: dict[str, Door] = {}
        now = time.monotonic()  # the event loop's clock (asyncio's and uvloop's are both CLOCK_MONOTONIC)
        for lc in config.listeners:
            if lc.admission is None:
                continue
            profile = config.admission[lc.admission]
            paths = getattr(lc, "exempt_paths", ())
            door = previous.doors.get(lc.name) if previous is not None else None
            if door is None:
                door = Door(lc.name, lc.admission, profile, now, paths)
                telemetry.metrics.watch_door(lc.name, door)
            else:  # a reload: the same buckets, their balance and their queues, under the new limits
                door.reconfigure(lc.admission, profile, now, paths)
            self.doors[lc.name] = door

    def door(self, listener: str) -> Door | None:
        """The listener's admission (``None``: it admits everything)."""
        return self.doors.get(listener)

    def policy(self, name: str) -> CompiledPolicy:
        return self.policies[name]

    @property
    def resolved(self) -> bool:
        """Has every upstream's every name been resolved once (successfully or not)?"""
        return all(up.endpoints.resolved for up in self.upstreams.values())

    def discovery_view(self) -> dict[str, Any]:
        """Per upstream, its targets and addresses as resolved now (``/config``)."""
        return {name: up.endpoints.view() for name, up in sorted(self.upstreams.items())}

    def upstream(self, name: str) -> UpstreamRuntime:
        return self.upstreams[name]

    def begin_request(
        self,
        policy: CompiledPolicy,
        upstream: UpstreamRuntime,
        *,
        listener: str,
        protocol: str,
        name: str,
        arrival: float,
        received: float | None,
        cap: float | None = None,
        default_timeout: float | None = None,
        attributes: Mapping[str, Any] | None = None,
        parent: Mapping[str, str] | None = None,
        meters: Meters | None = None,
        request_complete: bool = True,
        replayable: bool = True,
        candidates: Sequence[str] | None = None,
        retry_on: Collection[OutcomeClass] | None = None,
        max_attempts: int | None = None,
        picker: EndpointPicker | None = None,
    ) -> tuple[Call, RequestObserver]:
        """What every protocol does before a request's first attempt, once admitted (``admit.py``): its
        deadline, its telemetry, its engine call.

        ``received``: the timeout the client sent (seconds; ``None``: none), counted from ``arrival``;
        ``cap``: a timeout the adapter applies as if the client had sent it (gRPC's service config).
        Without either, the policy's default (or ``default_timeout``) is the sidecar's own bound, counted
        from when the request is complete (``Call``). ``name``, ``attributes``, ``parent``: the request
        span's (see ``Telemetry.request``); the other keywords narrow the call (``new_call``)."""
        timeout = received
        if cap is not None:
            timeout = cap if timeout is None else min(timeout, cap)
        obs = self.telemetry.request(
            listener=listener,
            upstream=upstream.name,
            protocol=protocol,
            name=name,
            attributes=attributes,
            parent=parent,
            meters=meters,
        )
        if received is not None:
            obs.deadline_received(received)
        if not replayable:
            obs.buffer_exceeded()
        call = self.new_call(
            policy,
            upstream,
            deadline=arrival + timeout if timeout is not None else math.inf,
            default_timeout=policy.engine.deadline if default_timeout is None else default_timeout,
            request_complete=request_complete,
            candidates=candidates,
            retry_on=retry_on,
            max_attempts=max_attempts,
            replayable=replayable,
            picker=picker,
        )
        return call, obs

    def new_call(
        self,
        policy: CompiledPolicy,
        upstream: UpstreamRuntime,
        *,
        deadline: float = math.inf,
        default_timeout: float = math.inf,
        request_complete: bool = True,
        candidates: Sequence[str] | None = None,
        retry_on: Collection[OutcomeClass] | None = None,
        max_attempts: int | None = None,
        replayable: bool = True,
        picker: EndpointPicker | None = None,
    ) -> Call:
        """``deadline``: the client's own (absolute; ``inf``: it sent none); ``default_timeout``: the policy's
        bound for a request without one, counted from when the request is complete (see ``Call``).
        ``picker``: choose endpoints some other way than the upstream's balancer (a MongoDB replica set
        picks among the members that fit a read preference, which change with elections)."""
        engine = policy.engine
        return Call(
            engine,
            picker=upstream.balancer if picker is None else picker,
            rand=self.rand,
            deadline=deadline,
            default_timeout=default_timeout,
            request_complete=request_complete,
            throttle=upstream.throttle(engine.throttle),
            candidates=candidates,
            retry_on=retry_on,
            max_attempts=max_attempts,
            replayable=replayable,
        )
