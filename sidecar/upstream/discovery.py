"""Every address behind an upstream's name is an endpoint of its own (issue 21; Envoy's STRICT_DNS, with state
that survives a refresh and a view of what was resolved).

Three pieces, each with one owner:

- :class:`TargetWatch`: one target (``orders.prod.svc.cluster.local:8080``, ``srv:...``, or an IP literal,
  which never changes) with its resolution settings, polled on its schedule (``schedule.py``, by a
  ``poller.Poller``) through the process's resolver (``resolver.py``); it keeps the target's record
  (``resolution.TargetState``) and tells its subscribers of every resolution. A reload that keeps a target
  keeps its watch, so its addresses are not resolved anew.
- :class:`UpstreamEndpoints`: one upstream's set, the union of its targets' addresses, pushed to its
  balancer whenever it changes (``Balancer.update``: an address that stays keeps its state, a new one starts
  fresh, one that left drains). Adapters that keep something per address (HTTP pools, gRPC channels) watch
  it: ``left(address)`` when an address leaves the set (no new attempt goes to it from then on) and
  ``drained(address)`` once its last outstanding attempt finished (close what it held). A line is logged
  whenever the set changes.
- :class:`Discovery`: the process's resolver and every watch, started before the sidecar reports ready
  (``App.start``: each target resolved once, successfully or not) and stopped with it; carried over reloads.

Resolution is never on a request's path: a request picks among the addresses known at that moment, and an
upstream with none gets the sidecar's no-endpoint answer at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from .. import parts
from ..config.schema import Config, DnsConfig, ResolverConfig, UpstreamConfig
from .balancer import DRAINING, Balancer
from .poller import Poller
from .resolution import EMPTY, ERROR, OK, Found, Resolution, TargetState, combine, diff, union
from .schedule import RefreshSchedule, RefreshSpec
from .target import STATIC, Target, parse

if TYPE_CHECKING:
    from .resolver import Resolver

log = logging.getLogger("sidecar.dns")

Key = tuple[Target, str, RefreshSpec]


class EndpointWatcher(Protocol):
    """What keeps something per address (an adapter's pools or channels)."""

    def left(self, address: str) -> None:
        """``address`` left the set: no new attempt goes to it (its attempts in flight go on)."""

    def drained(self, address: str) -> None:
        """``address`` left the set and nothing is outstanding on it any more: close what it holds."""


def refresh_spec(dns: DnsConfig) -> RefreshSpec:
    failure = dns.failure_refresh if dns.failure_refresh is not None else min(1.0, dns.refresh)
    return RefreshSpec(dns.refresh, dns.respect_ttl, failure, dns.jitter)


class TargetWatch:
    """One target, resolved on its schedule; ``state`` is its record."""

    def __init__(self, target: Target, family: str, spec: RefreshSpec, discovery: Discovery) -> None:
        self.target = target
        self.family = family
        self.spec = spec
        self.state = TargetState()
        self.subscribers: list[Callable[[TargetWatch, Resolution], None]] = []
        self._discovery = discovery
        self.poller: Poller[Resolution] | None = None
        if target.kind == STATIC:  # never changes: resolved as it is written (a URL's as host:port)
            address = target.name if target.scheme else target.text
            self.state.apply(Resolution(OK, (Found(address, address),)), time.time())
        else:
            schedule = RefreshSchedule(spec)
            self.poller = Poller(
                f"resolving {target.text}",
                self._lookup,
                lambda r: schedule.after(r.result, r.ttl, discovery.rand),
                self._resolved,
                retry=spec.failure_refresh,
            )

    async def _lookup(self) -> Resolution:
        try:
            parts = await self._discovery.resolver.resolve(self.target, self.family)
        except Exception as e:  # a bug (the resolver answers failures as parts): a failed resolution
            log.exception("resolving %s failed unexpectedly", self.target.text)
            return Resolution(ERROR, self.state.endpoints, None, f"internal error: {type(e).__name__}")
        return combine(parts, self.state.endpoints)

    def _resolved(self, resolution: Resolution) -> None:
        self.state.apply(resolution, time.time())
        for subscriber in list(self.subscribers):
            try:
                subscriber(self, resolution)
            except Exception:  # one upstream's bug must not stop the others hearing of it
                log.exception("%s: applying a resolution failed", self.target.text)

    def start(self) -> None:
        if self.poller is not None:
            self.poller.start()

    async def first(self) -> None:
        if self.poller is not None:
            await self.poller.first()

    async def stop(self) -> None:
        if self.poller is not None:
            await self.poller.stop()


class UpstreamEndpoints:
    """One upstream's set of addresses, the union of its targets' (see the module docstring)."""

    def __init__(
        self,
        name: str,
        watches: list[TargetWatch],
        balancer: Balancer,
        counted: Callable[[str, str], None] | None = None,
    ) -> None:
        """``counted(name, result)``: a resolution of one of its targets ended (for the metrics)."""
        self.name = name
        self.watches = watches
        self.balancer = balancer
        self._counted = counted
        self.found: dict[str, Found] = {}
        self.left_names: dict[str, str] = {}  # draining addresses -> the name they were found under
        self.watchers: list[EndpointWatcher] = []
        self._said: dict[int, tuple[str, str]] = {}  # by watch: the result last logged (once, not each time)
        balancer.on_drained = self._drained
        for w in watches:
            w.subscribers.append(self._resolved)
        self._apply(force=True)

    # -- what adapters ask ----------------------------------------------------------------------------------
    def active(self, address: str) -> bool:
        """Is ``address`` in the set (not drained)?"""
        return address in self.found

    def name_of(self, address: str) -> str:
        """The name ``address`` was found under (itself for an IP literal)."""
        f = self.found.get(address)
        if f is not None:
            return f.name
        return self.left_names.get(address, address)

    def watch(self, watcher: EndpointWatcher) -> None:
        if watcher not in self.watchers:
            self.watchers.append(watcher)

    def unwatch(self, watcher: EndpointWatcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)

    @property
    def resolved(self) -> bool:
        """Has every target been resolved once (whatever the result)?"""
        return all(w.state.resolved for w in self.watches)

    def close(self) -> None:
        """A reload replaced this upstream's config: stop following its targets (the next generation does)."""
        for w in self.watches:
            if self._resolved in w.subscribers:
                w.subscribers.remove(self._resolved)
        self.watchers.clear()

    # -- the set --------------------------------------------------------------------------------------------
    def _resolved(self, watch: TargetWatch, resolution: Resolution) -> None:
        if self._counted is not None:
            self._counted(watch.target.name, resolution.result)
        said = (resolution.result, resolution.detail)
        if self._said.get(id(watch), (OK, "")) != said:
            self._said[id(watch)] = said
            if resolution.result == ERROR:
                log.warning(
                    "upstream %s: resolving %s failed (%s): its last addresses are kept; tried again soon",
                    self.name,
                    watch.target.text,
                    resolution.detail,
                )
            elif resolution.result == EMPTY:
                log.warning(
                    "upstream %s: %s resolves to no address (%s)",
                    self.name,
                    watch.target.text,
                    resolution.detail,
                )
            else:
                log.info("upstream %s: %s resolves again", self.name, watch.target.text)
        self._apply()

    def _apply(self, force: bool = False) -> None:
        """Make the set the union of the targets' addresses now (``force``: push it to the balancer even if
        this object saw no change: a new generation of the upstream, its balancer carried over a reload)."""
        before = list(self.balancer.endpoints) if force else list(self.found)
        names = {a: self.name_of(a) for a in before}
        new = union(w.state.endpoints for w in self.watches)
        self.found = {f.address: f for f in new}
        addresses = list(self.found)
        change = diff(before, addresses)
        if not change and not force:
            return
        for a in change.removed:  # told before the balancer, which may find one drained at once
            self.left_names[a] = names.get(a, a)
            for w in list(self.watchers):
                w.left(a)
        for a in change.added:
            self.left_names.pop(a, None)
        self.balancer.update(addresses)
        if change:
            said = []
            if change.added:
                said.append(f"added {', '.join(change.added)}")
            if change.removed:
                said.append(f"removed {', '.join(change.removed)} (draining)")
            log.info(
                "upstream %s: endpoints %s; now %d: %s",
                self.name,
                "; ".join(said),
                len(addresses),
                ", ".join(addresses) or "none",
            )

    def _drained(self, address: str) -> None:
        self.left_names.pop(address, None)
        for w in list(self.watchers):
            try:
                w.drained(address)
            except Exception:
                log.exception("upstream %s: closing what %s held failed", self.name, address)

    # -- reading (/config, metrics) -------------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """For ``/config``: each target (what was written, how it resolves, when, with what result) and each
        address with its state (active, ejected, draining)."""
        targets = []
        for w in self.watches:
            s = w.state
            entry: dict[str, Any] = {"endpoint": w.target.text, "kind": w.target.kind}
            if w.target.kind != STATIC:
                entry.update(
                    family=w.family,
                    result=s.last_result,
                    detail=s.detail or None,
                    last_resolved=_when(s.last_attempt),
                    last_success=_when(s.last_success),
                    ttl=s.ttl,
                    addresses=[f.address for f in s.endpoints],
                )
            targets.append(entry)
        b = self.balancer
        addresses = [
            {"address": a, "name": f.name, "state": b.state(a) or "active"} for a, f in self.found.items()
        ]
        addresses += [
            {"address": a, "name": self.left_names.get(a, a), "state": DRAINING} for a in b.draining
        ]
        return {"targets": targets, "endpoints": addresses}

    def last_success(self) -> Iterable[tuple[str, float]]:
        for w in self.watches:
            if w.target.kind != STATIC and w.state.last_success is not None:
                yield w.target.name, w.state.last_success


def _when(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


class Discovery:
    """The process's resolver and targets (one watch per target and settings), carried over reloads."""

    def __init__(self, resolver: ResolverConfig, rand: Callable[[], float]) -> None:
        self.config = resolver
        self._resolver: Resolver | None = None
        self.rand = rand
        self.watches: dict[Key, TargetWatch] = {}
        self.started = False
        self._stopping: set[asyncio.Task[None]] = set()  # watches a reload let go, stopping

    @property
    def resolver(self) -> Resolver:
        """The resolver, made (and dnspython imported: ``parts.py``) when a name is first looked up: a config
        whose endpoints are all addresses never loads it."""
        if self._resolver is None:
            self._resolver = parts.load("dns")(self.config.nameservers, self.config.timeout)
        return self._resolver

    def reconfigure(self, resolver: ResolverConfig) -> None:
        """A reload changed ``resolver:``: the next lookup of every target asks the new one."""
        if resolver != self.config:
            self.config = resolver
            self._resolver = None

    def targets(self, name: str, config: UpstreamConfig, discovered: bool) -> list[TargetWatch]:
        """The watches of upstream ``name``'s endpoints. Not ``discovered`` (a MongoDB upstream): each as
        written, one static endpoint (a driver's connection resolves it, as before)."""
        if not discovered:
            return [
                self.watch(Target(text, STATIC, text, 0), "auto", RefreshSpec()) for text in config.endpoints
            ]
        dns = config.dns if config.dns is not None else DnsConfig()
        spec = refresh_spec(dns)
        return [self.watch(parse(text), dns.family, spec) for text in config.endpoints]

    def watch(self, target: Target, family: str, spec: RefreshSpec) -> TargetWatch:
        """The watch of ``target`` resolved with ``family`` on ``spec`` (shared: made, and started, once)."""
        if target.kind == STATIC:
            family, spec = "auto", RefreshSpec()
        key = (target, family, spec)
        w = self.watches.get(key)
        if w is None:
            w = self.watches[key] = TargetWatch(target, family, spec, self)
            if self.started:
                w.start()
        return w

    async def prepare(self, config: Config) -> None:
        """Before a reload: the targets it adds are resolved once (so their upstream is not empty when the
        new config takes over)."""
        if not self.started:
            return
        found = config.discovered_upstreams()
        new = [
            w
            for name, uc in config.upstreams.items()
            for w in self.targets(name, uc, name in found)
            if w.poller is not None and not w.state.resolved
        ]
        await asyncio.gather(*(w.first() for w in new))

    def retain(self, used: Iterable[TargetWatch]) -> None:
        """Stop following the targets no upstream uses any more (after a reload)."""
        keep = {id(w) for w in used}
        for key, w in list(self.watches.items()):
            if id(w) not in keep:
                del self.watches[key]
                if w.poller is not None and w.poller.running:
                    task = asyncio.get_running_loop().create_task(w.stop())
                    self._stopping.add(task)
                    task.add_done_callback(self._stopping.discard)

    async def start(self) -> None:
        """Start every watch and wait until each resolved once (a lookup is bounded by the resolver's timeout
        for each question; an SRV name asks two rounds). Past a generous bound, start anyway: what is still
        unresolved keeps ``/readyz`` at 503 until it resolves."""
        self.started = True
        watches = list(self.watches.values())
        for w in watches:
            w.start()
        firsts = [asyncio.ensure_future(w.first()) for w in watches if w.poller is not None]
        if not firsts:  # every endpoint is an address: nothing to wait for
            return
        _, late = await asyncio.wait(firsts, timeout=3 * self.resolver.lifetime + 1.0)
        for f in late:
            f.cancel()
        for w in watches:
            if not w.state.resolved:
                log.warning(
                    "%s: not resolved yet after %.0fs; the sidecar starts without it",
                    w.target.text,
                    3 * self.resolver.lifetime + 1.0,
                )

    async def stop(self) -> None:
        self.started = False
        await asyncio.gather(*(w.stop() for w in self.watches.values()), *self._stopping)
