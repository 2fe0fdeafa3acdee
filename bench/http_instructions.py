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

    .venv/bin/python bench/http_instructions.py [--requests 2000] [--admission] [--upstream static|static3|name3]

``--admission`` gives the sidecar's listener a request rate limit it never reaches (admission, issue 12):
the cost of the request gate on every request.

``--upstream`` (issue 21, upstreams by name): ``static`` (the default) is one IP literal; ``static3`` three IP
literals (nginx on 127.0.0.2, .3 and .4: the balancer's power of two choices among three); ``name3`` one name
that a real DNS server (dnsmasq, from Debian's ``dnsmasq-base``) resolves to those three addresses, every
address an endpoint, re-resolved every second while the requests run. HAProxy gets the same servers.
"""

from __future__ import annotations

import argparse
import json
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

#: The three addresses of ``--upstream static3`` and ``name3``.
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def nginx_on(tmp: Path, port: int, hosts: tuple[str, ...]) -> Path:
    """``nginx_conf`` listening on ``port`` of each of ``hosts``."""
    conf = nginx_conf(tmp, port)
    listen = f"listen 127.0.0.1:{port} backlog=4096;"
    conf.write_text(
        conf.read_text().replace(listen, " ".join(f"listen {h}:{port} backlog=4096;" for h in hosts))
    )
    return conf


def haproxy_on(tmp: Path, port: int, upstream: int, hosts: tuple[str, ...]) -> Path:
    conf = haproxy_conf(tmp, port, upstream)
    one = f"  server s1 127.0.0.1:{upstream} maxconn 1000\n"
    servers = "".join(f"  server s{i} {h}:{upstream} maxconn 1000\n" for i, h in enumerate(hosts, 1))
    conf.write_text(conf.read_text().replace(one, "  balance leastconn\n" + servers))
    return conf


def sidecar_on(tmp: Path, port: int, endpoints: list[str], admin: int, nameserver: str | None) -> Path:
    """The sidecar of ``sidecar_conf`` in front of ``endpoints``, with an admin port (for ``/readyz``)."""
    conf = sidecar_conf(tmp, port, 0)
    text = conf.read_text().replace("admin: {listen: null}", f'admin: {{listen: "127.0.0.1:{admin}"}}')
    text = text.replace('["127.0.0.1:0"]', json.dumps(endpoints))
    if nameserver is not None:
        text = f'resolver: {{nameservers: ["{nameserver}"]}}\n' + text
        # resolved at start and not again during the measurement: the request path alone is counted (a
        # refresh every 5 s, spread over a real request rate, is far below one instruction per request; under
        # valgrind, 50 times slower, it would land on every few requests)
        text = text.replace(json.dumps(endpoints) + "}", json.dumps(endpoints) + ", dns: {refresh: 1h}}")
    conf.write_text(text)
    return conf


def wait_ready(admin: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``/readyz`` says 200 (its names resolved once)."""
    import time
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("the sidecar exited before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the sidecar never became ready")


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


def count(
    name: str,
    cmd: list[str],
    port: int,
    out: Path,
    n: int,
    start_timeout: float = 120,
    admin: int | None = None,
) -> float:
    """Instructions per request of ``cmd`` (listening on ``port``) for ``n`` requests after a warm-up
    (``admin``: wait for its ``/readyz`` first)."""
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_port(port, proc, timeout=start_timeout)  # under valgrind, start-up is slow
        if admin is not None:
            wait_ready(admin, proc, timeout=start_timeout)
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


def wait_on(host: str, port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """``wait_port`` for a server on another loopback address."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port}")


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
        "--upstream",
        choices=("static", "static3", "name3"),
        default="static",
        help="one IP literal, three, or a name resolving to three addresses (dnsmasq)",
    )
    args = ap.parse_args()
    tools = ["valgrind", "callgrind_control", "nginx", "haproxy", "taskset"]
    if args.upstream == "name3":
        from sidecar.testing.dns_server import binary

        try:
            binary()
        except RuntimeError:
            print("dnsmasq is missing: apt-get install -y dnsmasq-base", file=sys.stderr)
            return 2
    for tool in tools:
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install -y valgrind nginx haproxy", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="sidecar-instr-") as t:
        tmp = Path(t)
        up, hp, sp = free_port(), free_port(), free_port()
        hosts = ("127.0.0.1",) if args.upstream == "static" else HOSTS
        nginx = start(["nginx", "-c", str(nginx_on(tmp, up, hosts))], 1)
        dns = None
        admin: int | None = None
        try:
            wait_on(hosts[0], up, nginx)
            if args.upstream == "static":
                conf = sidecar_conf(tmp, sp, up)
            else:
                admin = free_port()
                nameserver = None
                endpoints = [f"{h}:{up}" for h in hosts]
                if args.upstream == "name3":
                    from sidecar.testing.dns_server import DnsServer

                    server = DnsServer({"orders.test": list(HOSTS)}, ttl=1)
                    dns = start(server.command(), 1)
                    nameserver, endpoints = server.address, [f"orders.test:{up}"]
                conf = sidecar_on(tmp, sp, endpoints, admin, nameserver)
            if args.admission:
                text = conf.read_text().replace(
                    "policy: http-default}", "policy: http-default, admission: gate}"
                )
                conf.write_text(text + "admission:\n  gate: {requests: {rate: 1000000000, burst: 1s}}\n")
            sidecar = [str(ROOT / ".venv" / "bin" / "sidecar"), "run", "-c", str(conf)]
            per = {
                "haproxy": count(
                    "haproxy",
                    ["haproxy", "-f", str(haproxy_on(tmp, hp, up, hosts))],
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
                    admin,
                ),
            }
        finally:
            stop(nginx)
            if dns is not None:
                stop(dns)
                shutil.rmtree(server.hosts.parent, ignore_errors=True)
    print(f"upstream: {args.upstream}" + (" (admission)" if args.admission else ""))
    for name, v in per.items():
        print(f"{name:8} {v:9,.0f} user-space instructions per request")
    print(
        f"sidecar/HAProxy: {per['sidecar'] / per['haproxy']:.2f} (instructions, not time: HAProxy's run faster,"
        " so compare the sidecar with itself across changes; http_overhead.py measures time)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
