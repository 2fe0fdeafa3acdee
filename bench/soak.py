"""Soak: mixed load across the three protocols for a long while; does the sidecar's memory or file-descriptor
count creep?

Three processes: the upstreams (``--serve``: an HTTP, a gRPC and a MongoDB test server that fail, stall and
overload now and then), ``sidecar run`` (uvloop) in front of them, and this one sending an open-loop load
of ``--rate`` requests/s split over HTTP (aiohttp), gRPC (grpcio) and MongoDB (pymongo's AsyncMongoClient).
The mix: 503s and UNAVAILABLEs to retry, slow answers past ``per_try_timeout`` (timeouts, then retries),
hedged routes and methods, MongoDB overload errors (code 462, backoff and retry).

Measured: the sidecar's RSS at 1 and 5 minutes and at the end (goal: growth < 5 % after the first minute),
its open file descriptors and sockets before the load and after it (the clients gone and the HTTP pools'
idle time passed: every client connection closed, the rest are the upstream connections pools keep), and
what the clients saw.

    .venv/bin/python bench/soak.py                  # 10 minutes at 1,000 requests/s
    .venv/bin/python bench/soak.py --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import free_port, machine, row, show, wait_port, write

HERE = Path(__file__).resolve().parent


# -- the upstreams' process ----------------------------------------------------------------------------
def serve() -> None:
    import grpc

    from sidecar.testing.grpc_upstream import GrpcUpstream, Step
    from sidecar.testing.http_upstream import Fault, FaultyUpstream
    from sidecar.testing.mongo import MongoTestServer

    rng = random.Random(7)

    def grpc_step(method: str) -> Step:
        r = rng.random()
        if r < 0.03:
            return Step(code=grpc.StatusCode.UNAVAILABLE, details="injected")
        if r < 0.04:
            return Step(delay=0.5)  # past the per-try timeout
        return Step(delay=0.002)

    async def main() -> None:
        async with (
            FaultyUpstream(
                latency=0.002,
                slow_fraction=0.01,
                slow_factor=250,  # 0.5 s: past the per-try timeout
                fail_rate=0.03,
                fail=Fault(status=503),
                keep_records=False,
            ) as http,
            GrpcUpstream(grpc_step, keep_records=False) as grpc_up,
            MongoTestServer("mongos") as mongo,
        ):
            mongo.limit_rate(400.0, burst_seconds=0.1)  # bursts over it: code 462 overload errors
            print(
                json.dumps({"http": http.endpoint, "grpc": grpc_up.endpoint, "mongodb": mongo.endpoint}),
                flush=True,
            )
            await asyncio.Event().wait()

    import uvloop

    uvloop.run(main())


# -- the sidecar -----------------------------------------------------------------------------------------
def sidecar_config(endpoints: dict[str, str], ports: dict[str, int]) -> str:
    return f"""
admin: {{listen: null}}
policies:
  http-soak: {{extends: http-default, per_try_timeout: 250ms, max_attempts: 3}}
  http-hedged: {{extends: http-default, per_try_timeout: 300ms, hedging: {{max_attempts: 2, delay: 100ms}}}}
  grpc-soak: {{extends: grpc-a6, per_try_timeout: 250ms, max_attempts: 3}}
  grpc-hedged: {{extends: grpc-a6, per_try_timeout: 300ms, hedging: {{max_attempts: 2, delay: 100ms}}}}
upstreams:
  web: {{endpoints: ["{endpoints["http"]}"]}}
  rpc: {{endpoints: ["{endpoints["grpc"]}"]}}
  db: {{endpoints: ["{endpoints["mongodb"]}"]}}
listeners:
  - {{name: web, protocol: http, listen: "127.0.0.1:{ports["http"]}", upstream: web, policy: http-soak,
      routes: [{{match: {{path_prefix: /hedged}}, policy: http-hedged}}]}}
  - {{name: rpc, protocol: grpc, listen: "127.0.0.1:{ports["grpc"]}", upstream: rpc, policy: grpc-soak,
      method_policies: {{pkg.Svc/Hedged: grpc-hedged}}}}
  - {{name: db, protocol: mongodb, listen: "127.0.0.1:{ports["mongodb"]}", upstream: db}}
"""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sockets(pid: int) -> list[str]:
    """The process's TCP sockets as ``local -> remote`` (ports), to say which descriptors stayed open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[9] in inodes:
                local, remote = (int(x.split(":")[1], 16) for x in (f[1], f[2]))
                out.append(f"{local}->{remote}" if remote else f"listen {local}")
    return sorted(out)


# -- the load ----------------------------------------------------------------------------------------------
async def load(ports: dict[str, int], rate: float, seconds: float, pid: int, marks: list[float]) -> dict:
    import aiohttp
    import grpc
    from pymongo import AsyncMongoClient

    rng = random.Random(1)
    outcomes: Counter[str] = Counter()
    samples: list[tuple[float, int, int]] = []
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc']}", options=(("grpc.enable_retries", 0),))
    mongo = AsyncMongoClient(f"mongodb://127.0.0.1:{ports['mongodb']}/", maxPoolSize=100, retryReads=False)
    base_http = f"http://127.0.0.1:{ports['http']}"
    inflight: set[asyncio.Task[None]] = set()

    async def one(kind: int, n: int) -> None:
        proto = ("http", "grpc", "mongodb")[kind]
        try:
            async with asyncio.timeout(10):
                if kind == 0:
                    path = "/hedged/x" if n % 5 == 0 else f"/items/{n % 100}"
                    async with http.get(base_http + path) as r:
                        await r.read()
                        ok = r.status == 200
                elif kind == 1:
                    method = "/pkg.Svc/Hedged" if n % 5 == 0 else "/pkg.Svc/Get"
                    await channel.unary_unary(method)(b"x" * 32, timeout=5)
                    ok = True
                elif n % 4 == 0:
                    await mongo.soak.c.insert_one({"n": n})
                    # keep the collection small: the test server scans it whole for every find, and a
                    # growing one slows the upstreams' process (HTTP and gRPC too) until they time out
                    await mongo.soak.c.delete_many({"n": {"$lt": n - 400}})
                    ok = True
                else:
                    await mongo.soak.c.find_one({"n": n - 4})
                    ok = True
        except Exception as e:  # noqa: BLE001 - counted by kind
            outcomes[f"{proto} error {type(e).__name__}"] += 1
            return
        outcomes[f"{proto} {'ok' if ok else 'not 200'}"] += 1

    start = time.monotonic()
    next_mark = 0
    n = 0
    interval = 1.0 / rate
    while (now := time.monotonic() - start) < seconds:
        due = int(now / interval)
        while n < due:
            if len(inflight) < 2000:
                t = asyncio.get_running_loop().create_task(one(rng.randrange(3), n))
                inflight.add(t)
                t.add_done_callback(inflight.discard)
            else:
                outcomes["skipped (2,000 in flight)"] += 1
            n += 1
        if next_mark < len(marks) and now >= marks[next_mark]:
            samples.append((now, rss(pid), fds(pid)))
            print(
                f"  {now / 60:5.1f} min: RSS {rss(pid) / 2**20:.1f} MiB, {fds(pid)} fds, {n:,} sent",
                flush=True,
            )
            next_mark += 1
        await asyncio.sleep(0.005)
    samples.append((time.monotonic() - start, rss(pid), fds(pid)))
    await asyncio.gather(*inflight, return_exceptions=True)
    await http.close()
    await channel.close()
    await mongo.close()
    return {"sent": n, "outcomes": dict(outcomes), "samples": samples, "seconds": time.monotonic() - start}


async def settle_fds(pid: int, baseline: int, bound: float) -> tuple[int, float]:
    """Wait (up to ``bound`` s) for the sidecar's descriptors to come back to ``baseline``."""
    start = time.monotonic()
    while True:
        n = fds(pid)
        waited = time.monotonic() - start
        if n <= baseline or waited > bound:
            return n, waited
        await asyncio.sleep(0.5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=1000.0, help="requests/s over the three protocols")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve()
        return
    started = machine()
    ups = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE)
    sc = None
    try:
        assert ups.stdout is not None
        endpoints = json.loads(ups.stdout.readline())
        ports = {k: free_port() for k in endpoints}
        cfg = Path(tempfile.mkdtemp(prefix="soak-")) / "sidecar.yaml"
        cfg.write_text(sidecar_config(endpoints, ports))
        sc = subprocess.Popen(
            [str(Path(sys.executable).parent / "sidecar"), "run", "-c", str(cfg), "--log-level", "error"],
            stderr=subprocess.PIPE,
        )
        for port in ports.values():
            wait_port(port, sc)
        time.sleep(1.0)  # the MongoDB listener's monitors connect
        baseline = fds(sc.pid)
        before_sockets = sockets(sc.pid)
        seconds = args.minutes * 60
        marks = [m * 60 for m in (1, 5) if m * 60 < seconds]
        print(f"soak: {args.minutes:g} min at {args.rate:g} requests/s; sidecar pid {sc.pid}, {baseline} fds")
        import uvloop

        result = uvloop.run(load(ports, args.rate, seconds, sc.pid, marks))
        after_load = fds(sc.pid)
        end_fds, waited = uvloop.run(settle_fds(sc.pid, baseline, 45.0))
        end_sockets = sockets(sc.pid)
        listening = {str(p) for p in ports.values()}
        clients_left = [x for x in end_sockets if x.split("->")[0] in listening]
        pooled = [x for x in end_sockets if "->" in x and x not in before_sockets and x not in clients_left]
        print("sockets before the load:", before_sockets)
        print("sockets at the end:     ", end_sockets, "(upstreams:", endpoints, "listeners:", ports, ")")
    finally:
        if sc is not None:
            sc.terminate()
            sc.wait(30)
        ups.terminate()
        ups.wait(30)
    samples = result["samples"]
    first = samples[0][1] if samples else 0
    last = samples[-1][1]
    growth = (last - first) / first * 100 if first else None
    sent, secs = result["sent"], result["seconds"]
    ok = sum(v for k, v in result["outcomes"].items() if k.endswith(" ok"))
    columns = ["sidecar"]
    rows = [
        row("requests sent", "", {"sidecar": sent}),
        row("rate offered", "/s", {"sidecar": round(sent / secs)}),
        row("requests answered OK", "%", {"sidecar": round(ok / sent * 100, 2) if sent else None}),
    ]
    for t, r, _ in samples:
        rows.append(row(f"RSS at {t / 60:.1f} min", "MiB", {"sidecar": round(r / 2**20, 1)}))
    rows.append(
        row(
            "RSS growth after the first minute",
            "%",
            {"sidecar": round(growth, 2) if growth is not None else None},
            goal="< 5",
            met=growth is not None and growth < 5,
        )
    )
    rows.append(
        row(
            "client connections still open after the load",
            "",
            {"sidecar": len(clients_left)},
            goal="0",
            met=not clients_left,
        )
    )
    rows.append(row("upstream connections kept by pools after the load", "", {"sidecar": len(pooled)}))
    rows.append(row("open fds before the load", "", {"sidecar": baseline}))
    rows.append(row("open fds at the end of the load", "", {"sidecar": after_load}))
    rows.append(row(f"open fds after the clients left ({waited:.0f} s later)", "", {"sidecar": end_fds}))
    show(columns, rows)
    notes = [
        f"{args.minutes:g} min at {args.rate:g} requests/s offered",
        "outcomes: " + json.dumps(result["outcomes"]),
    ]
    write("soak", "Soak: mixed load over HTTP, gRPC and MongoDB", columns, rows, notes, None, started)


if __name__ == "__main__":
    main()
