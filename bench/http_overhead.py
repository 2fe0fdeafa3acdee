"""HTTP overhead of the sidecar against nginx direct and HAProxy, on loopback, in one run.

    .venv/bin/python bench/http_overhead.py [--runs 3] [--duration 8] [--connections 32] [--no-tls]

Needs wrk, nginx and haproxy (Debian packages: ``apt-get install -y wrk nginx haproxy``). nginx answers
``200 ok`` (one worker); HAProxy (one thread, ``retries 2``, ``retry-on all-retryable-errors``, keep-alive
reuse) and the sidecar (``sidecar run``, uvloop, the ``http-default`` policy: 3 attempts, per-try timeout,
deadline, throttle) both forward to it. The proxy under test is pinned to CPU 0, nginx and wrk to CPU 1.

TLS origination (issue 22; ``--no-tls`` skips it): wrk sends plain HTTP to a proxy that reaches nginx over
TLS (a certificate made by trustme at run time, verified against its CA, keep-alive reuse): HAProxy
(``ssl verify required ca-file ...``, ``http-reuse always``) as ``haproxy-tls`` and the sidecar (an
``https://`` endpoint with ``tls.ca_file``) as ``sidecar-tls``, each on one core as above (the same nginx,
whose plain port is ``direct``). The goal: the sidecar at >= 0.5 of HAProxy over TLS.

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


def nginx_conf(tmp: Path, port: int, tls_port: int | None = None) -> Path:
    conf = tmp / "nginx.conf"
    tls = (
        f"  server {{ listen 127.0.0.1:{tls_port} ssl backlog=4096; ssl_certificate {tmp}/server.pem; "
        f'ssl_certificate_key {tmp}/server.key; location / {{ return 200 "ok\\n"; }} }}\n'
        if tls_port is not None
        else ""
    )
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
{tls}}}
"""
    )
    return conf


def certificates(tmp: Path) -> Path:
    """A CA and nginx's certificate for ``bench.test`` from it (trustme, made now); returns the CA file."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("bench.test")
    ca.cert_pem.write_to_path(tmp / "ca.pem")
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(tmp / "server.pem", append=i > 0)
    cert.private_key_pem.write_to_path(tmp / "server.key")
    return tmp / "ca.pem"


def haproxy_tls_conf(tmp: Path, port: int, upstream: int, ca: Path) -> Path:
    """HAProxy as ``haproxy_conf``, its server reached over TLS and verified (as bench.test)."""
    conf = haproxy_conf(tmp, port, upstream)
    server = f"  server s1 127.0.0.1:{upstream} maxconn 1000\n"
    tls = f"  server s1 127.0.0.1:{upstream} ssl verify required ca-file {ca} sni str(bench.test) verifyhost bench.test maxconn 1000\n"
    target = tmp / "haproxy-tls.cfg"
    target.write_text(conf.read_text().replace(server, tls))
    return target


def sidecar_tls_conf(tmp: Path, port: int, upstream: int, ca: Path) -> Path:
    """The sidecar as ``sidecar_conf``, its upstream an ``https://`` endpoint verified as bench.test."""
    conf = tmp / "sidecar-tls.yaml"
    conf.write_text(
        f"""admin: {{listen: null}}
upstreams:
  nginx: {{endpoints: ["https://127.0.0.1:{upstream}"], tls: {{ca_file: "{ca}", server_name: bench.test}}}}
listeners:
  - {{name: bench, protocol: http, listen: "127.0.0.1:{port}", upstream: nginx, policy: http-default}}
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
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS origination rows")
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
        tls_port = None if args.no_tls else free_port()
        if tls_port is not None:
            ports.update({"haproxy-tls": free_port(), "sidecar-tls": free_port()})
        try:
            ca = certificates(tmp) if tls_port is not None else None
            procs.append(start(["nginx", "-c", str(nginx_conf(tmp, ports["direct"], tls_port))], 1))
            wait_port(ports["direct"], procs[-1])
            procs.append(
                start(["haproxy", "-f", str(haproxy_conf(tmp, ports["haproxy"], ports["direct"]))], 0)
            )
            wait_port(ports["haproxy"], procs[-1])
            env = {**os.environ, "PYTHONOPTIMIZE": "1"}

            def run_sidecar(conf: Path, port: int) -> subprocess.Popen:
                p = start([sidecar_bin, "run", "-c", str(conf), "--log-level", "warning"], 0, env=env)
                procs.append(p)
                wait_port(port, p, timeout=60)  # a loaded machine imports slowly
                return p

            sidecar = run_sidecar(sidecar_conf(tmp, ports["sidecar"], ports["direct"]), ports["sidecar"])
            if tls_port is not None and ca is not None:
                wait_port(tls_port, procs[0])
                haproxy_tls = haproxy_tls_conf(tmp, ports["haproxy-tls"], tls_port, ca)
                procs.append(start(["haproxy", "-f", str(haproxy_tls)], 0))
                wait_port(ports["haproxy-tls"], procs[-1])
                run_sidecar(sidecar_tls_conf(tmp, ports["sidecar-tls"], tls_port, ca), ports["sidecar-tls"])
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
    if "sidecar-tls" in t:
        out["sidecar_tls_vs_haproxy_tls"] = t["sidecar-tls"]["rps_median"] / t["haproxy-tls"]["rps_median"]
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
    if "sidecar_tls_vs_haproxy_tls" in s:
        print(
            f"TLS origination (plain HTTP in, TLS to nginx): sidecar/HAProxy throughput "
            f"{100 * s['sidecar_tls_vs_haproxy_tls']:.0f}% (goal: >= 50%)"
        )


if __name__ == "__main__":
    sys.exit(main())
