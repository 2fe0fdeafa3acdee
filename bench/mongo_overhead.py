"""MongoDB overhead of the sidecar: pymongo ``find_one`` and ``ping`` straight to the test server versus
through the sidecar, in one run; and the app keeping its own login (issue 23): ``find_one`` by an
authenticated app (SCRAM per connection, pooled) with zstd on the upstream link, and the time of one
connection's login (a new client's first ``ping``: handshake + SCRAM), direct and through the sidecar.

    .venv/bin/python bench/mongo_overhead.py [--runs 3] [--duration 5] [--threads 8]

The test server (``python -m sidecar.testing.mongo``, uvloop, a mongos with one small document) and the
sidecar (``sidecar run``, uvloop, preset ``mongodb-backpressure``) run in their own processes; pymongo
(sync, ``retryReads=false&retryWrites=false&maxAdaptiveRetries=0``) drives them from ``--threads`` threads in
a closed loop for ``--duration`` seconds per measurement, and once from one thread (latency without queueing). Targets are interleaved; each figure is the median
of ``--runs`` runs with the spread (min-max). Writes ``bench/results/mongo.json``.

The authenticated rows use a second test server with a user (``--user bench:...``) and a second listener
of the same sidecar (``app_auth: {}``, upstream ``uri: mongodb://bench:...@host/?compressors=zstd``): the app's
URI carries the user, direct and through the sidecar alike. Goals: ``find_one (auth+zstd)`` through the
sidecar within 10 % of the plain row's throughput through the sidecar (``vs plain``), and a login through
the sidecar within 2x of a direct one (``login``, ``--logins`` new clients per run, median).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pymongo
from common import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "mongo.json"
OPTIONS = "retryReads=false&retryWrites=false&maxAdaptiveRetries=0"
USER, PASSWORD = "bench", "bench-pa55word"


def start(args: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    wait_port(port, proc)
    return proc


def measure(uri: str, op: str, threads: int, duration: float) -> dict[str, float]:
    client = pymongo.MongoClient(uri, maxPoolSize=threads * 2)
    coll = client.bench.items
    run = (lambda: coll.find_one({"_id": 1})) if op == "find_one" else (lambda: client.admin.command("ping"))
    for _ in range(200):  # warm up: connections, server selection
        run()
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop_at = time.perf_counter() + duration
    errors = [0]

    def worker(i: int) -> None:
        out = latencies[i]
        clock = time.perf_counter
        while True:
            t0 = clock()
            if t0 >= stop_at:
                return
            try:
                run()
            except pymongo.errors.PyMongoError:
                errors[0] += 1
            out.append(clock() - t0)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    begin = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - begin
    client.close()
    lat = sorted(x for per in latencies for x in per)
    return {
        "ops": len(lat) / elapsed,
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000,
        "errors": errors[0],
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (``/proc``): what a row costs the sidecar, whatever the
    machine's load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def logins(uri: str, n: int) -> dict[str, float]:
    """``n`` new clients, each timed from creation to its first ``ping`` answered (server selection, the
    connection's handshake and its SCRAM login)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client = pymongo.MongoClient(uri, maxPoolSize=1, serverSelectionTimeoutMS=10_000)
        client.admin.command("ping")
        times.append(time.perf_counter() - t0)
        client.close()
    times.sort()
    return {
        "ops": n / sum(times),
        "p50_ms": times[len(times) // 2] * 1000,
        "p99_ms": times[-1] * 1000,
        "errors": 0,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--logins", type=int, default=30, help="new authenticated clients timed per run")
    args = p.parse_args()
    py = sys.executable
    sidecar_bin = str(Path(py).parent / "sidecar")
    server_port, sidecar_port = free_port(), free_port()
    auth_port, auth_sidecar_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "sidecar.yaml"
        cfg.write_text(
            f"admin: {{listen: null}}\n"
            f"upstreams:\n"
            f"  db: {{endpoints: ['127.0.0.1:{server_port}']}}\n"
            f"  authdb: {{uri: 'mongodb://{USER}:{PASSWORD}@127.0.0.1:{auth_port}/?authSource=admin"
            f"&compressors=zstd'}}\n"
            f"listeners:\n"
            f"  - {{name: mongo, protocol: mongodb, listen: '127.0.0.1:{sidecar_port}', upstream: db}}\n"
            f"  - {{name: auth, protocol: mongodb, listen: '127.0.0.1:{auth_sidecar_port}', upstream: authdb,"
            f" app_auth: {{}}}}\n"
        )
        try:
            procs.append(start([py, "-m", "sidecar.testing.mongo", "--port", str(server_port)], server_port))
            procs.append(
                start(
                    [
                        py,
                        "-m",
                        "sidecar.testing.mongo",
                        "--port",
                        str(auth_port),
                        "--user",
                        f"{USER}:{PASSWORD}",
                    ],
                    auth_port,
                )
            )
            procs.append(start([sidecar_bin, "run", "-c", str(cfg)], sidecar_port))
            wait_port(auth_sidecar_port, procs[-1])
            sidecar_pid = procs[-1].pid
            direct = f"mongodb://127.0.0.1:{server_port}/?{OPTIONS}"
            via = f"mongodb://127.0.0.1:{sidecar_port}/?{OPTIONS}"
            creds = f"{USER}:{PASSWORD}@"
            auth_direct = f"mongodb://{creds}127.0.0.1:{auth_port}/?authSource=admin&{OPTIONS}"
            auth_via = f"mongodb://{creds}127.0.0.1:{auth_sidecar_port}/?authSource=admin&{OPTIONS}"
            for uri in (direct, auth_direct):
                seed = pymongo.MongoClient(uri)
                seed.bench.items.insert_one({"_id": 1, "name": "widget", "qty": 7, "tags": ["a", "b"]})
                seed.close()
            rows = (
                ("find_one", "find_one", args.threads, direct, via),
                ("ping", "ping", args.threads, direct, via),
                ("ping (1 thread)", "ping", 1, direct, via),
                ("find_one (auth+zstd)", "find_one", args.threads, auth_direct, auth_via),
                ("login", "login", 1, auth_direct, auth_via),
            )
            raw: dict[str, dict[str, list[dict[str, float]]]] = {}
            for run in range(args.runs):
                for name, op, threads, direct_uri, via_uri in rows:
                    for target, uri in (("direct", direct_uri), ("sidecar", via_uri)):
                        cpu0 = cpu_seconds(sidecar_pid)
                        if op == "login":
                            m = logins(uri, args.logins)
                        else:
                            m = measure(uri, op, threads, args.duration)
                            if target == "sidecar":  # the sidecar's CPU per op: a figure load does not bend
                                done = m["ops"] * args.duration
                                m["sidecar_cpu_us_per_op"] = (
                                    (cpu_seconds(sidecar_pid) - cpu0) / max(1.0, done) * 1e6
                                )
                        raw.setdefault(name, {}).setdefault(target, []).append(m)
                        cpu = m.get("sidecar_cpu_us_per_op")
                        print(
                            f"run {run + 1} {name:20} {target:7} {m['ops']:9.0f} ops/s  p50 {m['p50_ms']:.3f} ms  "
                            f"p99 {m['p99_ms']:.3f} ms  errors {m['errors']}"
                            + (f"  sidecar CPU {cpu:.0f} us/op" if cpu is not None else ""),
                            flush=True,
                        )
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    summary: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()},
        "settings": {"runs": args.runs, "duration_s": args.duration, "threads": args.threads},
        "results": {},
    }
    print()
    plain = raw.get("find_one", {}).get("sidecar", [])
    for op, targets in raw.items():
        d = {k: spread([m[k] for m in targets["direct"]]) for k in ("ops", "p50_ms", "p99_ms")}
        s = {k: spread([m[k] for m in targets["sidecar"]]) for k in ("ops", "p50_ms", "p99_ms")}
        ratios = [sm["ops"] / dm["ops"] for dm, sm in zip(targets["direct"], targets["sidecar"], strict=True)]
        added = [
            sm["p50_ms"] - dm["p50_ms"] for dm, sm in zip(targets["direct"], targets["sidecar"], strict=True)
        ]
        summary["results"][op] = {  # type: ignore[index]
            "direct": d,
            "sidecar": s,
            "throughput_ratio": spread(ratios),
            "added_p50_ms": spread(added),
            "runs": targets,
        }
        if op == "find_one (auth+zstd)" and plain:
            vs = [a["ops"] / b["ops"] for a, b in zip(targets["sidecar"], plain, strict=True)]
            cpu = [
                a["sidecar_cpu_us_per_op"] / b["sidecar_cpu_us_per_op"]
                for a, b in zip(targets["sidecar"], plain, strict=True)
            ]
            summary["results"][op]["vs_plain_sidecar"] = spread(vs)  # type: ignore[index]
            summary["results"][op]["cpu_vs_plain_sidecar"] = spread(cpu)  # type: ignore[index]
            print(
                f"{op:16}: through the sidecar, {statistics.median(vs):.2f} of the plain find_one's throughput "
                f"({min(vs):.2f}-{max(vs):.2f}; goal >= 0.90); the sidecar's CPU per op "
                f"{statistics.median(cpu):.2f}x the plain row's ({min(cpu):.2f}-{max(cpu):.2f})"
            )
        if op == "login":
            times = [
                sm["p50_ms"] / dm["p50_ms"]
                for dm, sm in zip(targets["direct"], targets["sidecar"], strict=True)
            ]
            summary["results"][op]["login_time_ratio"] = spread(times)  # type: ignore[index]
            print(
                f"{op:16}: a login through the sidecar takes {statistics.median(times):.2f}x a direct one "
                f"({min(times):.2f}-{max(times):.2f}; goal <= 2)"
            )
        print(
            f"{op:16}: direct {d['ops']['median']:.0f} ops/s (p50 {d['p50_ms']['median']:.3f} ms, p99 "
            f"{d['p99_ms']['median']:.3f}); sidecar {s['ops']['median']:.0f} ops/s (p50 {s['p50_ms']['median']:.3f}, "
            f"p99 {s['p99_ms']['median']:.3f}); ratio {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}), added p50 {statistics.median(added):.3f} ms"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
