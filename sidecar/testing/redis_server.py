"""A throwaway ``redis-server`` on a free loopback port, for the fleet's tests and benchmark.

Nothing is persisted (``--save '' --appendonly no``). It can be paused (SIGSTOP), resumed, killed and
started again on the same port (a restart with empty data). With ``tls=(cert, key)`` it listens with TLS only.
The binary comes from the Debian package ``redis-server`` (``make test`` installs it: tools/ensure-redis.sh).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

HOW_TO_GET = (
    "redis-server is not installed: the fleet tests need a real one. `make test` installs the Debian package "
    "where apt-get runs as root (tools/ensure-redis.sh); elsewhere install Redis >= 6 (apt-get install "
    "redis-server, brew install redis, dnf install redis) so that `redis-server` is on the PATH."
)


def binary() -> str:
    path = shutil.which("redis-server")
    if path is None and os.path.exists("/usr/bin/redis-server"):
        path = "/usr/bin/redis-server"
    if path is None:
        raise RuntimeError(HOW_TO_GET)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(
        self, *, password: str | None = None, tls: tuple[Path, Path] | None = None, port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.password = password
        self.tls = tls
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls[0]}"

    def start(self) -> RedisServer:
        args = [binary(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "notice"]
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:
            cert, key = self.tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert)]
            args += ["--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: list[str] = []
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # blocks until the server says it is ready (or exits)
            seen.append(line)
            if "Ready to accept connections" in line:
                # keep reading its log, so that a full pipe never stops the server
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return self
        self.proc.wait()
        raise RuntimeError("redis-server did not start:\n" + "".join(seen[-20:]))

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
