"""The live engine: start the processes, give them a common start, stage the outage, collect the records.

Processes (``python -m sidecar.simulate.live.<part>``): one model server per replica, the sidecar for the
``sidecar`` strategy, the clients. The ``stop`` outage is real: the server processes get SIGSTOP at its
start and SIGCONT at its end, so the kernel queues connections (up to the backlog) and nothing answers,
exactly as in the seed's experiment. ``error`` and ``brownout`` are applied by the servers themselves at
the scenario's times. Every process is ended before :func:`run` returns, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from typing import Any

from ..policy import LISTENER, compile_policy, config_dict
from ..record import Record
from ..scenario import SIDECAR_STRATEGIES, Scenario, to_dict
from .wire import clock

START_DELAY = 0.5  # between telling the processes the start time and that time
READY_TIMEOUT = 30.0


class LiveError(RuntimeError):
    pass


class Part:
    """One child process speaking JSON lines."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc

    @classmethod
    async def start(cls, name: str, module: str, settings: dict[str, Any]) -> Part:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"sidecar.simulate.live.{module}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,  # the parts' own complaints go where ours do
            limit=64 * 1024 * 1024,
        )
        part = cls(name, proc)
        await part.send(settings)
        return part

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        await self.proc.stdin.drain()

    async def expect(self, key: str, timeout: float | None) -> Any:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    raise LiveError(f"the {self.name} process ended before sending {key!r}")
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if key in message:
                    return message[key]

    def signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def end(self) -> None:
        """SIGCONT (it may be stopped), SIGKILL, reap."""
        if self.proc.returncode is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        await self.proc.wait()


def run(sc: Scenario, strategy: str) -> Record:
    return asyncio.run(run_async(sc, strategy))


async def run_async(sc: Scenario, strategy: str) -> Record:
    scenario = to_dict(sc)
    cap = somaxconn()
    if cap is not None and sc.server.backlog > cap:
        print(
            f"sidecar simulate: server.backlog {sc.server.backlog} is above the kernel's somaxconn {cap}: "
            f"a stopped server queues at most {cap} connections",
            file=sys.stderr,
        )
    parts: list[Part] = []
    try:
        servers = []
        for i in range(sc.server.replicas):
            servers.append(await Part.start(f"server {i}", "server", {"scenario": scenario, "replica": i}))
        parts += servers
        ports = [(await s.expect("ready", READY_TIMEOUT))["port"] for s in servers]
        endpoints = [f"127.0.0.1:{p}" for p in ports]
        sidecar = None
        if strategy in SIDECAR_STRATEGIES:
            tickets = strategy == "sidecar+tickets"
            # the scenario's errors, before a process sees them
            policy = compile_policy(sc, endpoints, tickets)
            config = config_dict(sc, endpoints, tickets=tickets)
            sidecar = await Part.start(
                "sidecar", "sidecar_proc", {"config": config, "listener": LISTENER, "duration": sc.duration}
            )
            parts.append(sidecar)
            address = await sidecar.expect("ready", READY_TIMEOUT)
            targets = [f"http://{address['host']}:{address['port']}/"]
            deadline_header = policy.config.deadline.header
            deadline_statuses = [policy.config.deadline.expired_status, 504]
        else:
            targets = [f"http://{e}/" for e in endpoints]
            deadline_header, deadline_statuses = "X-YaTaxi-Client-TimeoutMs", [504]
        clients = await Part.start(
            "clients",
            "clients",
            {
                "scenario": scenario,
                "strategy": "sidecar" if strategy in SIDECAR_STRATEGIES else strategy,
                "targets": targets,
                "deadline_header": deadline_header,
                "deadline_statuses": deadline_statuses,
            },
        )
        parts.append(clients)
        await clients.expect("ready", READY_TIMEOUT)
        epoch = clock() + START_DELAY
        for p in parts:
            await p.send({"epoch": epoch})
        outage = asyncio.create_task(_stage_outage(sc, servers, epoch))
        try:
            client_rec = Record.from_json(await clients.expect("record", sc.duration + 60.0))
        finally:
            outage.cancel()
        records = [client_rec]
        for p in parts:
            if p is not clients:
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGTERM)
        if sidecar is not None:
            records.append(Record.from_json(await sidecar.expect("record", 30.0)))
        server_recs = [Record.from_json(await s.expect("record", 30.0)) for s in servers]
        return Record.merge(records, server_recs)
    finally:
        await asyncio.gather(*(p.end() for p in parts), return_exceptions=True)


async def _stage_outage(sc: Scenario, servers: list[Part], epoch: float) -> None:
    o = sc.outage
    if o is None or o.mode != "stop":
        return
    await asyncio.sleep(max(0.0, epoch + o.start - clock()))
    for s in servers:
        s.signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(max(0.0, epoch + o.end - clock()))
    finally:
        for s in servers:
            s.signal(signal.SIGCONT)


def somaxconn() -> int | None:
    """The kernel's cap on listen backlogs (a stopped server's queue cannot be longer)."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):  # pragma: no cover - not Linux
        return None
