"""User-space instructions per proxied gRPC call, the sidecar against the floor, counted by valgrind.

``grpc_overhead.py`` reads CPU time, which this shared machine moves by 5-10 % from one run to the next: a
change of a few per cent to the sidecar's per-call work does not show there. An instruction count does. This
runs each proxy under ``valgrind --tool=callgrind`` in front of the echo upstream, makes ``--calls`` unary
calls (64-byte messages, ``--concurrency`` in flight, after a warm-up) and reads the instructions the proxy's
process executed in user space for them, all of its threads (grpc's poller included; the kernel's share, the
reads, writes and thread hand-offs, is not counted: ``grpc_overhead.py`` counts context switches per call).

The proxies are ``grpc_overhead.py``'s: the floors (``floor-stream``, ``floor-unary``, ``floor-one``) and the
sidecar in both forms (``sidecar``: every call as a stream; ``unary``: ``unary_requests: ["*"]``), with the
``grpc-a6`` policy; ``traces`` (not in the default set) is the streamed sidecar exporting every call's spans
over OTLP to a receiver (``grpc_overhead.py``'s). Use it to compare two versions of the sidecar's call path; the ratio to the floor is
printed beside each count. Needs valgrind (``apt-get install -y valgrind``); takes a few minutes.

    .venv/bin/python bench/grpc_instructions.py [--calls 2000] [--concurrency 8] [--targets ...]
        [--main-thread] [--keep DIR]

``--keep DIR`` leaves callgrind's files there: ``callgrind_annotate --inclusive=yes DIR/sidecar.cg*-01``
reads where the loop thread's instructions go.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from common import free_port, wait_port
from grpc_overhead import BESIDE, FLOOR_OF, PY, Receiver, proxy_command, start, stop
from http_instructions import Callgrind
from http_instructions import stop as stop_proc

TARGETS = ("floor-unary", "floor-one", "floor-stream", "sidecar", "unary", "traces")
DEFAULT_TARGETS = ("floor-unary", "floor-one", "floor-stream", "sidecar", "unary")
WARMUP = 300


async def _calls(target: str, n: int, concurrency: int) -> int:
    """``n`` unary calls to ``target``, ``concurrency`` in flight; the number that failed."""
    import grpc

    async with grpc.aio.insecure_channel(target, options=(("grpc.enable_retries", 0),)) as ch:
        call = ch.unary_unary("/bench.Echo/Call")
        body = b"x" * 64
        left, failed = n, 0

        async def worker() -> None:
            nonlocal left, failed
            while left > 0:
                left -= 1
                try:
                    await call(body, timeout=30.0)
                except grpc.aio.AioRpcError:
                    failed += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failed


class MainThread(Callgrind):
    """``Callgrind`` counting the process's main thread alone (the event loop: grpc.aio's Python and Cython,
    the sidecar's code): grpc core's own threads also run on timers, so their count grows with the time
    valgrind takes, not with the calls."""

    def __init__(self, name: str, cmd: list[str], port: int, out: Path, start_timeout: float) -> None:
        self.name = name
        self.out = out
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}", *cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_port(port, self.proc, timeout=start_timeout)
        except BaseException:
            stop_proc(self.proc)
            raise

    def measure(self, work: Callable[[], None]) -> int:
        pid = str(self.proc.pid)
        subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
        work()
        before = set(self.out.parent.glob(self.out.name + "*"))
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        dumps = sorted(set(self.out.parent.glob(self.out.name + "*")) - before)
        main = [d for d in dumps if d.name.endswith("-01")]
        if not main:
            raise RuntimeError(f"{self.name}: callgrind wrote no dump of the main thread ({dumps})")
        m = re.search(r"^summary: (\d+)$", main[-1].read_text(errors="replace"), re.M)
        if m is None:
            raise RuntimeError(f"{self.name}: no summary in {main[-1]}")
        return int(m.group(1))


def calls(port: int, n: int, concurrency: int) -> None:
    out = subprocess.run(
        [PY, __file__, "calls", f"127.0.0.1:{port}", str(n), str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
    )
    failed = int(out.stdout.strip().splitlines()[-1])
    if failed:
        raise RuntimeError(f"{failed} of {n} calls failed")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated subset of " + ",".join(TARGETS)
    )
    ap.add_argument("--main-thread", action="store_true", help="count the event loop's thread alone")
    ap.add_argument(
        "--keep", type=Path, help="keep callgrind's files in this directory (for callgrind_annotate)"
    )
    args = ap.parse_args()
    missing = [t for t in ("valgrind", "callgrind_control") if shutil.which(t) is None]
    if missing:
        print(f"needs {', '.join(missing)} (Debian: apt-get install -y valgrind)", file=sys.stderr)
        return 2
    names = [t for t in TARGETS if t in args.targets.split(",")]
    per_call: dict[str, float] = {}
    receiver = Receiver() if "traces" in names else None
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        up_port = free_port()
        upstream = start(
            [PY, str(Path(__file__).parent / "grpc_overhead.py"), "upstream", str(up_port)], cpu=1
        )
        try:
            wait_port(up_port, upstream)
            for name in names:
                port = free_port()
                proc = (MainThread if args.main_thread else Callgrind)(
                    name,
                    proxy_command(name, port, up_port, Path(tmp), receiver.port if receiver else None),
                    port,
                    out_dir / f"{name}.cg",
                    180,
                )
                try:
                    calls(port, WARMUP, args.concurrency)  # connections, caches, the first call of each kind
                    per_call[name] = (
                        proc.measure(lambda p=port: calls(p, args.calls, args.concurrency)) / args.calls
                    )
                finally:
                    proc.close()
                print(f"{name:>12}: {per_call[name] / 1000:7.1f} k instructions per call", flush=True)
        finally:
            stop(upstream)
            if receiver is not None:
                receiver.stop()
    for name, floor in [*FLOOR_OF.items(), *((n, f) for n, (f, _) in BESIDE.items())]:
        if name in per_call and floor in per_call:
            print(f"{name} / {floor}: {per_call[name] / per_call[floor]:.2f}x the instructions per call")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "calls":
        import uvloop

        print(uvloop.run(_calls(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        sys.exit(main())
