"""A real nginx for the HTTP tests that need a third-party server (TLS, two server names, mTLS, IPv6): started
with the ``server`` blocks a test writes, on ports found free, and stopped after. nginx is installed by
``tools/test-deps.sh`` (``make test`` runs it); without it the test fails, saying so."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

CONF = """
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
    default_type text/plain;
{servers}
}}
"""


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Nginx:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.proc: asyncio.subprocess.Process | None = None

    def error_log(self) -> str:
        path = self.tmp / "error.log"
        return path.read_text() if path.exists() else ""


@asynccontextmanager
async def nginx(servers: str, listening: list[tuple[str, int]]) -> AsyncIterator[Nginx]:
    """nginx with ``servers`` (``server { ... }`` blocks; ``{tmp}`` is its directory), up once every
    ``(host, port)`` of ``listening`` accepts connections."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe is None:
        pytest.fail("nginx is not installed: tools/test-deps.sh installs it (make test runs it)")
    with tempfile.TemporaryDirectory(prefix="sidecar-nginx-") as t:
        tmp = Path(t)
        user = (
            "user root;" if os.geteuid() == 0 else ""
        )  # as root, workers would be nobody, who cannot read tmp
        conf = tmp / "nginx.conf"
        conf.write_text(CONF.format(user=user, tmp=tmp, servers=servers.replace("{tmp}", str(tmp))))
        server = Nginx(tmp)
        proc = server.proc = await asyncio.create_subprocess_exec(
            exe, "-c", str(conf), "-p", str(tmp), stderr=asyncio.subprocess.PIPE
        )
        try:
            for host, port in listening:
                await _accepting(host, port, proc)
            yield server
        finally:
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()


async def _accepting(host: str, port: int, proc: asyncio.subprocess.Process) -> None:
    for _ in range(600):  # a poll of the condition, at most about 30 s
        if proc.returncode is not None:
            err = await proc.stderr.read() if proc.stderr else b""
            raise RuntimeError(f"nginx exited: {err.decode(errors='replace')}")
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise RuntimeError(f"nginx does not listen on {host}:{port}")
