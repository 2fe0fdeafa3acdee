"""The MongoDB part of ``sidecar demo`` runs and the sidecar hides the routers' load shedding."""

from __future__ import annotations

from sidecar.demo import load_part
from sidecar.demo.runner import run_part


async def test_the_demo_part_runs_briefly() -> None:
    part = load_part("mongodb")
    assert part is not None
    lines: list[str] = []
    summary = await run_part(part, duration=1.0, rate=50.0, out=lines.append)
    assert summary["requests"] > 0 and summary["ok"] == summary["requests"]
    assert any(line.startswith("-- mongodb:") for line in lines)
