"""A real DNS server for tests and benchmarks: ``dnsmasq`` in the foreground on a free port of 127.0.0.1, with
no system configuration, answering for ``*.test`` only (anything else there is NXDOMAIN) from a hosts file
and SRV records it is given.

Answers change during a test: :meth:`DnsServer.set` rewrites the hosts file and sends SIGHUP (done once
dnsmasq says it read the file again); SRV records are command-line options, so :meth:`DnsServer.set_srv`
restarts it on the same port. :meth:`DnsServer.stop` leaves the port silent: a query then times out (a
stopped server here does not refuse).

The binary comes from Debian's ``dnsmasq-base`` (the program without a system service), which ``make test``
installs (tools/test-deps.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

HOW_TO_GET = (
    "dnsmasq is not installed: the discovery tests need a real DNS server. `make test` installs Debian's "
    "dnsmasq-base where apt-get runs as root (tools/test-deps.sh); elsewhere install dnsmasq so that it is "
    "on the PATH or in /usr/sbin."
)

#: An SRV record: (name, target, port).
Srv = tuple[str, str, int]


def binary() -> str:
    path = shutil.which("dnsmasq") or ("/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq") else None)
    if path is None:
        raise RuntimeError(HOW_TO_GET)
    return path


def free_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = int(u.getsockname()[1])
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port


class DnsServer:
    """``async with DnsServer({"orders.test": ["127.0.0.2", "127.0.0.3"]}) as dns:``; ``dns.address`` is
    ``127.0.0.1:PORT`` (for ``resolver.nameservers``). ``ttl``: the TTL of every answer, in seconds."""

    def __init__(
        self, names: Mapping[str, Sequence[str]] | None = None, srv: Iterable[Srv] = (), ttl: int = 1
    ) -> None:
        self.names: dict[str, list[str]] = {k: list(v) for k, v in (names or {}).items()}
        self.srv: list[Srv] = list(srv)
        self.ttl = ttl
        self.port = free_port()
        self._dir = tempfile.mkdtemp(prefix="sidecar-dns-")
        os.chmod(self._dir, 0o755)  # dnsmasq may read it as another user
        self.hosts = Path(self._dir) / "hosts"
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._reads = 0  # times dnsmasq said it read the hosts file
        self._read = asyncio.Condition()
        self._ended = False  # its log ended: it exited
        self.log: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- answers -----------------------------------------------------------------------------------------
    async def set(self, name: str, addresses: Sequence[str]) -> None:
        """``name`` answers ``addresses`` from now on (none: NXDOMAIN)."""
        if addresses:
            self.names[name] = list(addresses)
        else:
            self.names.pop(name, None)
        before = self._reads
        self._write()
        if self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)
            await self._wait_read(before + 1)

    async def set_srv(self, records: Iterable[Srv]) -> None:
        """The SRV records from now on (dnsmasq takes them at start: a restart on the same port)."""
        self.srv = list(records)
        if self.proc is not None:
            await self.stop()
            await self.start()

    # -- life --------------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """dnsmasq's command line (with the hosts file written): ``start`` runs it; a benchmark may run it
        with ``subprocess``."""
        self._write()
        args = [
            binary(),
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--pid-file=",
            "--no-resolv",
            "--no-hosts",
            "--no-negcache",
            f"--addn-hosts={self.hosts}",
            "--bind-interfaces",
            "--listen-address=127.0.0.1",
            f"--port={self.port}",
            "--local=/test/",
            f"--local-ttl={self.ttl}",
            "--log-facility=-",
        ]
        if os.geteuid() == 0:
            args.append(f"--user={pwd.getpwuid(0).pw_name}")  # keep the rights to read the hosts file again
        for name, target, port in self.srv:
            args.append(f"--srv-host={name},{target},{port}")
        return args

    async def start(self) -> DnsServer:
        args = self.command()
        before = self._reads
        self._ended = False
        self.proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.get_running_loop().create_task(self._read_log(self.proc))
        try:
            await asyncio.wait_for(self._wait_read(before + 1), 20)
        except TimeoutError:
            await self.stop()
            raise RuntimeError("dnsmasq did not start:\n" + "\n".join(self.log[-20:])) from None
        return self

    async def stop(self) -> None:
        """Stop answering (queries to the port then time out)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await proc.wait()
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def __aenter__(self) -> DnsServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- inside ------------------------------------------------------------------------------------------
    def _write(self) -> None:
        lines = [f"{address} {name}" for name, addresses in self.names.items() for address in addresses]
        tmp = self.hosts.with_suffix(".new")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.chmod(tmp, 0o644)
        tmp.replace(self.hosts)

    async def _read_log(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.log.append(text)
            if f"read {self.hosts}" in text:
                async with self._read:
                    self._reads += 1
                    self._read.notify_all()
        async with self._read:
            self._ended = True
            self._read.notify_all()

    async def _wait_read(self, n: int) -> None:
        async with self._read:
            await self._read.wait_for(lambda: self._reads >= n or self._ended)
        if self._reads < n:
            raise RuntimeError("dnsmasq exited:\n" + "\n".join(self.log[-20:]))
