"""MongoDB overhead of the sidecar: pymongo ``find_one`` and ``ping`` straight to the test server versus
through the sidecar, in one run.

    .venv/bin/python bench/mongo_overhead.py [--runs 3] [--duration 5] [--threads 8]

The test server (``python -m sidecar.testing.mongo``, uvloop, a mongos with one small document) and the
sidecar (``sidecar run``, uvloop, preset ``mongodb-backpressure``) run in their own processes; pymongo
(sync, ``retryReads=false&retryWrites=false&maxAdaptiveRetries=0``) drives them from ``--threads`` threads in
a closed loop for ``--duration`` seconds per measurement, and once from one thread (latency without queueing). Targets are interleaved; each figure is the median
of ``--runs`` runs with the spread (min-max). Writes ``bench/results/mongo.json``.
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


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=8)
    args = p.parse_args()
    py = sys.executable
    sidecar_bin = str(Path(py).parent / "sidecar")
    server_port, sidecar_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "sidecar.yaml"
        cfg.write_text(
            f"admin: {{listen: null}}\n"
            f"upstreams: {{db: {{endpoints: ['127.0.0.1:{server_port}']}}}}\n"
            f"listeners: [{{name: mongo, protocol: mongodb, listen: '127.0.0.1:{sidecar_port}', upstream: db}}]\n"
        )
        try:
            procs.append(start([py, "-m", "sidecar.testing.mongo", "--port", str(server_port)], server_port))
            procs.append(start([sidecar_bin, "run", "-c", str(cfg)], sidecar_port))
            direct = f"mongodb://127.0.0.1:{server_port}/?{OPTIONS}"
            via = f"mongodb://127.0.0.1:{sidecar_port}/?{OPTIONS}"
            seed = pymongo.MongoClient(direct)
            seed.bench.items.insert_one({"_id": 1, "name": "widget", "qty": 7, "tags": ["a", "b"]})
            seed.close()
            raw: dict[str, dict[str, list[dict[str, float]]]] = {}
            for run in range(args.runs):
                for op, threads in (("find_one", args.threads), ("ping", args.threads), ("ping", 1)):
                    name = op if threads == args.threads else f"{op} (1 thread)"
                    for target, uri in (("direct", direct), ("sidecar", via)):
                        m = measure(uri, op, threads, args.duration)
                        raw.setdefault(name, {}).setdefault(target, []).append(m)
                        print(
                            f"run {run + 1} {name:16} {target:7} {m['ops']:9.0f} ops/s  p50 {m['p50_ms']:.3f} ms  "
                            f"p99 {m['p99_ms']:.3f} ms  errors {m['errors']}",
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
