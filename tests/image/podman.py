"""Driving podman from the image tests: commands, and a container's log followed line by line."""

from __future__ import annotations

import asyncio
import subprocess


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 or not check, r.stderr
    return r


class Container:
    """A running container and its log, line by line (podman logs -f)."""

    def __init__(self, cid: str) -> None:
        self.cid = cid
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.seen: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            "podman", "logs", "-f", self.cid, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )

        async def pump() -> None:
            assert self._proc is not None and self._proc.stdout is not None
            async for raw in self._proc.stdout:
                await self.lines.put(raw.decode(errors="replace"))

        self._pump = asyncio.create_task(pump())

    async def wait_for(self, text: str) -> str:
        async with asyncio.timeout(120):
            while True:
                line = await self.lines.get()
                self.seen.append(line)
                if text in line:
                    return line
                assert "Traceback" not in line, "".join(self.seen)

    async def close(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            await self._proc.wait()
        if self._pump is not None:
            await self._pump
