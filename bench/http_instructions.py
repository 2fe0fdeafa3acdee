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
        [--console off|idle|armed|watched]

``--admission`` gives the sidecar's listener a request rate limit it never reaches (admission, issue 12):
the cost of the request gate on every request.

``--upstream`` (issue 21, upstreams by name): ``static`` (the default) is one IP literal; ``static3`` three IP
literals (nginx on 127.0.0.2, .3 and .4: the balancer's power of two choices among three); ``name3`` one name
that a real DNS server (dnsmasq, from Debian's ``dnsmasq-base``) resolves to those three addresses, every
address an endpoint, re-resolved every second while the requests run. HAProxy gets the same servers.

``--console`` (issue 25) says what of the admin port's console runs: ``off`` (no admin port unless
``--upstream`` needs one for ``/readyz``, as by default here), ``idle`` (the admin port on, the console's sampler ticking once a second, nobody looking: the tap is
not recording), ``armed`` (the tap records every request: someone reads it), ``watched`` (armed, and also
the instructions of one refresh of the page, and of one tapped request served to ``sidecar tap``: under
valgrind the sidecar serves a hundred requests a second, so a reader polling by the clock would weigh on
each request fifty times more than at full speed; these two are counted apart, and the cost at 1,000
requests/s is worked out from them).
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
import threading
import urllib.request
from collections.abc import Callable
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


class Callgrind:
    """A process under callgrind whose instructions are counted for one stretch of work at a time."""

    def __init__(self, name: str, cmd: list[str], port: int, out: Path, start_timeout: float) -> None:
        self.name = name
        self.out = out
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_port(port, self.proc, timeout=start_timeout)  # under valgrind, start-up is slow
        except BaseException:
            stop(self.proc)
            raise

    def measure(self, work: Callable[[], None]) -> int:
        """The instructions the process executed while ``work()`` ran."""
        pid = str(self.proc.pid)
        subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
        work()
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        dumps = sorted(self.out.parent.glob(self.out.name + ".*"), key=lambda p: p.stat().st_mtime)
        if not dumps:
            raise RuntimeError(f"{self.name}: callgrind wrote no dump")
        m = re.search(r"^summary: (\d+)$", dumps[-1].read_text(errors="replace"), re.M)
        if m is None:
            raise RuntimeError(f"{self.name}: no summary in {dumps[-1]}")
        return int(m.group(1))

    def close(self) -> None:
        stop(self.proc)


class Console:
    """The console of the sidecar's admin port, read as the page and ``sidecar tap`` read it."""

    def __init__(self, admin: int) -> None:
        self.admin = admin
        self.series = -1
        self.tap = -1

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}{path}", timeout=60) as r:
            return json.loads(r.read())

    def page(self) -> None:
        """One refresh of the page: the sidecar's state, the new points, the newest 100 requests of the tap."""
        self.get("/api/state")
        self.series = self.get(f"/api/series?since={self.series}")["next"] - 1
        self.tap = self.get(f"/api/tap?since={self.tap}&limit=100")["next"]

    def keep_armed(self, done: threading.Event) -> None:
        """A reader's request every 10 s keeps the tap recording (it stops 30 s after the last one)."""
        while not done.wait(10.0):
            self.get("/api/tap?limit=0")


def count(
    name: str,
    cmd: list[str],
    port: int,
    out: Path,
    n: int,
    start_timeout: float = 120,
    console: str = "off",
    admin: int | None = None,
) -> dict[str, float]:
    """Instructions per request of ``cmd`` (listening on ``port``) for ``n`` requests after a warm-up; with the
    console ``armed`` or ``watched``, also what reading it costs (``watched``: per page refresh, and per
    tapped request served to ``sidecar tap``)."""
    proc = Callgrind(name, cmd, port, out, start_timeout)
    try:
        if admin is not None:
            wait_ready(admin, proc.proc, timeout=start_timeout)
        reader = Console(admin) if admin is not None and console in ("armed", "watched") else None
        if reader is not None:
            reader.get("/api/tap?limit=0")
        get(port, 300, 8)  # warm up: connections, pools, caches
        done = threading.Event()
        keeper = threading.Thread(target=reader.keep_armed, args=(done,), daemon=True) if reader else None
        if keeper is not None:
            keeper.start()
        try:
            result = {"request": proc.measure(lambda: get(port, n, 8)) / n}
        finally:
            done.set()
        if reader is not None and console == "watched":
            reader.page()  # the first refresh reads all it can; the measured ones read what a second brings
            get(port, 100, 8)
            pages = 10

            def refreshes() -> None:
                for _ in range(pages):
                    get(port, 100, 8)  # what a second brings at 100 requests/s
                    reader.page()

            both = proc.measure(refreshes)
            alone = proc.measure(lambda: [get(port, 100, 8) for _ in range(pages)])
            result["page refresh"] = (both - alone) / pages
            served = 0

            def stream() -> None:
                nonlocal served
                for _ in range(5):
                    served += len(reader.get("/api/tap?since=-1&limit=1000")["records"])

            result["tapped request served"] = proc.measure(stream) / served
        return result
    finally:
        proc.close()


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
    ap.add_argument(
        "--console",
        choices=("off", "idle", "armed", "watched"),
        default="off",
        help="off: no admin port; idle: the admin port and its console, nobody looking; armed: the tap "
        "recording every request; watched: armed, and the cost of a page refresh and of a tapped request served",
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
                if args.console != "off":
                    admin = free_port()
                    text = conf.read_text().replace(
                        "admin: {listen: null}", f'admin: {{listen: "127.0.0.1:{admin}"}}'
                    )
                    conf.write_text(text)
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
                    args.console,
                    admin,
                ),
            }
        finally:
            stop(nginx)
            if dns is not None:
                stop(dns)
                shutil.rmtree(server.hosts.parent, ignore_errors=True)
    print(f"upstream: {args.upstream}" + (" (admission)" if args.admission else ""))
    haproxy, sidecar_ = per["haproxy"], per["sidecar"]
    print(f"haproxy  {haproxy['request']:9,.0f} user-space instructions per request")
    print(
        f"sidecar  {sidecar_['request']:9,.0f} user-space instructions per request (console: {args.console})"
    )
    print(
        f"sidecar/HAProxy: {sidecar_['request'] / haproxy['request']:.2f} (instructions, not time: HAProxy's run"
        " faster, so compare the sidecar with itself across changes; http_overhead.py measures time)"
    )
    if "page refresh" in sidecar_:
        page, served = sidecar_["page refresh"], sidecar_["tapped request served"]
        print(f"console: {page:,.0f} instructions per page refresh (once a second while the page is open)")
        print(f"console: {served:,.0f} instructions per tapped request served to sidecar tap (or the page)")
        print(
            "console: at 1,000 requests/s with the page open and sidecar tap given every request, a request costs"
            f" {sidecar_['request'] + page / 1000 + served:,.0f} instructions"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
