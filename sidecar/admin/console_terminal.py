"""The console in a terminal: ``sidecar tap`` (a line per request, as it happens, as ``linkerd viz tap``)
and ``sidecar top`` (a table per upstream and endpoint, every second).

Both are clients of a running sidecar's admin port: they read the same JSON as the page (``/api/tap``,
``/api/state``; docs/console.md) with the standard library's HTTP client, and draw it with rich. Nothing here
is imported by ``sidecar run``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..config.units import split_host_port

#: Colours of the outcome classes and endpoint states (the page's, in a terminal's words).
OUTCOME_STYLE = {
    "success": "green",
    "overloaded": "dark_orange",
    "unavailable": "red",
    "reset": "red",
    "connect-failure": "red",
    "timeout": "magenta",
    "fatal": "bold red",
    "cancelled": "grey50",
}
STATE_STYLE = {
    "active": "green",
    "cooldown": "dark_orange",
    "ejected": "red",
    "probing": "magenta",
    "draining": "grey50",
}
STATE_TEXT = {"cooldown": "cooldown (overloaded)"}
SEVERITY = {"draining": 0, "ejected": 1, "probing": 2, "cooldown": 3, "active": 4}
#: How long a tap request may wait for the next record, and the fewest seconds between two requests (at
#: thousands of requests a second, a line each is more than a person reads: the count of those not shown
#: is printed instead).
TAP_WAIT = 5.0
TAP_PERIOD = 0.1


class Unreachable(Exception):
    """The admin port did not answer, or refused the console (the message says which, and what to do)."""


class AdminClient:
    def __init__(self, admin: str, timeout: float = TAP_WAIT + 5.0) -> None:
        """``admin``: ``host:port`` of the sidecar's admin port."""
        host, port = split_host_port(admin)
        self.base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self.timeout = timeout

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        url = f"{self.base}{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace").strip()
            raise Unreachable(f"{self.base} answered {e.code}: {body}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise Unreachable(f"cannot reach the admin port at {self.base}: {reason}") from None
        except ValueError as e:
            raise Unreachable(
                f"{self.base}{path} did not answer JSON ({e}): is this a sidecar's admin port?"
            ) from None


# -- sidecar tap ---------------------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def tap_line(r: Mapping[str, Any]) -> Text:
    """One request: when, where, the route, each attempt (endpoint, outcome, decision, wait), the result."""
    t = Text()
    t.append(datetime.fromtimestamp(r["at"]).strftime("%H:%M:%S.%f")[:-3], "grey62")
    t.append(f" {r['listener']}→{r['upstream']} ", "cyan")
    t.append(r["route"], "bold")
    if "deadline_ms" in r:
        t.append(f" deadline {_ms(r['deadline_ms'])}ms", "grey62")
    for a in r["attempts"]:
        t.append(f"  #{a['n']}{' hedge' if a.get('hedge') else ''} {a['endpoint']} ")
        outcome = a.get("outcome") or ("cancelled" if a.get("cancelled") else "")
        label = outcome + (f" {a['detail']}" if a.get("detail") else "")
        if a.get("cancelled"):
            label = f"cancelled: {a['cancelled']}"
        t.append(label or "in flight", OUTCOME_STYLE.get(outcome, ""))
        if "ms" in a:
            t.append(f" {_ms(a['ms'])}ms")
        if "pushback_ms" in a:
            t.append(f" pushback {_ms(a['pushback_ms'])}ms", "grey62")
        if a.get("decision"):
            t.append(f" → {a['decision']}", "bold")
        if a.get("wait_ms"):
            t.append(f" (wait {_ms(a['wait_ms'])}ms)")
    reason = r.get("reason") or "–"
    t.append(f"  ⇒ {reason}", "bold green" if reason == "success" else "bold red")
    if r.get("status"):
        t.append(f" {r['status']}")
    t.append(f" {_ms(r['total_ms'])}ms")
    if r.get("error"):
        t.append(f" ({r['error']})", "grey62")
    return t


def tap(
    admin: str,
    upstream: str | None = None,
    listener: str | None = None,
    console: Console | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the requests the sidecar at ``admin`` handles, a line each, until interrupted. The exit code:
    0 after Ctrl-C, 1 when the admin port cannot be reached at the start."""
    out = console or Console(highlight=False)
    client = AdminClient(admin)
    where = " ".join(f"{k} {v}" for k, v in (("listener", listener), ("upstream", upstream)) if v)
    params: dict[str, Any] = {"listener": listener, "upstream": upstream, "limit": 20}
    try:
        doc = client.get("/api/tap", params)
    except Unreachable as e:
        out.print(f"sidecar tap: {e}", style="red", markup=False)
        return 1
    out.print(
        f"tapping {client.base}{' (' + where + ')' if where else ''}: a line per request; Ctrl-C stops",
        style="grey62",
        markup=False,
    )
    params["limit"] = 200  # at most 2,000 lines a second: beyond, the count of those not shown
    params["wait"] = TAP_WAIT
    lost = False
    try:
        while True:
            for r in doc["records"]:
                out.print(tap_line(r), soft_wrap=True)  # a long line wraps in the terminal, not in rich
            if doc["missed"]:
                out.print(
                    f"… {doc['missed']} more not shown (too many to list: filter with --upstream, --listener)",
                    style="grey62",
                )
            params["since"] = doc["next"]
            began = time.monotonic()
            try:
                doc = client.get("/api/tap", params)
                if lost:
                    out.print("admin port back; tapping again", style="grey62")
                    lost = False
            except Unreachable as e:
                if not lost:
                    out.print(f"{e}; trying again every second", style="red", markup=False)
                    lost = True
                doc = {"records": [], "missed": 0, "next": params["since"]}
                sleep(1.0)
                continue
            if doc["records"]:
                sleep(max(0.0, TAP_PERIOD - (time.monotonic() - began)))
    except KeyboardInterrupt:
        return 0


# -- sidecar top ---------------------------------------------------------------------------------------
def _rate(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.1f}" if v < 10 else f"{v:.0f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f}%"


def _counts(d: Mapping[str, float] | None, fmt: Callable[[float], str] = str) -> str:
    parts = [f"{k} {fmt(v)}" for k, v in (d or {}).items() if v]
    return " ".join(parts) or "–"


def top_view(state: Mapping[str, Any], rows: int = 20) -> Group:
    """One screen: the traffic per listener and upstream (the last second), then each upstream's budgets and
    endpoints (worst state first, at most ``rows`` each)."""
    sc, cfg = state["sidecar"], state["config"]
    header = Text()
    header.append("retry-sidecar ", "bold")
    header.append("ready" if sc["ready"] else "NOT READY", "green" if sc["ready"] else "bold red")
    header.append(f"  v{sc['version']}  up {sc['uptime_s']:.0f}s  config generation {cfg['generation']}")
    last = cfg.get("last_reload")
    if last:
        header.append(f"  last reload {last['result']}", "red" if last["result"] == "rejected" else "")
    header.append(f"  tap {'recording' if state['tap']['armed'] else 'idle'}", "grey62")
    traffic = Table(
        title="traffic (last second)", title_justify="left", expand=True, pad_edge=False, box=box.SIMPLE_HEAD
    )
    for col in (
        "listener → upstream",
        "req/s",
        "success",
        "att/req",
        "retries/s by cause",
        "hedges/s",
        "thrtl/s",
        "dl-exp/s",
        "p50 ms",
        "p99 ms",
    ):
        traffic.add_column(
            col, justify="left" if col.startswith(("listener", "retries")) else "right", no_wrap=True
        )
    for p in state["traffic"]:
        lf = p["last"] or {}
        traffic.add_row(
            f"{p['listener']} → {p['upstream']}",
            _rate(lf.get("rps")),
            _pct(lf.get("success")),
            "–" if lf.get("amplification") is None else f"{lf['amplification']:.2f}",
            _counts(lf.get("retries_by_cause"), _rate),
            _rate(lf.get("hedges")),
            _rate(lf.get("throttled")),
            _rate(lf.get("deadline_expired")),
            _ms(lf.get("p50")),
            _ms(lf.get("p99")),
        )
    parts: list[Any] = [header, traffic]
    for u in state["upstreams"]:
        facts = [f"{t['kind']} budget {t['tokens']:.1f}/{t['capacity']:.0f}" for t in u["throttles"]]
        if u["retry_budget"]:
            facts.append(
                f"retry_budget {u['retry_budget']['tokens']:.1f} tokens, {u['retry_budget']['refused']} refused"
            )
        if u["fleet_share"] is not None:
            facts.append(f"fleet share {_pct(u['fleet_share'])}")
        if u["ejections"]:
            facts.append("ejections " + _counts(u["ejections"]))
        table = Table(
            title=f"upstream {u['name']}  " + "  ".join(facts),
            title_justify="left",
            expand=True,
            pad_edge=False,
            box=box.SIMPLE_HEAD,
        )
        for col in (
            "endpoint",
            "state",
            "outstanding",
            "limit",
            "in use",
            "queued",
            "probe",
            "recent outcomes (10 s)",
        ):
            table.add_column(
                col,
                justify="right" if col in ("outstanding", "limit", "in use", "queued") else "left",
                no_wrap=True,
            )
        eps = sorted(u["endpoints"], key=lambda e: SEVERITY.get(e["state"], 9))
        for e in eps[:rows]:
            c = e["concurrency"] or {}
            state_text = STATE_TEXT.get(e["state"], e["state"]) + (
                f" {e['left_s']:.1f}s" if e["left_s"] is not None else ""
            )
            outcomes = "(tap idle)" if e["outcomes"] is None else _counts(e["outcomes"])
            table.add_row(
                e["endpoint"] + (f" ({e['name']})" if e.get("name") else ""),
                Text(state_text, STATE_STYLE.get(e["state"], "")),
                str(e["outstanding"]),
                str(c.get("limit", "–")),
                str(c.get("in_use", "–")),
                str(c.get("queued", "–")),
                c.get("probe", "–"),
                outcomes,
            )
        if len(eps) > rows:
            table.add_row(f"… {len(eps) - rows} more", "", "", "", "", "", "", "")
        parts.append(table)
    return Group(*parts)


def top(admin: str, interval: float = 1.0, console: Console | None = None) -> int:
    """Redraw the sidecar at ``admin`` every ``interval`` seconds until interrupted (one frame, then exit,
    when the output is not a terminal). The exit code: 0, or 1 when the admin port cannot be reached."""
    out = console or Console(highlight=False)
    client = AdminClient(admin, timeout=5.0)
    try:
        client.get("/api/tap", {"limit": 0})  # arms the tap: the endpoints' recent outcomes are counted
        state = client.get("/api/state")
    except Unreachable as e:
        out.print(f"sidecar top: {e}", style="red", markup=False)
        return 1
    rows = max(3, (out.height - 12) // max(1, len(state["upstreams"])) - 5)
    if not out.is_terminal:
        out.print(top_view(state, rows))
        return 0
    try:
        with Live(top_view(state, rows), console=out, screen=True, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                try:
                    client.get("/api/tap", {"limit": 0})
                    state = client.get("/api/state")
                    view: Any = top_view(state, rows)
                except Unreachable as e:
                    view = Group(Text(f"{e}; trying again every second", "red"), top_view(state, rows))
                live.update(view, refresh=True)
    except KeyboardInterrupt:
        return 0
