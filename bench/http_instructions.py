"""User-space instructions per proxied HTTP request, sidecar against HAProxy, counted by valgrind.

Throughput on this machine moves by 10 % from one minute to the next; an instruction count does not. This
runs the sidecar (and HAProxy, the baseline) under ``valgrind --tool=callgrind`` in front of nginx, sends
``--requests`` GETs over 8 keep-alive connections after a warm-up, and reads the count of instructions the
proxy's process executed in user space for them (the kernel's share, the reads and writes, is not counted:
see ``http_overhead.py`` for time). Use it to compare two versions of the hot path: a change of 1 % shows.
HAProxy's count is printed beside it as a reference point, not as a target: measured here, HAProxy executes
about as many instructions per request as the sidecar and still serves twice the requests per second, its
instructions being cheaper (compiled C over compact buffers, against Python objects on the heap).

Needs valgrind and nginx (``apt-get install -y valgrind nginx haproxy``); takes about a minute.

    .venv/bin/python bench/http_instructions.py [--requests 2000] [--admission] [--concurrency]

``--admission`` gives the sidecar's listener a request rate limit it never reaches (admission, issue 12):
the cost of the request gate on every request. ``--concurrency`` gives its upstream a probing concurrency
block whose limit the 8 connections never reach (execution control, issues 12 and 26): the cost of the
ticket gate and the prober on every request.
"""

from __future__ import annotations

import argparse
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from common import free_port, wait_port
from http_overhead import ROOT, haproxy_conf, nginx_conf, sidecar_conf, start, stop


def get(port: int, n: int, connections: int) -> None:
    """``n`` GETs over ``connections`` keep-alive connections, one request in flight on each."""
    req = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    sel = selectors.DefaultSelector()
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    sent = done = 0
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sel.register(s, selectors.EVENT_READ)
        if sent < n:
            s.sendall(req)
            sent += 1
    while done < n:
        for key, _ in sel.select(30):
            s = key.fileobj
            data = s.recv(65536)  # nginx's small answer comes in one piece
            if not data.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {data[:80]!r}")
            done += 1
            if sent < n:
                s.sendall(req)
                sent += 1
    for s in socks:
        s.close()


def count(name: str, cmd: list[str], port: int, out: Path, n: int, start_timeout: float = 120) -> float:
    """Instructions per request of ``cmd`` (listening on ``port``) for ``n`` requests after a warm-up."""
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_port(port, proc, timeout=start_timeout)  # under valgrind, start-up is slow
        get(port, 300, 8)  # warm up: connections, pools, caches
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
        get(port, n, 8)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        stop(proc)
    dumps = sorted(out.parent.glob(out.name + ".*"))
    if not dumps:
        raise RuntimeError(f"{name}: callgrind wrote no dump")
    m = re.search(r"^summary: (\d+)$", dumps[-1].read_text(errors="replace"), re.M)
    if m is None:
        raise RuntimeError(f"{name}: no summary in {dumps[-1]}")
    return int(m.group(1)) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument(
        "--start-timeout", type=float, default=120, help="seconds to wait for a proxy to start under valgrind"
    )
    ap.add_argument(
        "--admission", action="store_true", help="give the listener a request rate limit it never reaches"
    )
    ap.add_argument(
        "--concurrency", action="store_true", help="give the upstream a concurrency block it never fills"
    )
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "nginx", "haproxy", "taskset"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install -y valgrind nginx haproxy", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="sidecar-instr-") as t:
        tmp = Path(t)
        up, hp, sp = free_port(), free_port(), free_port()
        nginx = start(["nginx", "-c", str(nginx_conf(tmp, up))], 1)
        try:
            wait_port(up, nginx)
            conf = sidecar_conf(tmp, sp, up)
            if args.admission:
                text = conf.read_text().replace("policy: http-default}", "policy: http-default, admission: gate}")
                conf.write_text(text + "admission:\n  gate: {requests: {rate: 1000000000, burst: 1s}}\n")
            if args.concurrency:  # 32 tickets, 16 for reads: 8 connections, one GET each in flight
                text = conf.read_text().replace('"]}', '"], concurrency: {mode: probing, initial: 32}}')
                conf.write_text(text)
            sidecar = [str(ROOT / ".venv" / "bin" / "sidecar"), "run", "-c", str(conf)]
            per = {
                "haproxy": count(
                    "haproxy",
                    ["haproxy", "-f", str(haproxy_conf(tmp, hp, up))],
                    hp,
                    tmp / "h",
                    args.requests,
                    args.start_timeout,
                ),
                "sidecar": count(
                    "sidecar",
                    [*sidecar, "--log-level", "warning"],
                    sp,
                    tmp / "s",
                    args.requests,
                    args.start_timeout,
                ),
            }
        finally:
            stop(nginx)
    for name, v in per.items():
        print(f"{name:8} {v:9,.0f} user-space instructions per request")
    print(
        f"sidecar/HAProxy: {per['sidecar'] / per['haproxy']:.2f} (instructions, not time: HAProxy's run faster,"
        " so compare the sidecar with itself across changes; http_overhead.py measures time)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
