"""The console's page with 1,000 endpoints and 10,000 requests/s of tap: does it stay responsive?

A sidecar (in this process) whose one upstream has 1,000 endpoints, each with its ticket pools; a feed that
reports ``--rate`` requests a second to the sidecar's telemetry (the real observer, meters and tap: each with
one or two attempts to a random endpoint, some overloaded and retried; no socket, so the sidecar's own
traffic does not need the machine's other core); endpoints put in cooldown and ejected as it goes. Debian's
headless Chromium (Selenium, as the tests) keeps the page open for ``--seconds`` while ``sidecar tap``'s
reader streams the tap beside it.

Measured, in the browser: the time each refresh takes to draw (median, p95, max), refreshes per second, the
main thread's long tasks (over 50 ms) per second, and how long a click on "show all 1000 endpoints" takes to
redraw the table; on the sidecar: the size of ``/api/state`` and the time to make it, and the tap records
delivered to the stream. Writes bench/results/console.json.

    .venv/bin/python bench/console.py [--endpoints 1000] [--rate 10000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine, row, show, write  # noqa: E402

from sidecar.app import App  # noqa: E402
from sidecar.config import load_dict  # noqa: E402
from sidecar.policy import Decision, Finish, Outcome, OutcomeClass, Reason, SendAttempt  # noqa: E402
from sidecar.testing.browser import chromium, console_errors  # noqa: E402

LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longTasks.push(e.duration); })
  .observe({type: 'longtask', buffered: true});
"""


def config(endpoints: int) -> dict[str, Any]:
    eps = [f"127.0.{1 + i // 250}.{1 + i % 250}:8080" for i in range(endpoints)]  # never contacted
    return {
        "admin": {"listen": "127.0.0.1:0"},
        "upstreams": {
            "wide": {
                "endpoints": eps,
                "concurrency": {"mode": "probing", "initial": 32},
                "retry_budget": {"ratio": 0.2, "min_per_second": 100},
            }
        },
        "listeners": [{"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "wide"}],
    }


async def feed(app: App, rate: float, stop: asyncio.Event, counted: list[int]) -> None:
    """``rate`` requests a second reported to the telemetry, in batches every 10 ms."""
    rng = random.Random(5)
    telemetry = app.telemetry
    balancer = app.services.upstreams["wide"].balancer
    endpoints = balancer.endpoints
    meters = telemetry.metrics.meters("web", "wide")
    ok = Outcome(OutcomeClass.SUCCESS, detail="200")
    busy = Outcome(OutcomeClass.OVERLOADED, detail="503")
    loop = asyncio.get_running_loop()
    start = trouble = loop.time()
    done = 0
    while not stop.is_set():
        due = int((loop.time() - start) * rate)
        for i in range(done, due):
            obs = telemetry.request(
                listener="web",
                upstream="wide",
                protocol="http",
                name="GET",
                attributes={"url.path": f"/items/{i % 5000}"},
                meters=meters,
            )
            first = endpoints[rng.randrange(len(endpoints))]
            obs.attempt_started(SendAttempt(1, first, 1.0, True))
            if i % 10 == 0:  # a tenth are overloaded, and retried elsewhere
                obs.attempt_ended(1, busy)
                obs.decision(Decision(1, first, OutcomeClass.OVERLOADED, Reason.RETRY, 0.005))
                second = endpoints[rng.randrange(len(endpoints))]
                obs.attempt_started(SendAttempt(2, second, 1.0, True))
                obs.attempt_ended(2, ok)
                obs.decision(Decision(2, second, OutcomeClass.SUCCESS, Reason.SUCCESS))
                obs.finished(Finish(Reason.SUCCESS, 2, ok, 2))
            else:
                obs.attempt_ended(1, ok)
                obs.decision(Decision(1, first, OutcomeClass.SUCCESS, Reason.SUCCESS))
                obs.finished(Finish(Reason.SUCCESS, 1, ok, 1))
            obs.set_attribute("http.response.status_code", 200)
            obs.end()
        done = due
        counted[0], counted[1] = done, loop.time() - start
        now = loop.time()
        if now >= trouble:  # every second: a few endpoints overloaded (cooldown), one failing (ejected)
            trouble = now + 1.0
            for _ in range(5):
                balancer.penalize(endpoints[rng.randrange(len(endpoints))], now)
            e = endpoints[rng.randrange(len(endpoints))]
            for _ in range(5):
                balancer.observe(e, OutcomeClass.UNAVAILABLE, now)
        await asyncio.sleep(0.01)


def stream(admin: str, stop: threading.Event, got: list[int]) -> None:
    """``sidecar tap``'s reader: long polls, at most ten a second, 200 records each."""
    since = -1
    began = time.monotonic()
    while not stop.is_set():
        with urllib.request.urlopen(f"{admin}/api/tap?since={since}&limit=200&wait=5", timeout=30) as r:
            doc = json.loads(r.read())
        since = doc["next"]
        got[0] += len(doc["records"])
        got[1] += doc["missed"]
        got[2] = time.monotonic() - began
        stop.wait(0.1)


def browse(admin: str, seconds: float, endpoints: int) -> dict[str, Any]:
    with chromium(1400, 1200) as d:
        d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": LONG_TASKS})
        d.get(admin + "/")
        began = time.monotonic()
        while d.execute_script("return window.sidecarConsole.polls") < 3:
            time.sleep(0.2)
        d.execute_script("window.sidecarConsole.renderMs = []; window.__longTasks = [];")
        polls0 = d.execute_script("return window.sidecarConsole.polls")
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        stats = d.execute_script("return window.sidecarConsole")
        long_tasks = d.execute_script("return window.__longTasks")
        clicked = time.monotonic()
        d.execute_script("document.querySelector('button.more').click()")
        rows = d.execute_script("return document.querySelectorAll('.upstream tbody tr').length")
        click_ms = (time.monotonic() - clicked) * 1000
        time.sleep(3)  # three refreshes with every row shown
        all_rows = d.execute_script("return window.sidecarConsole.renderMs.slice(-3)")
        errors = console_errors(d)
        d.save_screenshot(str(HERE / "results" / "console-1000.png"))
        return {
            "render": stats["renderMs"],
            "refreshes_per_s": (stats["polls"] - polls0) / elapsed,
            "failures": stats["failures"],
            "long_tasks": long_tasks,
            "elapsed": elapsed,
            "click_ms": click_ms,
            "rows_after_click": rows,
            "render_all_rows": all_rows,
            "errors": errors,
            "load_s": t0 - began,
        }


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


async def one_run(endpoints: int, rate: float, seconds: float) -> dict[str, float]:
    """One sidecar, one feed, one browser: the figures of this run."""
    async with App(load_dict(config(endpoints), {})) as app:
        loop = asyncio.get_running_loop()
        cc = app.services.upstreams["wide"].concurrency
        assert cc is not None and app.admin is not None and app.console is not None
        for e in app.services.upstreams["wide"].balancer.endpoints:
            cc.endpoint(e, loop)  # every endpoint with its pools, as once attempts have gone to all
        host, port = app.admin.address
        admin = f"http://{host}:{port}"
        app.telemetry.tap = app.console.tap
        alone = []
        for _ in range(5):  # before the feed, the browser and the reader share the process (and its GIL)
            t = time.perf_counter()
            json.dumps(app.console.state(), separators=(",", ":"))
            alone.append((time.perf_counter() - t) * 1000)
        stop = asyncio.Event()
        counted = [0, 0.0]
        feeding = asyncio.create_task(feed(app, rate, stop, counted))
        got = [0, 0, 0.0]
        stop_stream = threading.Event()
        streamer = threading.Thread(target=stream, args=(admin, stop_stream, got), daemon=True)
        streamer.start()
        state_ms, state_bytes = [], 0
        try:
            browsing = asyncio.create_task(asyncio.to_thread(browse, admin, seconds, endpoints))
            while not browsing.done():
                t = time.perf_counter()
                body = json.dumps(app.console.state(), separators=(",", ":"))
                state_ms.append((time.perf_counter() - t) * 1000)
                state_bytes = len(body)
                await asyncio.sleep(1.0)
            page = await browsing
        finally:
            stop.set()
            stop_stream.set()
            await feeding
    long = page["long_tasks"]
    if page["errors"]:
        print("browser console errors:", page["errors"][:5])
    return {
        "fed": counted[0] / counted[1],
        "refreshes": page["refreshes_per_s"],
        "draw_median": statistics.median(page["render"]),
        "draw_p95": pct(page["render"], 0.95),
        "draw_max": max(page["render"]),
        "long_per_s": len(long) / page["elapsed"],
        "longest": max(long) if long else 0.0,
        "click": page["click_ms"],
        "rows": page["rows_after_click"],
        "draw_all_max": max(page["render_all_rows"]),
        "state_kib": state_bytes / 1024,
        "state_alone_ms": statistics.median(alone),
        "state_ms": statistics.median(state_ms),
        "streamed": got[0] / got[2],
        "errors": len(page["errors"]),
    }


#: (key, metric, unit, goal, met) of each row; the value is the median of the runs.
ROWS = [
    ("fed", "requests reported to the telemetry", "/s", None, None),
    ("refreshes", "page refreshes", "/s", "≥ 0.9 (one a second)", lambda v: v >= 0.9),
    ("draw_median", "draw time per refresh, median", "ms", None, None),
    ("draw_p95", "draw time per refresh, p95", "ms", "< 150 ms", lambda v: v < 150),
    ("draw_max", "draw time per refresh, max", "ms", None, None),
    ("long_per_s", "long tasks (> 50 ms) on the page's thread", "/s", None, None),
    ("longest", "longest task", "ms", "< 300 ms", lambda v: v < 300),
    ("click", "click 'show all' to every row drawn", "ms", "< 500 ms", lambda v: v < 500),
    ("rows", "endpoint rows after the click", "", None, None),
    ("draw_all_max", "draw time with every row shown, max", "ms", None, None),
    ("state_kib", "/api/state size", "KiB", None, None),
    ("state_alone_ms", "/api/state made (and dumped) in, the process quiet", "ms", None, None),
    ("state_ms", "/api/state made in, feed, browser and reader running", "ms", None, None),
    ("streamed", "tap records streamed to sidecar tap", "/s", None, None),
    ("errors", "browser console errors", "", "none", lambda v: v == 0),
]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=10000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    started = machine()
    (HERE / "results").mkdir(exist_ok=True)
    runs = []
    for i in range(args.runs):
        runs.append(await one_run(args.endpoints, args.rate, args.seconds))
        print(
            f"run {i + 1}/{args.runs}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[-1].items()), flush=True
        )
    columns = ["median"]
    rows = []
    for key, metric, unit, goal, check in ROWS:
        values = [r[key] for r in runs]
        value = round(statistics.median(values), 1)
        spread = {"median": f"{min(values):.1f}..{max(values):.1f}"}
        if goal is None:
            rows.append(row(metric, unit, {"median": value}, spread=spread))
        else:
            assert check is not None
            rows.append(row(metric, unit, {"median": value}, goal, bool(check(value)), spread=spread))
    show(columns, rows)
    notes = [
        f"{args.endpoints} endpoints of one upstream, each with ticket pools; {args.rate:.0f} requests/s reported to "
        "the sidecar's observer (real meters and tap; no sockets) with a tenth overloaded and retried; the tap "
        "streamed beside the page (sidecar tap's reader: 200 records a poll, ten polls a second at most).",
        f"{args.runs} runs of {args.seconds:.0f} s each (median, spread min..max); headless Chromium (Debian) on the "
        "same 2-core machine as the sidecar and the feed; screenshot of the last run: bench/results/console-1000.png.",
    ]
    write(
        "console",
        "The console with 1,000 endpoints and 10,000 requests/s of tap",
        columns,
        rows,
        notes,
        None,
        started,
    )
    return 0 if all(r.get("met", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
