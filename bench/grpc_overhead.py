"""gRPC overhead of the sidecar: unary calls/s and latency through it versus direct, in one run.

Two sidecars are measured beside the direct target: one forwarding every call as a stream (the default:
any call shape, each message forwarded as it arrives), one with ``unary_requests: ["*"]`` (the listener is
told every method takes one request message: grpc's single-request form upstream).

    .venv/bin/python bench/grpc_overhead.py [--runs 5] [--duration 5] [--concurrency 32]

Three processes: the upstream (``sidecar.testing.grpc_upstream``, answers at once with an echo), the
sidecar (``sidecar run``, uvloop, the ``grpc-a6`` policy: retries, throttle, deadline) and a Python
``grpc.aio`` load client keeping ``--concurrency`` unary calls in flight (64-byte messages, 1 s deadline).
The sidecar is pinned to CPU 0, the upstream and the client share CPU 1, so the upstream and the client do
the same work in both modes and the sidecar gets its own core, as a sidecar container would. When ``h2load``
is installed (Debian: ``apt-get install -y nghttp2-client``), each run also measures calls/s with it (one
connection, 32 streams): a C client that leaves the Python upstream, not the client, as the direct limit.

Each run measures the direct target and the sidecar back to back (the order alternates); figures are the
medians over ``--runs`` runs with their spread (min-max). The sidecar's CPU time per call (user + system,
from ``/proc``, over the concurrent load and its warm-up) is the figure that a shared, noisy machine moves
least: calls/s there depend on what else runs. Writes ``bench/results/grpc.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "grpc.json"
PY = sys.executable
KEYS = ("calls_per_s", "p50_ms", "p99_ms", "serial_p50_ms")
WARMUP = 200


def pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def start(cmd: list[str], cpu: int) -> subprocess.Popen:
    return subprocess.Popen([*pinned(cpu), *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- roles run in child processes -------------------------------------------------------------------
async def _upstream(port: int) -> None:
    import grpc

    from sidecar.testing.grpc_upstream import GrpcUpstream

    up = GrpcUpstream(keep_records=False)
    server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
    from sidecar.testing.grpc_upstream import _Any

    server.add_generic_rpc_handlers((_Any(up),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop_event = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop_event.set)
    await stop_event.wait()
    await server.stop(0)


async def _load(target: str, duration: float, concurrency: int) -> dict:
    import grpc

    async with grpc.aio.insecure_channel(target, options=(("grpc.enable_retries", 0),)) as ch:
        call = ch.unary_unary("/bench.Echo/Call")
        body = b"x" * 64
        for _ in range(WARMUP):
            await call(body, timeout=1.0)
        latencies: list[float] = []
        errors = 0
        loop = asyncio.get_running_loop()
        end = loop.time() + duration

        async def worker() -> None:
            nonlocal errors
            while loop.time() < end:
                t0 = time.perf_counter()
                try:
                    await call(body, timeout=1.0)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    latencies.sort()
    n = len(latencies)
    return {
        "calls_per_s": n / elapsed,
        "p50_ms": latencies[n // 2] * 1000,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000,
        "calls": n,
        "errors": errors,
    }


def load(target: str, duration: float, concurrency: int) -> dict:
    out = subprocess.run(
        [*pinned(1), PY, __file__, "load", target, str(duration), str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def h2load(port: int, duration: float, concurrency: int, body: Path) -> float | None:
    """Calls/s from h2load (one connection, ``concurrency`` streams), or None without h2load."""
    if shutil.which("h2load") is None:
        return None
    out = subprocess.run(
        [
            *pinned(1),
            "h2load",
            "-D",
            str(int(duration)),
            "-c",
            "1",
            "-m",
            str(concurrency),
            "-t",
            "1",
            "-d",
            str(body),
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            f"http://127.0.0.1:{port}/bench.Echo/Call",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("finished in"):
            return float(line.split(",")[1].split()[0])
    return None


def sidecar_conf(tmp: Path, port: int, upstream: int, unary: bool) -> Path:
    conf = tmp / f"sidecar-{port}.yaml"
    extra = ', unary_requests: ["*"]' if unary else ""
    conf.write_text(
        f"""admin: {{listen: null}}
upstreams:
  echo: {{endpoints: ["127.0.0.1:{upstream}"]}}
listeners:
  - {{name: bench, protocol: grpc, listen: "127.0.0.1:{port}", upstream: echo, policy: grpc-a6{extra}}}
"""
    )
    return conf


SIDECARS = ("sidecar", "unary")  # streamed (the default) / unary_requests: ["*"]


def spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    up_port = free_port()
    ports = {"direct": up_port, **{name: free_port() for name in SIDECARS}}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "request.bin"
        body.write_bytes(b"\x00" + (64).to_bytes(4, "big") + b"x" * 64)  # one gRPC message frame
        upstream = start([PY, __file__, "upstream", str(up_port)], cpu=1)
        procs = {
            name: start(
                [
                    str(Path(PY).parent / "sidecar"),
                    "run",
                    "-c",
                    str(sidecar_conf(Path(tmp), ports[name], up_port, unary=name == "unary")),
                    "--log-level",
                    "warning",
                ],
                cpu=0,
            )
            for name in SIDECARS
        }
        try:
            wait_port(up_port, upstream)
            for name in SIDECARS:
                wait_port(ports[name], procs[name])
            runs: dict[str, list[dict]] = {"direct": [], **{name: [] for name in SIDECARS}}
            targets = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
            for i in range(args.runs):
                order = ["direct", *SIDECARS] if i % 2 == 0 else [*reversed(SIDECARS), "direct"]
                for name in order:
                    proc = procs.get(name)
                    cpu0 = cpu_seconds(proc.pid) if proc is not None else 0.0
                    r = load(targets[name], args.duration, args.concurrency)
                    if proc is not None:
                        r["cpu_us_per_call"] = (cpu_seconds(proc.pid) - cpu0) / (r["calls"] + WARMUP) * 1e6
                    r["serial_p50_ms"] = load(targets[name], min(2.0, args.duration), 1)["p50_ms"]
                    r["h2load_calls_per_s"] = h2load(ports[name], args.duration, args.concurrency, body)
                    runs[name].append(r)
                    print(
                        f"run {i + 1} {name:>7}: {r['calls_per_s']:8.0f} calls/s  p50 {r['p50_ms']:6.2f} ms  "
                        f"p99 {r['p99_ms']:6.2f} ms  errors {r['errors']}; one in flight: p50 {r['serial_p50_ms']:.3f} ms; "
                        f"h2load {r['h2load_calls_per_s']} calls/s"
                        + (f"; sidecar CPU {r['cpu_us_per_call']:.0f} us/call" if proc is not None else ""),
                        flush=True,
                    )
        finally:
            for proc in procs.values():
                stop(proc)
            stop(upstream)
    ratios = [
        s["calls_per_s"] / d["calls_per_s"] for d, s in zip(runs["direct"], runs["sidecar"], strict=True)
    ]
    added = [
        s["serial_p50_ms"] - d["serial_p50_ms"] for d, s in zip(runs["direct"], runs["sidecar"], strict=True)
    ]
    h2 = [
        s["h2load_calls_per_s"] / d["h2load_calls_per_s"]
        for d, s in zip(runs["direct"], runs["sidecar"], strict=True)
        if s["h2load_calls_per_s"] and d["h2load_calls_per_s"]
    ]
    summary = {
        "setup": {
            "runs": args.runs,
            "duration_s": args.duration,
            "concurrency": args.concurrency,
            "client": "python grpc.aio, unary, 64-byte messages",
            "cpus": "sidecar on CPU 0; upstream and client on CPU 1",
        },
        "direct": {k: spread([r[k] for r in runs["direct"]]) for k in KEYS},
        "sidecar": {k: spread([r[k] for r in runs["sidecar"]]) for k in KEYS},
        "ratio_calls_per_s": spread(ratios),
        "added_p50_ms_one_in_flight": spread(added),
        "sidecar_cpu_us_per_call": spread([r["cpu_us_per_call"] for r in runs["sidecar"]]),
        "unary_requests": {
            "calls_per_s": spread([r["calls_per_s"] for r in runs["unary"]]),
            "ratio_calls_per_s": spread(
                [
                    u["calls_per_s"] / d["calls_per_s"]
                    for d, u in zip(runs["direct"], runs["unary"], strict=True)
                ]
            ),
            "sidecar_cpu_us_per_call": spread([r["cpu_us_per_call"] for r in runs["unary"]]),
            "cpu_vs_streamed": spread(
                [
                    u["cpu_us_per_call"] / s["cpu_us_per_call"]
                    for s, u in zip(runs["sidecar"], runs["unary"], strict=True)
                ]
            ),
        },
        "h2load": None
        if not h2
        else {
            "direct_calls_per_s": spread([r["h2load_calls_per_s"] for r in runs["direct"]]),
            "sidecar_calls_per_s": spread([r["h2load_calls_per_s"] for r in runs["sidecar"]]),
            "ratio_calls_per_s": spread(h2),
        },
        "errors": sum(r["errors"] for rs in runs.values() for r in rs),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    d, s = summary["direct"], summary["sidecar"]
    print(
        f"\nmedians over {args.runs} runs: direct {d['calls_per_s']['median']:.0f} calls/s, sidecar "
        f"{s['calls_per_s']['median']:.0f} calls/s = {summary['ratio_calls_per_s']['median']:.0%} of direct "
        f"(runs {summary['ratio_calls_per_s']['min']:.0%}-{summary['ratio_calls_per_s']['max']:.0%}); p50 "
        f"{d['p50_ms']['median']:.2f} -> {s['p50_ms']['median']:.2f} ms, p99 {d['p99_ms']['median']:.2f} -> "
        f"{s['p99_ms']['median']:.2f} ms at {args.concurrency} in flight; one call in flight: p50 "
        f"{d['serial_p50_ms']['median']:.3f} -> {s['serial_p50_ms']['median']:.3f} ms (added "
        f"{summary['added_p50_ms_one_in_flight']['median']:.3f} ms); sidecar CPU "
        f"{summary['sidecar_cpu_us_per_call']['median']:.0f} us/call (runs {summary['sidecar_cpu_us_per_call']['min']:.0f}-"
        f"{summary['sidecar_cpu_us_per_call']['max']:.0f}). Wrote {RESULTS.relative_to(ROOT)}"
    )
    un = summary["unary_requests"]
    print(
        f"with unary_requests: {un['calls_per_s']['median']:.0f} calls/s = {un['ratio_calls_per_s']['median']:.0%} "
        f"of direct; sidecar CPU {un['sidecar_cpu_us_per_call']['median']:.0f} us/call = "
        f"{un['cpu_vs_streamed']['median']:.2f}x the streamed form's (runs {un['cpu_vs_streamed']['min']:.2f}-"
        f"{un['cpu_vs_streamed']['max']:.2f})"
    )
    if summary["h2load"]:
        h = summary["h2load"]
        print(
            f"h2load: direct {h['direct_calls_per_s']['median']:.0f} calls/s, sidecar "
            f"{h['sidecar_calls_per_s']['median']:.0f} calls/s = {h['ratio_calls_per_s']['median']:.0%} of direct "
            f"(runs {h['ratio_calls_per_s']['min']:.0%}-{h['ratio_calls_per_s']['max']:.0%})"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "upstream":
        import uvloop

        uvloop.run(_upstream(int(sys.argv[2])))
    elif len(sys.argv) > 1 and sys.argv[1] == "load":
        import uvloop

        print(json.dumps(uvloop.run(_load(sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))))
    else:
        main()
