"""The HTTP differential suite: the same request sent directly to a third-party server and through the
sidecar must give the same answer (status, body bytes, end-to-end headers), minus what the sidecar changes
on purpose (listed in docs/http.md, "What the sidecar changes on purpose", and in ``SIDECAR_ADDS`` below).

Upstreams nobody here wrote: httpbin served by gunicorn (one per session, on a socket the test binds and
hands over, so it is reachable before gunicorn has even started), and nginx (``tools/test-deps.sh``, which
``make test`` runs, installs it; without it the nginx tests fail, saying so). The sidecar runs in a thread of its own on uvloop,
as ``sidecar run`` does, so that blocking clients (``requests``, raw sockets) and aiohttp can both talk to it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sidecar.adapters.http.headers import HOP_BY_HOP as _HOP_BY_HOP
from sidecar.app import App
from sidecar.config import load_dict
from tests.metrics import metric

#: Request headers the sidecar adds or rewrites on purpose (docs/http.md): an echo of the request (httpbin's
#: ``/anything``) differs by these and nothing else.
SIDECAR_ADDS = frozenset(
    {"x-forwarded-for", "x-forwarded-proto", "x-sidecar-attempt", "x-yataxi-client-timeoutms"}
)
#: Response headers that differ between any two answers, direct or not, or that carry the framing the
#: sidecar restates for its own connection with the client (RFC 9112: hop-by-hop).
HOP_BY_HOP = frozenset(h.decode() for h in _HOP_BY_HOP)
VOLATILE = frozenset({"date", "connection", "keep-alive", "transfer-encoding", "server"})


def bound_socket() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until something accepts on ``port``: a condition polled, failing with ``proc``'s words if it exits."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)  # a retry interval of the poll, not a wait for an event
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture(scope="session")
def httpbin() -> Iterator[str]:
    """``host:port`` of httpbin on gunicorn (2 threads: pipelined and concurrent requests both work)."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            f"fd://{sock.fileno()}",
            "--workers",
            "1",
            "--threads",
            "4",
            "--worker-class",
            "gthread",
            "--graceful-timeout",
            "1",
            "--log-level",
            "warning",
            "httpbin:app",
        ],
        pass_fds=(sock.fileno(),),
        stderr=subprocess.PIPE,
    )
    sock.close()  # gunicorn holds it: connections wait in its backlog until it accepts
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


NGINX_CONF = """
{user}
daemon off;
worker_processes 1;
error_log {tmp}/error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    default_type application/octet-stream;
    types {{ text/plain txt; }}
    gzip on;
    gzip_types text/plain;
    gzip_min_length 16;
    server {{
        listen 127.0.0.1:{port};
        root {tmp}/www;
        client_max_body_size 64m;
        location /dav/ {{
            dav_methods PUT DELETE;
            create_full_put_path on;
        }}
    }}
}}
"""


@pytest.fixture(scope="session")
def nginx() -> Iterator[str]:
    """``host:port`` of nginx serving static files (ranges, HEAD, 304, gzip) and WebDAV PUT/DELETE."""
    exe = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if exe is None:
        pytest.fail("nginx is not installed: tools/test-deps.sh installs it (make test runs it)")
    with tempfile.TemporaryDirectory(prefix="sidecar-compat-nginx-") as t:
        tmp = Path(t)
        www = tmp / "www"
        (www / "dav").mkdir(parents=True)
        (www / "hello.txt").write_bytes(b"hello from nginx\n" * 64)
        (www / "big.bin").write_bytes(bytes(range(256)) * (8 * 1024 * 1024 // 256))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf = tmp / "nginx.conf"
        # as root, nginx's workers would run as nobody, who may not read a private temporary directory
        user = "user root;" if os.geteuid() == 0 else ""
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, user=user))
        proc = subprocess.Popen([exe, "-c", str(conf), "-p", str(tmp)], stderr=subprocess.PIPE)
        try:
            wait_listening(port, proc)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)


class Sidecar:
    """A sidecar running in its own thread and event loop (uvloop), as ``sidecar run`` would."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self._started: Future[App] = Future()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, args=(cfg,), daemon=True)
        self._thread.start()
        self.app = self._started.result(timeout=60)

    def _run(self, cfg: dict[str, Any]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                async with App(load_dict(cfg, {})) as app:
                    self._started.set_result(app)
                    await self._stop.wait()
            except BaseException as e:
                if not self._started.done():
                    self._started.set_exception(e)
                raise

        uvloop.run(main())

    def url(self, listener: str) -> str:
        host, port = self.app.address(listener)
        return f"http://{host}:{port}"

    def port(self, listener: str) -> int:
        return self.app.address(listener)[1]

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.app, name, **labels)

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def sidecar_config(
    upstreams: dict[str, str], *, policy: dict[str, Any] | None = None, listener: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One HTTP listener per upstream, named after it, under ``http-default`` (no backoff) plus ``policy``."""
    pol = {"extends": "http-default", "backoff": {"initial": "0ms", "max": "0ms", "jitter": "none"}}
    pol.update(policy or {})
    return {
        "admin": {"listen": None},
        "upstreams": {name: {"endpoints": [ep]} for name, ep in upstreams.items()},
        "policies": {"p": pol},
        "listeners": [
            {
                "name": name,
                "protocol": "http",
                "listen": "127.0.0.1:0",
                "upstream": name,
                "policy": "p",
                **(listener or {}),
            }
            for name in upstreams
        ],
    }


@pytest.fixture(scope="session")
def sidecar(httpbin: str) -> Iterator[Sidecar]:
    """The sidecar with its defaults in front of httpbin (listener ``bin``)."""
    sc = Sidecar(sidecar_config({"bin": httpbin}))
    try:
        yield sc
    finally:
        sc.close()


@pytest.fixture(scope="session")
def nginx_sidecar(nginx: str) -> Iterator[Sidecar]:
    """The sidecar with its defaults in front of nginx (listener ``ngx``)."""
    sc = Sidecar(sidecar_config({"ngx": nginx}))
    try:
        yield sc
    finally:
        sc.close()


def end_to_end(headers: Any) -> dict[str, list[str]]:
    """A response's headers without the volatile and hop-by-hop ones, by lowercased name."""
    out: dict[str, list[str]] = {}
    for name, value in headers.items():
        low = name.lower()
        if low not in VOLATILE:
            out.setdefault(low, []).append(value)
    return out


def echoed(headers: dict[str, str]) -> dict[str, str]:
    """The request headers httpbin echoed, without those the sidecar adds on purpose and the hop-by-hop ones
    (each connection's own: ``Connection: keep-alive`` is between the client and the sidecar)."""
    return {k.lower(): v for k, v in headers.items() if k.lower() not in SIDECAR_ADDS | HOP_BY_HOP}


def raw_exchange(port: int, data: bytes, *, shut_wr: bool = False, timeout: float = 20.0) -> bytes:
    """Send ``data`` on a new connection (then half-close it if ``shut_wr``); read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if shut_wr:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
