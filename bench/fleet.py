"""Fleet-wide retry budget (issue 15): retry amplification of 10 sidecars in an outage, local budgets against
one fleet budget on Redis; and what the fleet machinery adds to a proxied request's p50.

* outage (live): 10 ``sidecar run`` processes in front of one test upstream that answers every request 503,
  a steady open-loop load spread evenly over them, for ``--seconds``. Each upstream has
  ``retry_budget: {ratio: 0.2, min_per_second: 10, window: 10s}``, ``scope: local`` in one run and
  ``scope: fleet`` in the other (the policy is http-default without its own A6 throttle, so that the budget
  alone decides). Retries are counted at the upstream (``x-sidecar-attempt`` > 1). The fleet's bound is
  0.2 x requests + 10/s x seconds + 10 (+ 10 before the first settle); local budgets allow each sidecar a
  floor of its own: about 10x the floor.
* rate under skew (live): the same 10 sidecars in front of an upstream answering 200, one fleet-wide request
  rate (``admission: {requests: {rate: --fleet-rate, burst: 1s, scope: fleet}}``), offered twice that rate
  with 80 % of it to one sidecar (the rest spread over the other nine). After a warm-up that spends the banked
  bursts, the requests the upstream receives per second are the fleet's admitted rate (goal: within 10 % of
  the rate), and the busy sidecar's part of them shows the shares following demand.
* p50 (live): one sidecar in front of nginx, one keep-alive connection, sequential GETs; with and without a
  fleet-scoped retry budget (Redis up), alternated ``--rounds`` times; the medians' difference.

    .venv/bin/python bench/fleet.py [--seconds 60] [--rate 100] [--rounds 3] [--fleet-rate 200]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from common import free_port, machine, row, say, show, wait_port, write
from http_overhead import ROOT, nginx_conf, start, stop

from sidecar.testing.http_upstream import FaultyUpstream
from sidecar.testing.redis_server import RedisServer

SIDECARS = 10
RATIO, FLOOR = 0.2, 10.0
SIDECAR = str(ROOT / ".venv" / "bin" / "sidecar")


def sidecar_yaml(
    port: int,
    admin: int,
    upstream: str,
    redis_url: str,
    scope: str | None,
    prefix: str,
    fleet_rate: float | None = None,
) -> str:
    budget = (
        f", retry_budget: {{scope: {scope}, ratio: {RATIO}, min_per_second: {FLOOR}, window: 10s}}"
        if scope
        else ""
    )
    door = profile = ""
    if fleet_rate is not None:
        door = ", admission: front"
        profile = f"admission:\n  front: {{requests: {{rate: {fleet_rate:g}, burst: 1s, scope: fleet}}}}\n"
    return f"""admin: {{listen: "127.0.0.1:{admin}"}}
fleet:
  redis: {{url: "{redis_url}", timeout: 20ms, key_prefix: "{prefix}"}}
  lease: 200ms
  fallback_members: {SIDECARS}
policies:
  p: {{extends: http-default, throttle: null}}
upstreams:
  api: {{endpoints: ["{upstream}"]{budget}}}
listeners:
  - {{name: web, protocol: http, listen: "127.0.0.1:{port}", upstream: api, policy: p{door}}}
{profile}"""


def launch(tmp: Path, name: str, text: str, port: int) -> subprocess.Popen:
    conf = tmp / f"{name}.yaml"
    conf.write_text(text)
    proc = subprocess.Popen(
        [SIDECAR, "run", "-c", str(conf), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_port(port, proc, timeout=60)
    return proc


def scrape(admin: int, name: str) -> float:
    with socket.create_connection(("127.0.0.1", admin)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", data.decode(), re.M)
    return float(m.group(1)) if m else float("nan")


async def load(ports: list[int], rate: float, seconds: float, ok: dict[int, int] | None = None) -> int:
    """Open-loop GETs at ``rate`` per second for ``seconds``, spread over ``ports`` in turn (a port listed
    more often gets more); the number sent. ``ok``: counts the 200 answers per port."""
    loop = asyncio.get_running_loop()
    sent = 0
    pending: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def one(port: int) -> None:
            async with session.get(f"http://127.0.0.1:{port}/") as resp:
                await resp.read()
                if ok is not None and resp.status == 200:
                    ok[port] = ok.get(port, 0) + 1

        start_at = loop.time()
        while (now := loop.time()) < start_at + seconds:
            due = int((now - start_at) * rate) + 1
            while sent < due:
                t = asyncio.create_task(one(ports[sent % len(ports)]))
                pending.add(t)
                t.add_done_callback(pending.discard)
                sent += 1
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*pending, return_exceptions=True)
    return sent


async def outage(tmp: Path, redis: RedisServer, scope: str, rate: float, seconds: float) -> dict[str, float]:
    async with FaultyUpstream(fail_rate=1.0, keep_records=True) as up:
        ports = [free_port() for _ in range(SIDECARS)]
        admins = [free_port() for _ in range(SIDECARS)]
        prefix = f"bench-{scope}-{time.time_ns()}:"
        procs = []
        try:
            for i, (p, a) in enumerate(zip(ports, admins, strict=True)):
                text = sidecar_yaml(p, a, up.endpoint, redis.url, scope, prefix)
                procs.append(await asyncio.to_thread(launch, tmp, f"{scope}{i}", text, p))
            if scope == "fleet":  # every sidecar has settled once
                while min([scrape(a, "sidecar_fleet_members") for a in admins]) < SIDECARS:
                    await asyncio.sleep(0.2)
            up.received.clear()
            t0 = time.monotonic()
            sent = await load(ports, rate, seconds)
            elapsed = time.monotonic() - t0
            up_flags = [scrape(a, "sidecar_fleet_redis_up") for a in admins] if scope == "fleet" else []
        finally:
            for p in procs:
                stop(p)
    retries = sum(1 for s in up.received if (s.attempt or 1) > 1)
    firsts = sum(1 for s in up.received if (s.attempt or 1) == 1)
    return {
        "requests": float(sent),
        "first_attempts_seen": float(firsts),
        "retries": float(retries),
        "seconds": elapsed,
        "retries_per_request": retries / max(1, sent),
        "redis_up": float(sum(up_flags)) if up_flags else float("nan"),
    }


SKEW_WARMUP = 3.0  # seconds of load before counting: the banked bursts are spent, every share settled


async def skew(tmp: Path, redis: RedisServer, fleet_rate: float, seconds: float) -> dict[str, float]:
    """One fleet-wide request rate, offered twice over with 80 % of it to one sidecar."""
    async with FaultyUpstream(fail_rate=0.0, keep_records=True) as up:
        ports = [free_port() for _ in range(SIDECARS)]
        admins = [free_port() for _ in range(SIDECARS)]
        prefix = f"bench-skew-{time.time_ns()}:"
        procs = []
        # in every 10 requests, 8 to the busy sidecar and 2 to the nine others in turn
        others = ports[1:]
        rotated: list[int] = []
        for k in range(len(others) // 2 + 1):
            rotated += [ports[0]] * 8 + [others[(2 * k) % len(others)], others[(2 * k + 1) % len(others)]]
        try:
            for i, (p, a) in enumerate(zip(ports, admins, strict=True)):
                text = sidecar_yaml(p, a, up.endpoint, redis.url, None, prefix, fleet_rate=fleet_rate)
                procs.append(await asyncio.to_thread(launch, tmp, f"skew{i}", text, p))
            while min([scrape(a, "sidecar_fleet_members") for a in admins]) < SIDECARS:
                await asyncio.sleep(0.2)
            await load(rotated, 2 * fleet_rate, SKEW_WARMUP)
            up.received.clear()
            ok: dict[int, int] = {}
            t0 = time.monotonic()
            sent = await load(rotated, 2 * fleet_rate, seconds, ok)
            elapsed = time.monotonic() - t0
        finally:
            for p in procs:
                stop(p)
    admitted = sum(ok.values())
    return {
        "offered_per_s": sent / elapsed,
        "admitted_per_s": admitted / elapsed,
        "upstream_per_s": len(up.received) / elapsed,
        "busy_part": ok.get(ports[0], 0) / max(1, admitted),
        "seconds": elapsed,
    }


def p50_once(port: int, n: int) -> float:
    """Median seconds of ``n`` sequential GETs over one keep-alive connection (after a warm-up)."""
    req = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for i in range(n + 200):
            t = time.perf_counter()
            s.sendall(req)
            data = s.recv(65536)
            if not data.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer {data[:60]!r}")
            if i >= 200:
                times.append(time.perf_counter() - t)
    return statistics.median(times)


def p50s(tmp: Path, redis: RedisServer, rounds: int, n: int) -> dict[str, list[float]]:
    up = free_port()
    nginx = start(["nginx", "-c", str(nginx_conf(tmp, up))], 1)
    out: dict[str, list[float]] = {"off": [], "fleet": []}
    try:
        wait_port(up, nginx)
        for r in range(rounds):
            for mode in ("off", "fleet") if r % 2 == 0 else ("fleet", "off"):  # alternate: drift cancels
                port, admin = free_port(), free_port()
                text = sidecar_yaml(
                    port,
                    admin,
                    f"127.0.0.1:{up}",
                    redis.url,
                    None if mode == "off" else "fleet",
                    f"bench-p50-{r}:",
                )
                proc = launch(tmp, f"p50-{mode}-{r}", text, port)
                try:
                    out[mode].append(p50_once(port, n))
                finally:
                    stop(proc)
    finally:
        stop(nginx)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=100.0, help="client requests per second, all sidecars")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3000, help="per p50 measurement")
    ap.add_argument("--fleet-rate", type=float, default=200.0, help="the fleet-wide request rate (skew run)")
    ap.add_argument("--skew-seconds", type=float, default=20.0)
    args = ap.parse_args()
    started = machine()
    notes = [
        f"{SIDECARS} `sidecar run` processes, upstream answering 503 to everything, {args.rate:g} requests/s for "
        f"{args.seconds:g} s per run; retry_budget ratio {RATIO}, min_per_second {FLOOR}; policy http-default "
        "without its own throttle; retries counted at the upstream.",
        "The machine is shared (2 cores, other jobs running): figures move from run to run.",
    ]
    with tempfile.TemporaryDirectory(prefix="sidecar-fleet-") as t, RedisServer() as redis:
        tmp = Path(t)
        res = {}
        for scope in ("local", "fleet"):
            say(f"outage with {scope} budgets ...")
            res[scope] = asyncio.run(outage(tmp, redis, scope, args.rate, args.seconds))
            say(f"  {res[scope]}")
        say(f"fleet rate {args.fleet_rate:g}/s under 80/20 skew ...")
        sk = asyncio.run(skew(tmp, redis, args.fleet_rate, args.skew_seconds))
        say(f"  {sk}")
        say("p50 with and without the fleet budget ...")
        lat = p50s(tmp, redis, args.rounds, args.requests)
    fleet = res["fleet"]
    bound = RATIO * fleet["requests"] + FLOOR * fleet["seconds"] + 2 * FLOOR
    p50_off, p50_on = statistics.median(lat["off"]) * 1e3, statistics.median(lat["fleet"]) * 1e3
    # each round's on - off: the machine's drift between rounds cancels
    added = statistics.median(on - off for on, off in zip(lat["fleet"], lat["off"], strict=True)) * 1e3
    cols = ["local", "fleet"]
    above = {c: round((res[c]["retries"] - RATIO * res[c]["requests"]) / res[c]["seconds"], 1) for c in cols}
    rows = [
        row("client requests", "", {c: res[c]["requests"] for c in cols}),
        row(
            "retries at the upstream",
            "",
            {c: res[c]["retries"] for c in cols},
            goal=f"fleet <= 0.2 x requests + floor = {bound:.0f}",
            met=fleet["retries"] <= bound,
        ),
        row("retries per request", "", {c: round(res[c]["retries_per_request"], 3) for c in cols}),
        row(
            "retries above 0.2 x requests, per second",
            "/s",
            above,
            goal=f"local >= {SIDECARS // 2} x floor, fleet <= 1.5 x floor ({FLOOR:g}/s)",
            met=above["local"] >= SIDECARS // 2 * FLOOR and above["fleet"] <= 1.5 * FLOOR,
        ),
        row(
            "proxied GET p50, fleet budget off / on",
            "ms",
            {"local": round(p50_off, 4), "fleet": round(p50_on, 4)},
        ),
        row(
            "added p50 with the fleet budget (median of rounds' on - off)",
            "ms",
            {"fleet": round(added, 4)},
            goal="<= +0.02 ms",
            met=added <= 0.02,
        ),
    ]
    error = sk["admitted_per_s"] / args.fleet_rate - 1
    rows += [
        row(
            f"fleet rate {args.fleet_rate:g}/s, offered 2x with 80 % to one sidecar: admitted per second",
            "/s",
            {"fleet": round(sk["admitted_per_s"], 1)},
            goal="within 10 % of the rate",
            met=abs(error) <= 0.10,
        ),
        row(
            "the busy sidecar's part of what was admitted",
            "",
            {"fleet": round(sk["busy_part"], 3)},
            goal="most of it (> 0.5)",
            met=sk["busy_part"] > 0.5,
        ),
    ]
    notes.append(
        f"Rate under skew: {SIDECARS} sidecars sharing requests.rate {args.fleet_rate:g}/s (burst 1s, scope fleet), "
        f"offered {sk['offered_per_s']:.0f}/s for {sk['seconds']:.0f} s after a {SKEW_WARMUP:g} s warm-up, 80 % "
        f"to one sidecar; admitted = 200 answers ({sk['upstream_per_s']:.1f}/s seen at the upstream)."
    )
    notes.append(
        f"p50: medians of {args.rounds} alternated rounds of {args.requests} sequential GETs through one sidecar "
        f"in front of nginx; off {[round(v * 1e3, 4) for v in lat['off']]} ms, "
        f"on {[round(v * 1e3, 4) for v in lat['fleet']]} ms (the 'local' column is the run without a budget)."
    )
    show(cols, rows)
    write("fleet", "Fleet-wide retry budget: 10 sidecars in an outage", cols, rows, notes, None, started)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
