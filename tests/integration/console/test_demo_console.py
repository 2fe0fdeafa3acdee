"""`sidecar demo` prints its console's address, and the console answers there while a part runs."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp

from sidecar.demo import console_address, load_part
from sidecar.demo.runner import run_part

from .scenario import eventually


async def test_the_console_answers_while_a_demo_part_runs() -> None:
    admin = console_address(preferred=0)
    lines: list[str] = []
    part = asyncio.create_task(
        run_part(load_part("http"), duration=3.0, rate=50.0, out=lines.append, admin=admin)
    )
    async with aiohttp.ClientSession() as http:

        async def state() -> dict | None:
            try:
                async with http.get(f"http://{admin}/api/state") as r:
                    return await r.json()
            except aiohttp.ClientConnectionError:  # the part's sidecar is not up yet
                return None

        seen = await eventually(
            state,
            lambda st: st is not None and st["traffic"] and st["traffic"][0]["last"],
            "the demo's traffic",
        )
        assert {u["name"] for u in seen["upstreams"]} == {"orders", "catalog"}
    summary = await part
    assert summary["requests"] > 0


def test_sidecar_demo_prints_the_console_s_address_first() -> None:
    admin = console_address(preferred=0)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "demo",
            "--only",
            "http",
            "--duration",
            "1",
            "--rate",
            "20",
            "--admin",
            admin,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"The console: http://{admin}/ (open it while the demo runs"), first
