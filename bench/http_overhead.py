"""HTTP overhead of the sidecar against nginx direct and HAProxy, on loopback, in one run.

    .venv/bin/python bench/http_overhead.py [--runs 3] [--duration 8] [--connections 32]

Needs wrk, nginx and haproxy (Debian packages: ``apt-get install -y wrk nginx haproxy``). nginx answers
``200 ok`` (one worker); HAProxy (one thread, ``retries 2``, ``retry-on all-retryable-errors``, keep-alive
reuse) and the sidecar (``sidecar run``, uvloop, the ``http-default`` policy: 3 attempts, per-try timeout,
deadline, throttle) both forward to it. The proxy under test is pinned to CPU 0, nginx and wrk to CPU 1.

Throughput: wrk closed loop, ``--connections`` connections. Latency: wrk paced to ~1,000 requests/s
(10 connections, one request per 10 ms each) and the p50 compared with direct. Memory: the sidecar's peak
RSS. Each figure is the median of ``--runs`` runs, targets interleaved; the spread (min-max) is reported.
Writes ``bench/results/http.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "http.json"
PACE_LUA = "function delay()\n  return 10\nend\n"


def nginx_conf(tmp: Path, port: int) -> Path:
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"""worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  keepalive_requests 100000000; keepalive_timeout 300s;
  server {{ listen 127.0.0.1:{port} backlog=4096; location / {{ return 200 "ok\\n"; }} }}
}}
"""
    )
    return conf


def haproxy_conf(tmp: Path, port: int, upstream: int) -> Path:
    conf = tmp / "haproxy.cfg"
    conf.write_text(
        f"""global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  retries 2
  retry-on all-retryable-errors
  option http-keep-alive
  http-reuse always
frontend fe
  bind 127.0.0.1:{port}
  default_backend be
backend be
  server s1 127.0.0.1:{upstream} maxconn 1000
"""
    )
    return conf


def sidecar_conf(tmp: Path, port: int, upstream: int) -> Path:
    conf = tmp / "sidecar.yaml"
    conf.write_text(
        f"""admin: {{listen: null}}
upstreams:
  nginx: {{endpoints: ["127.0.0.1:{upstream}"]}}
listeners:
  - {{name: bench, protocol: http, listen: "127.0.0.1:{port}", upstream: nginx, policy: http-default}}
"""
    )
    return conf


def start(cmd: list[str], cpu: int, **kw) -> subprocess.Popen:  # noqa: ANN003
    return subprocess.Popen(
        ["taskset", "-c", str(cpu), *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw
    )


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wrk(port: int, duration: float, connections: int, script: Path | None = None) -> dict:
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency"]
    if script is not None:
        cmd += ["-s", str(script)]
    out = subprocess.run(
        [*cmd, f"http://127.0.0.1:{port}/"], capture_output=True, text=True, check=True
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {q: _ms(re.search(rf"^\s+{q}%\s+(\S+)", out, re.M).group(1)) for q in ("50", "99")}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": rps,
        "p50_ms": lat["50"],
        "p99_ms": lat["99"],
        "non2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": sock.group(1) if sock else "",
    }


def _ms(v: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", v)
    n, unit = float(m.group(1)), m.group(2)
    return n / 1000 if unit == "us" else n * 1000 if unit == "s" else n


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_pid(p: subprocess.Popen) -> int:
    """taskset execs the command: the pid is the command's own."""
    return p.pid


def med(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--connections", type=int, default=32)
    args = ap.parse_args()
    for tool in ("wrk", "nginx", "haproxy", "taskset"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install -y wrk nginx haproxy", file=sys.stderr)
            return 2
    sidecar_bin = str(ROOT / ".venv" / "bin" / "sidecar")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as t:
        tmp = Path(t)
        ports = {"direct": free_port(), "haproxy": free_port(), "sidecar": free_port()}
        try:
            procs.append(start(["nginx", "-c", str(nginx_conf(tmp, ports["direct"]))], 1))
            wait_port(ports["direct"], procs[-1])
            procs.append(
                start(["haproxy", "-f", str(haproxy_conf(tmp, ports["haproxy"], ports["direct"]))], 0)
            )
            wait_port(ports["haproxy"], procs[-1])
            env = {**os.environ, "PYTHONOPTIMIZE": "1"}
            sidecar = start(
                [
                    sidecar_bin,
                    "run",
                    "-c",
                    str(sidecar_conf(tmp, ports["sidecar"], ports["direct"])),
                    "--log-level",
                    "warning",
                ],
                0,
                env=env,
            )
            procs.append(sidecar)
            wait_port(ports["sidecar"], sidecar)
            pace = tmp / "pace.lua"
            pace.write_text(PACE_LUA)
            for name in ports:  # warm up (connections, pools, caches)
                wrk(ports[name], 2, args.connections)
            runs: dict[str, dict[str, list[dict]]] = {n: {"throughput": [], "paced": []} for n in ports}
            for i in range(args.runs):
                for name, port in ports.items():
                    r = wrk(port, args.duration, args.connections)
                    runs[name]["throughput"].append(r)
                    print(
                        f"run {i + 1} {name:8} throughput {r['rps']:9.0f} req/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms",
                        flush=True,
                    )
                for name, port in ports.items():
                    r = wrk(port, args.duration, 10, pace)
                    runs[name]["paced"].append(r)
                    print(
                        f"run {i + 1} {name:8} paced      {r['rps']:9.0f} req/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms",
                        flush=True,
                    )
            rss = rss_peak_mb(child_pid(sidecar))
        finally:
            for p in reversed(procs):
                stop(p)
    summary = summarize(runs, rss, args)
    summary["sidecar_build"] = subprocess.run(
        [sidecar_bin, "version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary)
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


def summarize(runs: dict, rss: float, args: argparse.Namespace) -> dict:
    out: dict = {
        "runs": args.runs,
        "duration_s": args.duration,
        "connections": args.connections,
        "targets": {},
    }
    for name, r in runs.items():
        tp = [x["rps"] for x in r["throughput"]]
        out["targets"][name] = {
            "rps_median": med(tp),
            "rps_min": min(tp),
            "rps_max": max(tp),
            "p50_ms_at_c": med([x["p50_ms"] for x in r["throughput"]]),
            "p99_ms_at_c": med([x["p99_ms"] for x in r["throughput"]]),
            "paced_rps": med([x["rps"] for x in r["paced"]]),
            "paced_p50_ms": med([x["p50_ms"] for x in r["paced"]]),
            "paced_p50_ms_min": min(x["p50_ms"] for x in r["paced"]),
            "paced_p50_ms_max": max(x["p50_ms"] for x in r["paced"]),
            "paced_p99_ms": med([x["p99_ms"] for x in r["paced"]]),
            "non2xx": sum(x["non2xx"] for x in r["throughput"] + r["paced"]),
        }
    t = out["targets"]
    out["sidecar_vs_haproxy"] = t["sidecar"]["rps_median"] / t["haproxy"]["rps_median"]
    out["haproxy_vs_direct"] = t["haproxy"]["rps_median"] / t["direct"]["rps_median"]
    out["sidecar_added_p50_ms_at_1k"] = t["sidecar"]["paced_p50_ms"] - t["direct"]["paced_p50_ms"]
    out["haproxy_added_p50_ms_at_1k"] = t["haproxy"]["paced_p50_ms"] - t["direct"]["paced_p50_ms"]
    out["sidecar_rss_peak_mb"] = rss
    return out


def print_table(s: dict) -> None:
    print(
        f"\n{'target':10} {'req/s (median, min-max)':>28} {'p50 ms':>8} {'p99 ms':>8} {'@1k p50':>9} {'@1k p99':>9}"
    )
    for name, t in s["targets"].items():
        rng = f"{t['rps_median']:.0f} ({t['rps_min']:.0f}-{t['rps_max']:.0f})"
        print(
            f"{name:10} {rng:>28} {t['p50_ms_at_c']:8.3f} {t['p99_ms_at_c']:8.3f} {t['paced_p50_ms']:9.3f} {t['paced_p99_ms']:9.3f}"
        )
    print(
        f"sidecar/HAProxy throughput {100 * s['sidecar_vs_haproxy']:.0f}%; added p50 at ~1k req/s: sidecar "
        f"{s['sidecar_added_p50_ms_at_1k']:.3f} ms, HAProxy {s['haproxy_added_p50_ms_at_1k']:.3f} ms; "
        f"sidecar peak RSS {s['sidecar_rss_peak_mb']:.1f} MB; {s['sidecar_build']}"
    )


if __name__ == "__main__":
    sys.exit(main())
