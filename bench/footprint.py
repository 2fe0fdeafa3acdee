"""What one sidecar costs a pod: memory at rest, time to ready, memory under load, per configuration.

    .venv/bin/python bench/footprint.py [--starts 3] [--load 8] [--only http,grpc]   # the .venv's sidecar
    make image && bash -c '. deploy/ci/podman.sh && .venv/bin/python bench/footprint.py \
        --image localhost/retry-sidecar:dev --out footprint-image'   # the image's (podman as make image runs it)
    .venv/bin/python bench/footprint.py --only http --load 0 --starts 7 --against OTHER/.venv --out footprint-start

Configurations (issue 27), each a real ``sidecar run`` process, in front of real upstreams on 127.0.0.1
(nginx for HTTP; the project's gRPC upstream and MongoDB test server):

- ``http``: one HTTP listener and its upstream, nothing else (the admin port on, for ``/readyz``);
- ``grpc``: one gRPC listener; ``mongodb``: one MongoDB listener;
- ``all``: the three, traces exported over OTLP/gRPC to a real receiver (every span it gets is counted), an
  admission profile on each listener, and fleet-wide budgets settled with a real ``redis-server``.

The sidecar is a venv's (``--venv``, default .venv: what ``make install`` built) or, with ``--image``, the
image's, run by podman as a pod runs it (read-only, uid 10001, no capabilities, the host's network); either
way its memory and CPU time are read from this host's /proc for the sidecar's own process.

Each configuration is started ``--starts`` times (the figures are the median, the spread min..max). One
start: exec ``sidecar run`` (or ``podman run``); poll ``/readyz`` every 2 ms until 200 (the time from exec to
ready; and the CPU time the process used until then, which a busy machine disturbs less); wait a second;
read ``VmRSS`` (idle RSS; and ``RssAnon``, its private part: the rest is pages of files that every process
mapping them shares); send one request through each listener and read it again (RSS after one request
each: what was left for the first request to load shows here); for ``http``, then bench/http_overhead.py's
load (wrk: 32 connections closed loop for ``--load`` seconds, then 10 connections paced at ~1,000
requests/s) and ``VmHWM`` (peak RSS). Between starts, ``python -c pass`` is timed the same way (with
``podman run`` for an image): the floor any Python process pays here, in the same run. One more start per
configuration with ``PYTHONPROFILEIMPORTTIME=1`` (not timed: it slows imports) lists the heavy packages the
process imported, from the interpreter's own record. ``--against VENV`` then starts the http configuration
of that other build (main's, in a venv of its own) and of this one alternately, ``--starts`` times each, and
reports both medians and their ratio: the start-time comparison, made in one run.

Needs nginx, wrk and redis-server (``apt-get install -y nginx wrk redis-server``), and podman for
``--image``. Writes ``bench/results/<--out>.json`` (the table in bench/README.md: ``run_all.py --table-only``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import OtlpReceiver, free_port, machine, say, show, spread, wait_port, write
from http_overhead import PACE_LUA, ROOT, nginx_conf, stop, wrk

sys.path.insert(0, str(ROOT))
from sidecar.testing.imports import HEAVY, import_seconds, imported, loaded_heavy  # noqa: E402

VENV = ROOT / ".venv"
CONFIGS = ("http", "grpc", "mongodb", "all")
GOALS = {"http": 45.0, "grpc": 55.0, "mongodb": 50.0, "all": 75.0}  # idle RSS, MB (issue 27)
PEAK_GOAL = 55.0  # peak RSS under load, HTTP only, MB


# -- the upstreams: nginx, and one helper process (gRPC upstream, OTLP receiver, MongoDB test server) -----
async def _serve_upstreams() -> None:
    """``--upstreams``: run the gRPC upstream, an OTLP trace receiver and a MongoDB test server; print their
    ports as one JSON line; run until SIGTERM."""
    import asyncio

    from sidecar.testing.grpc_upstream import GrpcUpstream
    from sidecar.testing.mongo.server import MongoTestServer

    otlp = OtlpReceiver()
    otlp_port = await otlp.start()
    grpc_up = await GrpcUpstream(keep_records=False).start()
    mongo = await MongoTestServer("mongos", record=False).start()
    print(json.dumps({"grpc": grpc_up.port, "otlp": otlp_port, "mongodb": mongo.port}), flush=True)
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop_event.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: print(json.dumps({"exports": otlp.exports}), flush=True))
    await stop_event.wait()
    await grpc_up.stop()
    await mongo.stop()
    await otlp.stop()


class Upstreams:
    def __init__(self, tmp: Path) -> None:
        self.procs: list[subprocess.Popen] = []
        self.http = free_port()
        nginx = subprocess.Popen(
            ["nginx", "-c", str(nginx_conf(tmp, self.http))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.procs.append(nginx)
        wait_port(self.http, nginx)
        helper = subprocess.Popen(
            [sys.executable, __file__, "--upstreams"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(helper)
        assert helper.stdout is not None
        line = helper.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the upstreams did not start: {helper.stderr.read() if helper.stderr else ''}"
            )
        ports = json.loads(line)
        self.helper = helper
        self.grpc, self.otlp, self.mongodb = ports["grpc"], ports["otlp"], ports["mongodb"]
        self.redis: Any = None

    def exports(self) -> int:
        """OTLP export calls the receiver has answered so far."""
        assert self.helper.stdout is not None
        self.helper.send_signal(signal.SIGUSR1)
        return int(json.loads(self.helper.stdout.readline())["exports"])

    def start_redis(self) -> str:
        from sidecar.testing.redis_server import RedisServer

        self.redis = RedisServer().start()
        return self.redis.url

    def close(self) -> None:
        if self.redis is not None:
            self.redis.kill()
        for p in reversed(self.procs):
            stop(p)


# -- the configurations ---------------------------------------------------------------------------------
def config_text(name: str, ports: dict[str, int], up: Upstreams, redis_url: str | None) -> str:
    http = f'{{name: web, protocol: http, listen: "127.0.0.1:{ports["http"]}", upstream: web'
    grpc = f'{{name: rpc, protocol: grpc, listen: "127.0.0.1:{ports["grpc"]}", upstream: rpc'
    mongo = f'{{name: db, protocol: mongodb, listen: "127.0.0.1:{ports["mongodb"]}", upstream: db'
    lines = [f'admin: {{listen: "127.0.0.1:{ports["admin"]}"}}', "upstreams:"]
    upstreams = {
        "http": f'  web: {{endpoints: ["127.0.0.1:{up.http}"]',
        "grpc": f'  rpc: {{endpoints: ["127.0.0.1:{up.grpc}"]',
        "mongodb": f'  db: {{endpoints: ["127.0.0.1:{up.mongodb}"]',
    }
    listeners = {"http": http, "grpc": grpc, "mongodb": mongo}
    protocols = list(listeners) if name == "all" else [name]
    budget = ", retry_budget: {scope: fleet, ratio: 0.2, min_per_second: 10}" if name == "all" else ""
    lines += [upstreams[p] + budget + "}" for p in protocols]
    lines.append("listeners:")
    for p in protocols:  # a gRPC listener cannot hold connections at accept: its profile limits requests only
        admission = "" if name != "all" else ", admission: calls" if p == "grpc" else ", admission: door"
        lines.append(f"  - {listeners[p]}{admission}}}")
    if name == "all":
        lines += [
            "telemetry:",
            f'  traces: {{exporter: otlp, protocol: grpc, endpoint: "http://127.0.0.1:{up.otlp}"}}',
            "admission:",
            "  door:",
            "    requests: {rate: 5000, burst: 1s, scope: fleet}",
            "    connections: {rate: 1000, burst: 1s}",
            "  calls:",
            "    requests: {rate: 5000, burst: 1s, scope: fleet}",
            "fleet:",
            f'  redis: {{url: "{redis_url}", timeout: 50ms}}',
        ]
    return "\n".join(lines) + "\n"


# -- one request through each listener ------------------------------------------------------------------
def http_request(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"HTTP through the sidecar: {data[:80]!r}")


def grpc_request(port: int) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = channel.unary_unary("/bench.Echo/Call")(b"ping", timeout=5)
    if answer != b"ping":
        raise RuntimeError(f"gRPC through the sidecar: {answer!r}")


def mongodb_request(port: int) -> None:
    import pymongo

    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=5000)
    try:
        client.bench.things.insert_one({"n": 1})
        if client.bench.things.find_one({"n": 1}) is None:
            raise RuntimeError("MongoDB through the sidecar: the document is not there")
    finally:
        client.close()


REQUESTS: dict[str, Callable[[int], None]] = {
    "http": http_request,
    "grpc": grpc_request,
    "mongodb": mongodb_request,
}


# -- measuring one process ------------------------------------------------------------------------------
def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def cpu_s(pid: int) -> float:
    """CPU time (user + system) the process has used so far: less sensitive than wall time to a busy machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Started:
    """A ``sidecar run`` process (local or in a container): its pid (on this host), its stderr, how to stop it."""

    def __init__(self, pid: int, alive: Callable[[], bool], log: Callable[[], str], stop: Callable[[], None]):
        self.pid, self.alive, self.log, self.stop = pid, alive, log, stop


def with_bytecode(environ: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    """The environment without ``PYTHONDONTWRITEBYTECODE``: the first start writes the bytecode of the
    sidecar's own modules as any install's first run does (the image ships it), so that no start measured
    compiles them from source (~0.07 s of start here)."""
    return {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


class Local:
    """``sidecar run`` of a venv, as a process of this machine."""

    def __init__(self, venv: Path) -> None:
        self.sidecar = str(venv / "bin" / "sidecar")
        self.python = str(venv / "bin" / "python")

    def version(self) -> str:
        return subprocess.run(
            [self.sidecar, "version"], capture_output=True, text=True, check=True
        ).stdout.strip()

    def floor(self) -> float:
        t0 = time.perf_counter()
        subprocess.run([self.python, "-c", "pass"], check=True, env=with_bytecode(os.environ))
        return time.perf_counter() - t0

    def start(self, conf: Path, profile: bool) -> Started:
        env = with_bytecode(os.environ)
        if profile:
            env["PYTHONPROFILEIMPORTTIME"] = "1"
        log = conf.with_suffix(".stderr")
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [self.sidecar, "run", "-c", str(conf), "--log-level", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        return Started(
            proc.pid, lambda: proc.poll() is None, lambda: log.read_text(errors="replace"), lambda: stop(proc)
        )


class Image:
    """``sidecar run`` in the image, as a pod runs it (podman: read-only, uid 10001, no capabilities, the
    host's network); memory and CPU are read from this host's /proc for the container's process."""

    SECURE = ("--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges", "--user", "10001:10001")

    def __init__(self, image: str) -> None:
        self.image = image

    def podman(self, *args: str) -> str:
        return subprocess.run(["podman", *args], capture_output=True, text=True, check=True).stdout.strip()

    def version(self) -> str:
        return self.podman("run", "--rm", *self.SECURE, self.image, "version") + f" (image {self.image})"

    def floor(self) -> float:
        t0 = time.perf_counter()
        self.podman(
            "run",
            "--rm",
            *self.SECURE,
            "--network",
            "host",
            "--entrypoint",
            "python3",
            self.image,
            "-c",
            "pass",
        )
        return time.perf_counter() - t0

    def start(self, conf: Path, profile: bool) -> Started:
        env = ["-e", "PYTHONPROFILEIMPORTTIME=1"] if profile else []
        cid = self.podman(
            "run", "-d", "--network", "host", *self.SECURE, *env, "-v", f"{conf.parent}:/etc/sidecar:ro",
            self.image, "run", "-c", f"/etc/sidecar/{conf.name}", "--log-level", "warning",
        )  # fmt: skip
        pid = int(self.podman("inspect", "--format", "{{.State.Pid}}", cid))

        def alive() -> bool:
            return self.podman("inspect", "--format", "{{.State.Running}}", cid) == "true"

        def log() -> str:
            r = subprocess.run(["podman", "logs", cid], capture_output=True, text=True)
            return r.stderr + r.stdout

        def halt() -> None:
            subprocess.run(["podman", "rm", "-f", "-t", "10", cid], capture_output=True)

        return Started(pid, alive, log, halt)


def wait_ready(sc: Started, port: int, t0: float, timeout: float = 60.0) -> float:
    """Seconds from ``t0`` (the exec) to ``/readyz`` answering 200."""
    while not ready(port):
        if not sc.alive():
            raise RuntimeError(f"sidecar exited:\n{sc.log()[-3000:]}")
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"sidecar not ready within {timeout:g} s")
        time.sleep(0.002)
    return time.perf_counter() - t0


def one_start(
    target: Local | Image,
    name: str,
    tmp: Path,
    up: Upstreams,
    redis_url: str | None,
    load: float,
    profile: bool,
) -> dict:
    ports = {k: free_port() for k in ("admin", "http", "grpc", "mongodb")}
    conf = tmp / f"{name}.yaml"
    conf.write_text(config_text(name, ports, up, redis_url))
    t0 = time.perf_counter()
    sc = target.start(conf, profile)
    out: dict[str, Any] = {}
    try:
        out["ready_s"] = wait_ready(sc, ports["admin"], t0)
        out["cpu_s"] = cpu_s(sc.pid)
        time.sleep(1.0)  # let the loop settle (gc.freeze, the first lease) before reading memory
        out["idle_mb"] = status_mb(sc.pid, "VmRSS")
        out["idle_anon_mb"] = status_mb(sc.pid, "RssAnon")
        log_at_ready = sc.log() if profile else ""
        protocols = list(REQUESTS) if name == "all" else [name]
        exports_before = up.exports() if name == "all" else 0
        for p in protocols:
            REQUESTS[p](ports[p])
        time.sleep(0.5)
        out["after_one_mb"] = status_mb(sc.pid, "VmRSS")
        if name == "all":  # the batch processor exports within 5 s
            deadline = time.monotonic() + 15
            while up.exports() == exports_before and time.monotonic() < deadline:
                time.sleep(0.2)
            out["otlp_exports"] = up.exports() - exports_before
        if name == "http" and load > 0:
            pace = tmp / "pace.lua"
            pace.write_text(PACE_LUA)
            r = wrk(ports["http"], load, 32)
            paced = wrk(ports["http"], load, 10, pace)
            out["peak_mb"] = status_mb(sc.pid, "VmHWM")
            out["load_rps"] = r["rps"]
            out["load_errors"] = r["non2xx"] + paced["non2xx"]
        log_after = sc.log() if profile else ""
    finally:
        sc.stop()
    if profile:
        out["imports_at_ready"] = imported(log_at_ready)
        out["import_s"] = import_seconds(log_at_ready)
        out["heavy_at_ready"] = loaded_heavy(out["imports_at_ready"])
        out["heavy_after_one"] = loaded_heavy(imported(log_after))
    return out


# -- the run --------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=3, help="starts per configuration (the median is reported)")
    ap.add_argument("--load", type=float, default=8.0, help="seconds of each wrk phase (http; 0: no load)")
    ap.add_argument("--only", default=",".join(CONFIGS), help="configurations, comma-separated")
    ap.add_argument("--venv", type=Path, default=VENV, help="the venv whose sidecar runs (default: .venv)")
    ap.add_argument(
        "--image", help="run the sidecar in this image with podman instead (make image builds one)"
    )
    ap.add_argument("--out", default="footprint", help="the result's name: bench/results/NAME.json")
    ap.add_argument(
        "--against",
        type=Path,
        help="another venv (main's, say): its http configuration is started alternately with this one's, "
        "--starts times each, and the start times compared (ratios of medians, same run)",
    )
    ap.add_argument("--upstreams", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.upstreams:
        import asyncio

        asyncio.run(_serve_upstreams())
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"unknown configuration(s) {unknown}: {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    needed = (
        ["nginx", "wrk"] + (["redis-server"] if "all" in names else []) + (["podman"] if args.image else [])
    )
    missing = [t for t in needed if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if missing:
        print(f"missing {' '.join(missing)}: apt-get install -y {' '.join(missing)}", file=sys.stderr)
        return 2
    target = Image(args.image) if args.image else Local(args.venv)
    started = machine()
    build = target.version()
    say(f"{build}; {started['cores']} cores, load {started['load_at_start']}; {args.starts} starts each")
    results: dict[str, list[dict]] = {n: [] for n in names}
    profiles: dict[str, dict] = {}
    floor: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-footprint-") as t:
        tmp = Path(t)
        tmp.chmod(0o755)  # the image's sidecar (uid 10001) reads its configs here
        up = Upstreams(tmp)
        try:
            redis_url = up.start_redis() if "all" in names else None
            for n in names:  # warm the page cache (a cold venv is read from disk); write bytecode
                one_start(target, n, tmp, up, redis_url, 0, profile=False)
            for i in range(args.starts):
                for n in names:  # interleaved, so a busy minute on the machine hits every configuration
                    floor.append(target.floor())
                    r = one_start(target, n, tmp, up, redis_url, args.load, profile=False)
                    results[n].append(r)
                    say(
                        f"start {i + 1} {n:8} ready {r['ready_s']:.3f} s (CPU {r['cpu_s']:.2f} s)  idle {r['idle_mb']:.1f} MB  "
                        f"after one request each {r['after_one_mb']:.1f} MB"
                        + (f"  peak under load {r['peak_mb']:.1f} MB" if "peak_mb" in r else "")
                        + (f"  OTLP exports {r['otlp_exports']}" if "otlp_exports" in r else "")
                    )
            for n in names:
                profiles[n] = one_start(target, n, tmp, up, redis_url, 0, profile=True)
            against = compare(target, Local(args.against), tmp, up, args.starts) if args.against else None
        finally:
            up.close()
    rows, notes = table(names, results, profiles, floor)
    if against is not None:
        rows += against
        notes.append(
            f"--against {args.against}: http started alternately with this sidecar, {args.starts} each."
        )
    show(names, [r for r in rows if r["unit"]])
    for r in rows:
        if not r["unit"]:
            say(f"{r['metric']}: " + "; ".join(f"{n}: {v}" for n, v in r["values"].items()))
    for note in notes:
        say(note)
    where = f"in the image {args.image} (podman)" if args.image else f"from {args.venv}"
    write(
        args.out,
        f"What one sidecar costs a pod (issue 27), {where}",
        names,
        rows,
        notes,
        None,
        started | {"build": build},
    )
    return 0


def compare(target: Local | Image, other: Local, tmp: Path, up: Upstreams, starts: int) -> list[dict]:
    """Start times of the http configuration, this sidecar's and ``other``'s alternately (a busy minute hits
    both): the medians and their ratio."""
    mine: list[dict] = []
    theirs: list[dict] = []
    one_start(other, "http", tmp, up, None, 0, profile=False)  # warm its page cache too
    for i in range(starts):
        theirs.append(one_start(other, "http", tmp, up, None, 0, profile=False))
        mine.append(one_start(target, "http", tmp, up, None, 0, profile=False))
        say(
            f"compare {i + 1}: ready {theirs[-1]['ready_s']:.3f} s (CPU {theirs[-1]['cpu_s']:.2f}) against, "
            f"{mine[-1]['ready_s']:.3f} s (CPU {mine[-1]['cpu_s']:.2f}) this one"
        )
    rows = []
    for key, metric in (("ready_s", "exec to /readyz 200"), ("cpu_s", "CPU time until ready")):
        a, b = med([r[key] for r in theirs]), med([r[key] for r in mine])
        rows.append(
            {
                "metric": f"http, {metric}: --against / this / ratio",
                "unit": "",
                "values": {"http": f"{a:.3f} s / {b:.3f} s / {b / a:.2f}"},
            }
        )
    return rows


def med(values: list[float]) -> float:
    return statistics.median(values)


def table(
    names: list[str], results: dict, profiles: dict, floor: list[float]
) -> tuple[list[dict], list[str]]:
    def measured(key: str, metric: str, unit: str) -> dict[str, Any]:
        """A row of ``key``'s median per configuration (None where no start measured it) and spread."""
        got = {n: [r[key] for r in results[n] if key in r] for n in names}
        return {
            "metric": metric,
            "unit": unit,
            "values": {n: round(med(v), 3) if v else None for n, v in got.items()},
            "spread": {n: spread(v) for n, v in got.items()},
        }

    def measured_anywhere(key: str) -> bool:
        return any(key in r for rs in results.values() for r in rs)

    idle = measured("idle_mb", "idle RSS after start", "MB")
    idle["goal"] = "; ".join(f"{n} <= {GOALS[n]:g}" for n in names)
    idle["met"] = all(v is not None and v <= GOALS[n] for n, v in idle["values"].items())
    rows = [
        idle,
        measured(
            "idle_anon_mb", "... of which private (RssAnon: not file pages other processes share)", "MB"
        ),
        measured("after_one_mb", "RSS after one request per listener", "MB"),
    ]
    if measured_anywhere("peak_mb"):
        peak = measured("peak_mb", "peak RSS under http_overhead's load", "MB")
        peak["goal"] = f"http <= {PEAK_GOAL:g}"
        peak["met"] = peak["values"].get("http") is not None and peak["values"]["http"] <= PEAK_GOAL
        rows.append(peak)
    if measured_anywhere("load_rps"):
        rows.append(measured("load_rps", "requests/s in that load's closed loop", "req/s"))
    rows.append(measured("ready_s", "exec to /readyz 200", "s"))
    rows.append(measured("cpu_s", "CPU time until ready", "s"))
    pass_med = med(floor)
    rows.append(
        {
            "metric": "python -c pass, same run",
            "unit": "s",
            "values": {n: round(pass_med, 3) for n in names},
            "spread": {n: spread(floor) for n in names},
        }
    )
    rows.append(
        {
            "metric": "heavy packages loaded at ready",
            "unit": "",
            "values": {
                n: " ".join(profiles[n]["heavy_at_ready"]) or "none" if n in profiles else None for n in names
            },
        }
    )
    rows.append(
        {
            "metric": "... and after one request each",
            "unit": "",
            "values": {
                n: " ".join(profiles[n]["heavy_after_one"]) or "none" if n in profiles else None
                for n in names
            },
        }
    )
    notes = [
        "RSS: VmRSS of the `sidecar run` process (/proc/PID/status), shared libraries included; peak: VmHWM "
        "after wrk's 32-connection closed loop and 10-connection paced run (bench/http_overhead.py's load). "
        "RssAnon: its private pages (heap, Python objects, relocated data); the rest of VmRSS is the pages of "
        "the interpreter's and extension modules' files it touched, which every process mapping the same "
        "files (the same image's sidecars on a node) shares.",
        f"Heavy packages watched: {', '.join(HEAVY)}.",
    ]
    for n in names:
        ex = [r.get("otlp_exports") for r in results[n] if "otlp_exports" in r]
        if ex:
            notes.append(f"{n}: traces reached the OTLP receiver in every start (export calls: {ex}).")
    return rows, notes


if __name__ == "__main__":
    sys.exit(main())
