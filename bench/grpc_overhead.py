"""gRPC overhead of the sidecar against the cheapest proxy grpcio allows, in one run (issue 24).

Six targets, each measured in every run (the order alternates):

- ``direct``: the upstream itself;
- ``floor-unary`` and ``floor-stream``: **the floor**, the cheapest correct pass-through proxy on grpc.aio
  (``floor`` below: a generic handler forwarding raw bytes to one channel, metadata, deadline and status
  through, no policy), in grpc's unary form on both sides (one request, one response) and in the stream
  form on both sides (any call shape);
- ``floor-one``: the floor that keeps ``unary_requests``' rules (any call shape served; one request message
  upstream in grpc's single-request form, a second refused, responses streamed), read beside the goal;
- ``sidecar``: ``sidecar run`` forwarding every call as a stream (the default: any call shape);
- ``unary``: ``sidecar run`` with ``unary_requests: ["*"]`` (told every method takes one request message);
- ``traces`` (with ``--traces``, beside the six): the streamed sidecar exporting its spans over OTLP/gRPC to
  a real receiver (``common.OtlpReceiver``, its own process on CPU 1) with the demo's sampling (every call
  traced: ``sample_ratio`` 1.0, the default), read against ``floor-stream`` and against ``sidecar`` (what
  spans cost); the receiver counts the spans it got, printed per call.

    .venv/bin/python bench/grpc_overhead.py [--runs 3] [--duration 5] [--concurrency 32] [--targets ...]
        [--traces]

The upstream is ``sidecar.testing.grpc_upstream`` answering at once with an echo; the sidecars run the
``grpc-a6`` policy (the demo's: retries, throttle, pushback, deadlines, metrics on; spans only in
``traces``, as the default rows' config exports no traces), with uvloop. The
proxies (floors and sidecars) are pinned to CPU 0, the upstream and the load client share CPU 1. The load is
a Python ``grpc.aio`` client keeping ``--concurrency`` unary calls in flight (64-byte messages, 1 s
deadline), then one call in flight for the latency a hop adds. With ``h2load`` installed (Debian:
``nghttp2-client``), each target also gets its calls/s from it (one connection, 32 streams).

What to read: the ratios to the floor of the same form, per run and their medians (the goals of issue 24:
CPU per call <= 1.3x, added p50 at one call in flight <= 1.5x, calls/s at 32 in flight >= 0.9x). A proxy's
CPU time per call (user + system from ``/proc``, over the concurrent load and its warm-up) is the figure a
shared, noisy machine moves least. Its context switches per call (all threads, ``/proc``) count grpc's own
work: its poller thread hands each completed batch of operations to the event loop's thread, so a form that
makes grpc do more batches shows here, whatever Python runs around them. Writes ``bench/results/grpc.json``.
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

from common import OtlpReceiver, free_port, wait_port

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


async def _floor(port: int, upstream: int, form: str) -> None:
    """The cheapest correct pass-through proxy on grpc.aio: one generic handler, one channel, raw bytes;
    the client's metadata (less what each hop owns) and deadline go upstream, the upstream's headers,
    messages, trailers and status come back. ``form``: ``unary`` (a unary-unary handler and call) or
    ``stream`` (a stream-stream handler and call: any call shape)."""
    import grpc

    own = frozenset(
        {"user-agent", "te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"}
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{upstream}", options=(("grpc.enable_retries", 0),))
    callables: dict[str, object] = {}

    def request_md(context: grpc.aio.ServicerContext) -> tuple:
        return tuple((m.key, m.value) for m in context.invocation_metadata() or () if m.key not in own)

    async def relay(
        call: grpc.aio.UnaryStreamCall | grpc.aio.StreamStreamCall, context: grpc.aio.ServicerContext
    ) -> None:
        """The upstream call's answer passed on: its headers, every message, its trailers and status."""
        try:
            initial = await call.initial_metadata()
            if initial:
                await context.send_initial_metadata(initial)
            while (msg := await call.read()) is not grpc.aio.EOF:
                await context.write(msg)
        except grpc.aio.AioRpcError:
            pass
        context.set_trailing_metadata(await call.trailing_metadata() or ())
        context.set_code(await call.code())
        details = await call.details()
        if details:
            context.set_details(details)

    async def unary(method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        mc = callables.get(method) or callables.setdefault(method, channel.unary_unary(method))
        call = mc(request, metadata=request_md(context), timeout=context.time_remaining())  # type: ignore[operator]
        try:
            response = await call
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details() or "", e.trailing_metadata() or ())
        initial = await call.initial_metadata()
        if initial:
            await context.send_initial_metadata(initial)
        context.set_trailing_metadata(await call.trailing_metadata() or ())
        return response

    async def stream(method: str, requests: object, context: grpc.aio.ServicerContext) -> None:
        mc = callables.get(method) or callables.setdefault(method, channel.stream_stream(method))
        call = mc(metadata=request_md(context), timeout=context.time_remaining())  # type: ignore[operator]

        async def pump() -> None:
            try:
                while (msg := await context.read()) is not grpc.aio.EOF:
                    await call.write(msg)
                await call.done_writing()
            except Exception:  # noqa: BLE001 - the call ended: its status tells
                pass

        task = asyncio.get_running_loop().create_task(pump())
        try:
            await relay(call, context)
        finally:
            task.cancel()

    async def unary_stream(method: str, request: bytes, context: grpc.aio.ServicerContext) -> None:
        mc = callables.get(method) or callables.setdefault(method, channel.unary_stream(method))
        call = mc(request, metadata=request_md(context), timeout=context.time_remaining())  # type: ignore[operator]
        await relay(call, context)

    async def one(method: str, requests: object, context: grpc.aio.ServicerContext) -> None:
        """``unary_requests``' rules at their cheapest: any call shape is served (a stream-stream
        handler); one request message goes upstream in grpc's single-request form as soon as it came, a
        second one is refused (``INTERNAL``), none goes upstream as a stream of none; responses stream
        back. (Cheaper than the sidecar in one respect it need not match: no response is relayed before
        the client half-closed.)"""
        first = await context.read()
        if first is grpc.aio.EOF:
            mc = callables.get(method) or callables.setdefault(method, channel.stream_stream(method))
            call = mc(metadata=request_md(context), timeout=context.time_remaining())  # type: ignore[operator]
            await call.done_writing()
        else:
            key = "1" + method
            mc = callables.get(key) or callables.setdefault(key, channel.unary_stream(method))
            call = mc(first, metadata=request_md(context), timeout=context.time_remaining())  # type: ignore[operator]
            if await context.read() is not grpc.aio.EOF:
                call.cancel()
                await context.abort(grpc.StatusCode.INTERNAL, "a second request message")
        await relay(call, context)

    class Any(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
            import functools

            if form == "unary":
                return grpc.unary_unary_rpc_method_handler(functools.partial(unary, details.method))
            if form == "unary-stream":
                return grpc.unary_stream_rpc_method_handler(functools.partial(unary_stream, details.method))
            if form == "one":
                return grpc.stream_stream_rpc_method_handler(functools.partial(one, details.method))
            return grpc.stream_stream_rpc_method_handler(functools.partial(stream, details.method))

    server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
    server.add_generic_rpc_handlers((Any(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop_event = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop_event.set)
    await stop_event.wait()
    await server.stop(0)
    await channel.close()


async def _otlp() -> None:
    """The OTLP receiver of the ``traces`` target: prints its port, then its counts on SIGUSR1."""
    receiver = OtlpReceiver(count_spans=True)
    print(json.dumps({"port": await receiver.start()}), flush=True)
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop_event.set)
    loop.add_signal_handler(
        signal.SIGUSR1,
        lambda: print(json.dumps({"exports": receiver.exports, "spans": receiver.spans}), flush=True),
    )
    await stop_event.wait()
    await receiver.stop()


class Receiver:
    """``_otlp`` in a process of its own (on CPU 1, beside the upstream and the load client)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [*pinned(1), PY, __file__, "otlp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"the OTLP receiver did not start: {err}")
        self.port: int = json.loads(line)["port"]

    def counts(self) -> dict[str, int]:
        """Export calls and spans received so far."""
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGUSR1)
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        stop(self.proc)


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


def context_switches(pid: int) -> int:
    """Context switches of all of a process's threads so far (Linux ``/proc``): grpc's poller thread hands
    every completed batch of operations to the event loop's thread, so this counts grpc's work per call."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except (OSError, ValueError):  # a thread that ended meanwhile
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def h2load(port: int, duration: float, concurrency: int, body: Path) -> tuple[float, int] | None:
    """Calls/s and calls made from h2load (one connection, ``concurrency`` streams), or None without it."""
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
    rate, done = None, 0
    for line in out.splitlines():
        if line.startswith("finished in"):
            rate = float(line.split(",")[1].split()[0])
        elif line.startswith("requests:"):  # requests: N total, N started, N done, N succeeded, ...
            done = int(line.split(",")[2].split()[0])
    return None if rate is None else (rate, done)


def sidecar_conf(tmp: Path, port: int, upstream: int, unary: bool, otlp: int | None = None) -> Path:
    """The sidecar's config: the demo's policy; with ``otlp`` (a receiver's port), traces exported to it over
    OTLP/gRPC with the demo's sampling (``sample_ratio`` left at its default, 1.0: every call)."""
    conf = tmp / f"sidecar-{port}.yaml"
    extra = ', unary_requests: ["*"]' if unary else ""
    telemetry = (
        ""
        if otlp is None
        else f'telemetry:\n  traces: {{exporter: otlp, protocol: grpc, endpoint: "http://127.0.0.1:{otlp}"}}\n'
    )
    conf.write_text(
        f"""admin: {{listen: null}}
{telemetry}upstreams:
  echo: {{endpoints: ["127.0.0.1:{upstream}"]}}
listeners:
  - {{name: bench, protocol: grpc, listen: "127.0.0.1:{port}", upstream: echo, policy: grpc-a6{extra}}}
"""
    )
    return conf


TARGETS = (
    "direct",
    "floor-unary",
    "floor-unary-stream",
    "floor-one",
    "floor-stream",
    "sidecar",
    "unary",
    "traces",
)
DEFAULT_TARGETS = ("direct", "floor-unary", "floor-one", "floor-stream", "sidecar", "unary")
FLOOR_OF = {
    "sidecar": "floor-stream",
    "unary": "floor-unary",
    "traces": "floor-stream",
}  # each sidecar form against its floor (the goals)
#: Read beside the goal: the sidecar's `unary_requests` form against the cheapest proxy with the same rules,
#: and the sidecar exporting spans against the same sidecar without (what spans cost).
BESIDE = {"unary": ("floor-one", "the same rules, no goal"), "traces": ("sidecar", "what spans cost")}
SAME_RULES = {"unary": "floor-one"}
GOALS = {"cpu": 1.3, "added_p50": 1.5, "calls_per_s": 0.9}  # issue 24: <=, <=, >=


def spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "runs": [round(v, 3) for v in values],
    }


def proxy_command(name: str, port: int, up_port: int, tmp: Path, otlp: int | None = None) -> list[str]:
    """How to run target ``name`` on ``port`` in front of the upstream (``otlp``: the receiver of
    ``traces``)."""
    if name.startswith("floor-"):
        return [PY, __file__, "floor", str(port), str(up_port), name.removeprefix("floor-")]
    if name == "traces" and otlp is None:
        raise ValueError("the traces target needs an OTLP receiver's port")
    conf = sidecar_conf(tmp, port, up_port, unary=name == "unary", otlp=otlp if name == "traces" else None)
    return [str(Path(PY).parent / "sidecar"), "run", "-c", str(conf), "--log-level", "warning"]


def ratios(runs: dict[str, list[dict]], name: str, floor: str) -> dict[str, list[float]]:
    """Per run: ``name``'s figures over ``floor``'s (CPU per call, added p50 at one in flight, calls/s)."""
    out: dict[str, list[float]] = {"cpu": [], "added_p50": [], "calls_per_s": []}
    for d, f, s in zip(runs["direct"], runs[floor], runs[name], strict=True):
        out["cpu"].append(s["cpu_us_per_call"] / f["cpu_us_per_call"])
        out["added_p50"].append(
            (s["serial_p50_ms"] - d["serial_p50_ms"]) / max(1e-6, f["serial_p50_ms"] - d["serial_p50_ms"])
        )
        out["calls_per_s"].append(s["calls_per_s"] / f["calls_per_s"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help="comma-separated subset of " + ",".join(TARGETS) + " (a sidecar needs its floor and direct)",
    )
    ap.add_argument(
        "--traces",
        action="store_true",
        help="add the traces target (the streamed sidecar exporting spans over OTLP to a receiver)",
    )
    args = ap.parse_args()
    wanted = args.targets.split(",") + (["traces", "sidecar"] if args.traces else [])
    names = [t for t in TARGETS if t in wanted]
    for name in names:
        if name in FLOOR_OF and (FLOOR_OF[name] not in names or "direct" not in names):
            raise SystemExit(f"--targets: {name} is read against {FLOOR_OF[name]} and direct: list them too")
    up_port = free_port()
    ports = {name: up_port if name == "direct" else free_port() for name in names}
    proxies = [n for n in names if n != "direct"]
    receiver = Receiver() if "traces" in names else None
    traced_calls = 0  # calls made to the traces target (warm-ups included): the spans are counted per call
    spans: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "request.bin"
        body.write_bytes(b"\x00" + (64).to_bytes(4, "big") + b"x" * 64)  # one gRPC message frame
        upstream = start([PY, __file__, "upstream", str(up_port)], cpu=1)
        otlp = receiver.port if receiver is not None else None
        procs = {
            name: start(proxy_command(name, ports[name], up_port, Path(tmp), otlp), cpu=0) for name in proxies
        }
        try:
            wait_port(up_port, upstream)
            for name in proxies:
                wait_port(ports[name], procs[name])
            runs: dict[str, list[dict]] = {name: [] for name in names}
            for i in range(args.runs):
                order = names if i % 2 == 0 else list(reversed(names))
                for name in order:
                    proc = procs.get(name)
                    target = f"127.0.0.1:{ports[name]}"
                    cpu0 = cpu_seconds(proc.pid) if proc is not None else 0.0
                    cs0 = context_switches(proc.pid) if proc is not None else 0
                    r = load(target, args.duration, args.concurrency)
                    if proc is not None:
                        r["cpu_us_per_call"] = (cpu_seconds(proc.pid) - cpu0) / (r["calls"] + WARMUP) * 1e6
                        r["switches_per_call"] = (context_switches(proc.pid) - cs0) / (r["calls"] + WARMUP)
                    serial = load(target, min(2.0, args.duration), 1)
                    r["serial_p50_ms"] = serial["p50_ms"]
                    h2 = h2load(ports[name], args.duration, args.concurrency, body)
                    r["h2load_calls_per_s"] = h2[0] if h2 is not None else None
                    if name == "traces":
                        traced_calls += r["calls"] + serial["calls"] + 2 * WARMUP + (h2[1] if h2 else 0)
                    runs[name].append(r)
                    print(
                        f"run {i + 1} {name:>12}: {r['calls_per_s']:6.0f} calls/s  p50 {r['p50_ms']:6.2f} ms  "
                        f"p99 {r['p99_ms']:6.2f} ms  errors {r['errors']}; one in flight: p50 "
                        f"{r['serial_p50_ms']:.3f} ms"
                        + (
                            f"; h2load {r['h2load_calls_per_s']:.0f} calls/s"
                            if r["h2load_calls_per_s"]
                            else ""
                        )
                        + (
                            f"; proxy CPU {r['cpu_us_per_call']:.0f} us/call, "
                            f"{r['switches_per_call']:.1f} context switches/call"
                            if proc is not None
                            else ""
                        ),
                        flush=True,
                    )
        finally:
            for proc in procs.values():
                stop(proc)  # (a sidecar exports the spans it still holds as it stops)
            stop(upstream)
            if receiver is not None:
                spans = receiver.counts()
                receiver.stop()
    summary: dict = {
        "setup": {
            "runs": args.runs,
            "duration_s": args.duration,
            "concurrency": args.concurrency,
            "client": "python grpc.aio, unary, 64-byte messages",
            "cpus": "proxies on CPU 0; upstream and client on CPU 1",
            "load_average": os.getloadavg(),
        },
        "targets": {
            name: {
                k: spread([r[k] for r in runs[name]])
                for k in (*KEYS, "cpu_us_per_call", "switches_per_call")
                if k in runs[name][0]
            }
            for name in names
        },
        "vs_floor": {},
        "errors": sum(r["errors"] for rs in runs.values() for r in rs),
    }
    if receiver is not None:
        summary["traces"] = {
            "sample_ratio": 1.0,
            "calls": traced_calls,
            "otlp_exports": spans.get("exports", 0),
            "spans": spans.get("spans", 0),
            "spans_per_call": round(spans.get("spans", 0) / max(1, traced_calls), 3),
        }
    print(f"\nmedians over {args.runs} runs (spread min-max); load average {os.getloadavg()[0]:.1f}")
    for name in names:
        t = summary["targets"][name]
        print(
            f"  {name:>12}: {t['calls_per_s']['median']:6.0f} calls/s, one in flight p50 "
            f"{t['serial_p50_ms']['median']:.3f} ms"
            + (
                f", CPU {t['cpu_us_per_call']['median']:.0f} us/call "
                f"({t['cpu_us_per_call']['min']:.0f}-{t['cpu_us_per_call']['max']:.0f}), "
                f"{t['switches_per_call']['median']:.1f} context switches/call"
                if "cpu_us_per_call" in t
                else ""
            )
        )
    for name in (n for n in names if n in FLOOR_OF):
        rs = ratios(runs, name, FLOOR_OF[name])
        summary["vs_floor"][name] = {"floor": FLOOR_OF[name], **{k: spread(v) for k, v in rs.items()}}
        cells = []
        for key, label, better in (
            ("cpu", "CPU per call", "<="),
            ("added_p50", "added p50 at one in flight", "<="),
            ("calls_per_s", "calls/s at 32 in flight", ">="),
        ):
            med = statistics.median(rs[key])
            met = med <= GOALS[key] if better == "<=" else med >= GOALS[key]
            runs_txt = " ".join(f"{v:.2f}" for v in rs[key])
            cells.append(
                f"{label} {med:.2f}x (runs {runs_txt}; goal {better} {GOALS[key]}: {'met' if met else 'NOT met'})"
            )
        print(f"{name} / {FLOOR_OF[name]}: " + "; ".join(cells))
        same, what = BESIDE.get(name, ("", ""))
        if same in names:  # beside the goal: the same rules' floor, or the sidecar without spans
            rs = ratios(runs, name, same)
            key = "vs_same_rules" if name in SAME_RULES else "vs_" + same
            summary.setdefault(key, {})[name] = {"floor": same, **{k: spread(v) for k, v in rs.items()}}
            print(
                f"{name} / {same} ({what}): "
                + "; ".join(
                    f"{label} {statistics.median(rs[key]):.2f}x (runs {' '.join(f'{v:.2f}' for v in rs[key])})"
                    for key, label in (
                        ("cpu", "CPU per call"),
                        ("added_p50", "added p50 at one in flight"),
                        ("calls_per_s", "calls/s at 32 in flight"),
                    )
                )
            )
    if "traces" in summary:
        t = summary["traces"]
        print(
            f"traces: the OTLP receiver got {t['spans']} spans in {t['otlp_exports']} exports for "
            f"{t['calls']} calls: {t['spans_per_call']} per call (a call's span and its attempt's: 2)"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "upstream":
        import uvloop

        uvloop.run(_upstream(int(sys.argv[2])))
    elif len(sys.argv) > 1 and sys.argv[1] == "floor":
        import uvloop

        uvloop.run(_floor(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "otlp":
        import uvloop

        uvloop.run(_otlp())
    elif len(sys.argv) > 1 and sys.argv[1] == "load":
        import uvloop

        print(json.dumps(uvloop.run(_load(sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))))
    else:
        main()
