"""The console: a live page at ``/`` on the admin port, the JSON it is made of, and the tap.

Routes (plain functions, ``routes.py``; documented in docs/console.md and at ``/api``):

- ``/``: the page (``static/console.html`` with a little JavaScript and uPlot, vendored: nothing is fetched
  from anywhere but the admin port itself);
- ``/api/state``: the sidecar now (``console_state.py``);
- ``/api/series?since=N``: the last five minutes, a point a second (``console_series.py``), after sample N;
- ``/api/tap?since=SEQ&limit=N&wait=S&listener=L&upstream=U``: the last requests with their attempts and
  decisions (``telemetry/tap.py``); ``wait`` makes it a long poll: it answers once a record newer than
  ``since`` is there, or after ``wait`` seconds. Reading it arms the tap for :data:`ARMED_FOR` seconds.

Who may look: loopback clients, and those in ``admin.console_allow``; anyone else gets 403 (``/metrics``,
``/config`` and the probes are not the console's and answer as before). Under which name: a request whose
``Host`` is neither an IP address, ``localhost``, nor a name in ``admin.console_hosts`` gets 403 too (DNS
rebinding: a page elsewhere whose name was made to resolve to this address, read by its own scripts). The tap shows no body, no query
string, no header value but the few the sidecar acts on (as numbers: a deadline, a pushback), and its free
text (routes, outcome labels, errors) goes through the configuration's redactor.

Costs: one timer a second (the sampler), and the tap's recording only while someone reads it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .. import __version__
from ..config.effective import redactor
from ..telemetry.tap import CAPACITY, Tap
from . import console_state as st
from .console_series import POINTS, Sampler
from .routes import JSON, AdminRequest, AdminResponse, Route

if TYPE_CHECKING:
    from ..config import Config
    from ..reload import ReloadLog
    from ..services import Services
    from ..telemetry import Telemetry
    from .server import AdminServer

log = logging.getLogger("sidecar.console")

#: Seconds the tap stays armed after its last reader's request.
ARMED_FOR = 30.0
#: The longest a tap request may wait for a record (``wait=``), and the most records one answer holds.
MAX_WAIT = 10.0
MAX_LIMIT = 1000
#: Seconds a woken long poll that found nothing for its filter waits before looking again (a busy sidecar
#: pushes thousands of records a second for other listeners).
RECHECK = 0.1
STATIC = Path(__file__).parent / "static"
#: Files the page is made of: the URL path, the file under ``static/``, its content type.
ASSETS = {
    "/": ("console.html", "text/html; charset=utf-8"),
    "/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
    "/vendor/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/vendor/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "/vendor/uPlot.LICENSE": ("vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
}
#: The page runs only what it was served: scripts and styles from the admin port, fetches to it, no frames.
PAGE_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),
)
API_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"))
#: ``/api``: what each endpoint answers (the same list as docs/console.md).
API = {
    "/api/state": "the sidecar now: listeners, traffic per listener and upstream (last second and totals), "
    "upstreams with their endpoints, budgets and shares, the config generation and last reload",
    "/api/series?since=N": f"the last {POINTS} seconds, a point a second, after sample N (omit for all): "
    "per listener and upstream rps, success, amplification, retries, p50, p99; per endpoint limit, in_use",
    "/api/tap?since=SEQ&limit=N&wait=S&listener=L&upstream=U": f"the last requests (at most {CAPACITY} kept), "
    "newest N after SEQ, each with its attempts, outcomes, decisions and waits; wait=S: a long poll of up "
    "to S seconds; reading it records requests for the next 30 s",
}


class Source(Protocol):
    """What the console reads (``app.App``)."""

    config: Config
    services: Services
    telemetry: Telemetry
    reload_log: ReloadLog
    fleet: Any
    listeners: Sequence[Any]

    def is_ready(self) -> bool: ...


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def allowed(peer: str, networks: Sequence[Network]) -> bool:
    """May the client at ``peer`` (an IP address, as the socket gave it) use the console? Loopback, or an
    address in ``networks`` (``admin.console_allow``). An unknown peer may not."""
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or any(ip in n for n in networks)


def host_allowed(host: str | None, names: frozenset[str]) -> bool:
    """May a request whose ``Host`` header is ``host`` use the console? Without one (no browser sends none),
    by an IP address, by ``localhost`` (or a name under it), or by a name in ``names``
    (``admin.console_hosts``, lowercased). Any other name may be a page elsewhere whose name was made to
    resolve to this address (DNS rebinding): its scripts would read the console as their own origin."""
    if host is None:
        return True
    name = host.lower()
    if name.startswith("["):  # an IPv6 literal, bracketed, with a port or not
        try:
            ipaddress.IPv6Address(name[1 : name.find("]")].split("%", 1)[0])
        except ValueError:
            return False
        return True
    name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    name = name.rstrip(".")
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name == "localhost" or name.endswith(".localhost") or name in names


def _json(value: Any, status: int = 200) -> AdminResponse:
    return AdminResponse(status, json.dumps(value, separators=(",", ":")).encode(), JSON, API_HEADERS)


def _bad(message: str) -> AdminResponse:
    return _json({"error": message}, 400)


def _number(request: AdminRequest, name: str, default: float, low: float, high: float) -> float:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a number, not {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a number, not {raw!r}")
    return min(high, max(low, value))


class Console:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.tap = Tap()
        self.sampler = Sampler()
        self.started_at = time.time()
        self.networks: tuple[Network, ...] = ()
        self.hosts: frozenset[str] = frozenset()
        self.secrets = redactor(source.config)
        self._set_allow(source.config.admin.console_allow, source.config.admin.console_hosts)
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read_at = -math.inf
        self._pushed: asyncio.Future[None] | None = None
        self._closed = False

    # -- life ----------------------------------------------------------------------------------------
    def install(self, admin: AdminServer) -> None:
        for path in ASSETS:
            admin.add(path, self._guard(self._asset))
        admin.add("/api", self._guard(self._index))
        admin.add("/api/state", self._guard(self._state))
        admin.add("/api/series", self._guard(self._series))
        admin.add("/api/tap", self._guard(self._tap))

    def reconfigure(self, config: Config) -> None:
        """A reloaded config: who may look from now on, and its secrets hidden too."""
        self._set_allow(config.admin.console_allow, config.admin.console_hosts)
        self.secrets.merge(redactor(config))

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._tick()

    def stop(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._disarm()
        self._wake()

    def _set_allow(self, cidrs: Sequence[str], hosts: Sequence[str]) -> None:
        self.networks = tuple(ipaddress.ip_network(c) for c in cidrs)
        self.hosts = frozenset(hosts)

    # -- the sampler ---------------------------------------------------------------------------------
    def _tick(self) -> None:
        loop = self._loop
        if loop is None or self._closed:
            return
        self._timer = loop.call_later(1.0, self._tick)
        now = loop.time()
        try:
            self._sample(now)
        except Exception:  # a bug here must not stop the charts for good, nor anything else
            log.exception("console: sampling failed")
        if self.armed and now - self._read_at > ARMED_FOR:
            self._disarm()

    def _sample(self, now: float) -> None:
        services = self.source.services
        metrics = self.source.telemetry.metrics
        pools = [p for up in services.upstreams.values() for p in st.pools(up)]
        refused = [(name, st.refused_so_far(d)) for name, d in services.doors.items()]
        self.sampler.sample(time.time(), now, metrics.pairs(), pools, refused, self.tap.outcomes_taken())

    # -- the tap's arming ----------------------------------------------------------------------------
    @property
    def armed(self) -> bool:
        return self.source.telemetry.tap is not None

    def _arm(self) -> None:
        if self._loop is not None:
            self._read_at = self._loop.time()
        if not self.armed and not self._closed:
            self.source.telemetry.tap = self.tap
            self.sampler.outcomes.clear()

    def _disarm(self) -> None:
        self.source.telemetry.tap = None
        self.tap.clear()  # give the memory back; requests still in flight push into the empty ring

    def _wake(self) -> None:
        fut, self._pushed = self._pushed, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    # -- routes --------------------------------------------------------------------------------------
    def _guard(self, route: Route) -> Route:
        def guarded(request: AdminRequest) -> Any:
            if not allowed(request.peer, self.networks):
                return AdminResponse(
                    403,
                    f"the console answers loopback clients only (this is {request.peer or 'an unknown peer'});"
                    " allow more with admin.console_allow, or use kubectl port-forward\n".encode(),
                )
            if not host_allowed(request.host, self.hosts):
                return AdminResponse(
                    403,
                    f"the console answers requests addressed to an IP address or localhost (this one was to"
                    f" {request.host!r}); name more hosts in admin.console_hosts\n".encode(),
                )
            return route(request)

        return guarded

    def _asset(self, request: AdminRequest) -> AdminResponse:
        name, content_type = ASSETS[request.path]
        return AdminResponse(200, (STATIC / name).read_bytes(), content_type, PAGE_HEADERS)

    def _index(self, request: AdminRequest) -> AdminResponse:
        return _json({"endpoints": API, "docs": "docs/console.md"})

    def _state(self, request: AdminRequest) -> AdminResponse:
        return _json(self.state())

    def state(self) -> dict[str, Any]:
        """The ``/api/state`` document."""
        src = self.source
        loop = self._loop
        now = loop.time() if loop is not None else time.monotonic()
        wall = time.time()
        services = src.services
        metrics = src.telemetry.metrics
        fleet = src.fleet.member if src.fleet is not None else None
        shares = fleet.share_by_labels() if fleet is not None else {}
        throttles = metrics.throttles()
        protocols = {lc.name: lc.protocol for lc in src.config.listeners}
        listener_meters = metrics.listeners()
        listeners = []
        for lst in src.listeners:
            lm = listener_meters.get(lst.name)
            door = services.doors.get(lst.name)
            host, port = lst.address
            listeners.append(
                {
                    "name": lst.name,
                    "protocol": protocols.get(lst.name, ""),
                    "address": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                    "serving": lst.serving,
                    "inflight": lm.inflight if lm is not None else 0,
                    "deadline_received": lm.deadline_received if lm is not None else 0,
                    "rejected": dict(sorted(lm.rejected.items())) if lm is not None else {},
                    "admission": st.door(door, now) if door is not None else None,
                    "refused_per_s": st.finite(self.sampler.refused_last.get(lst.name, math.nan)),
                    "fleet_share": st.finite(shares[("", lst.name)]) if ("", lst.name) in shares else None,
                }
            )
        log_ = src.reload_log
        last = log_.last
        armed = self.armed
        return {
            "sidecar": {
                "version": __version__,
                "ready": src.is_ready(),
                "started_at": round(self.started_at, 3),
                "uptime_s": round(wall - self.started_at, 3),
                "now": round(wall, 3),
            },
            "config": {
                "generation": log_.generation,
                "loaded_at": round(log_.loaded_at, 3),
                "last_reload": None
                if last is None
                else {"at": round(last[0], 3), "result": last[1], "messages": list(last[2])},
            },
            "tap": {"armed": armed, "capacity": self.tap.capacity, "seq": self.tap.seq},
            "listeners": listeners,
            "traffic": st.traffic_view(metrics.pairs(), self.sampler.last.get),
            "upstreams": [
                st.upstream_view(
                    up,
                    now,
                    throttles,
                    shares,
                    self.sampler.recent_outcomes(name) if armed else None,
                    self.secrets.text,
                )
                for name, up in sorted(services.upstreams.items())
            ],
            "fleet": None if fleet is None else {"redis_up": bool(fleet.up), "members": fleet.members},
        }

    def _series(self, request: AdminRequest) -> AdminResponse:
        try:
            since = int(_number(request, "since", -1, -1, 2**62))
        except ValueError as e:
            return _bad(str(e))
        doc = self.sampler.series(since)
        doc["epoch"] = round(self.started_at, 3)
        return _json(doc)

    async def _tap(self, request: AdminRequest) -> AdminResponse:
        try:
            since = int(_number(request, "since", -1, -1, 2**62))
            limit = int(_number(request, "limit", 100, 0, MAX_LIMIT))
            wait = _number(request, "wait", 0.0, 0.0, MAX_WAIT)
        except ValueError as e:
            return _bad(str(e))
        listener = request.query.get("listener") or None
        upstream = request.query.get("upstream") or None
        self._arm()
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        if since > self.tap.seq:  # numbered by another process (the sidecar restarted): start afresh
            since = -1
        while True:
            found, missed, seen = self._after(since, limit, listener, upstream)
            left = until - loop.time()
            if found or limit == 0 or left <= 0 or self._closed:
                break
            since = seen  # records that did not match the filters are not looked at again
            await self._pushed_within(left)
            if listener is not None or upstream is not None:  # coalesce: others' records come by thousands
                await asyncio.sleep(min(RECHECK, max(0.0, until - loop.time())))
        text = self.secrets.text
        return _json(
            {"next": seen, "missed": missed, "armed": self.armed, "records": [r.as_dict(text) for r in found]}
        )

    async def _pushed_within(self, seconds: float) -> None:
        """Until the tap's next record, or ``seconds``, or the console stops."""
        fut = self._pushed
        if fut is None or fut.done():
            fut = self._pushed = asyncio.get_running_loop().create_future()
            self.tap.on_push = self._wake
        await asyncio.wait((fut,), timeout=seconds)  # (never cancels ``fut``: other polls wait on it too)

    def _after(
        self, since: int, limit: int, listener: str | None, upstream: str | None
    ) -> tuple[list[Any], int, int]:
        """The newest ``limit`` records after ``since`` that match the filters; how many were missed (pushed
        out of the ring before being read, or beyond ``limit``); the last sequence number looked at."""
        seen = max(since, self.tap.seq)
        if limit == 0:  # arming only
            return [], 0, seen
        records, missed = self.tap.after(since)
        matching = [
            r
            for r in records
            if (listener is None or r.listener == listener) and (upstream is None or r.upstream == upstream)
        ]
        if len(matching) > limit:
            missed += len(matching) - limit
            matching = matching[len(matching) - limit :]
        return matching, missed, seen


def loopback_url(address: tuple[str, int]) -> str:
    """The console's address for a person on this machine (the admin port may be bound to all addresses)."""
    host, port = address
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
