"""``sidecar tap`` and ``sidecar top`` in a real terminal: tmux runs them (a private server on its own socket),
send-keys types into them, capture-pane reads the screen, while real clients retry through the sidecar and
one of its endpoints is overloaded."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.metrics import until

from .scenario import SECRET, eventually, scene

TMUX = shutil.which("tmux")


class Terminal:
    """One tmux server of this test's own (``-S`` socket: other tmux users are never touched), one pane."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    async def tmux(self, *args: str) -> str:
        assert TMUX is not None
        # the terminal's size is the pane's: not a COLUMNS or LINES this process may have been given
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        proc = await asyncio.create_subprocess_exec(
            TMUX, "-S", str(self.socket), *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, (args, err.decode())
        return out.decode()

    async def run(self, *command: str, width: int = 200, height: int = 50) -> None:
        """Run ``command`` in the pane; bash says how it ended (tmux's own pane status is not always filled in
        when a process exits: it may see the terminal close before it reaps the process)."""
        await self.tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), "sh")
        await self.tmux("set-option", "-t", "t", "remain-on-exit", "on")
        line = " ".join(shlex.quote(c) for c in command)
        await self.tmux(
            "respawn-pane", "-k", "-t", "t", f"bash -c {shlex.quote(line + '; echo [exit status $?]')}"
        )

    async def screen(self) -> str:
        """What the terminal shows now (lines that wrapped joined back)."""
        return await self.tmux("capture-pane", "-p", "-J", "-t", "t")

    async def scrollback(self) -> str:
        """Everything printed so far: the lines scrolled out of sight, then the screen."""
        return await self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")

    async def interrupt(self) -> str:
        """Ctrl-C, then the command's exit status."""
        await self.tmux("send-keys", "-t", "t", "C-c")
        screen = await eventually(self.scrollback, lambda text: "[exit status " in text, "the command exits")
        return screen.rpartition("[exit status ")[2].partition("]")[0]

    async def close(self) -> None:
        await self.tmux("kill-server")


@pytest.fixture
async def terminal(tmp_path: Path) -> AsyncIterator[Terminal]:
    if TMUX is None:  # loud: a terminal test that cannot run is a failure, never a skip
        pytest.fail("TMUX IS NOT INSTALLED: run tools/test-deps.sh (make test does)")
    t = Terminal(tmp_path / "tmux.sock")
    try:
        yield t
    finally:
        if t.socket.exists():
            await t.close()


def sidecar(*args: str) -> list[str]:
    return [sys.executable, "-m", "sidecar", *args]


async def test_sidecar_tap_prints_a_line_per_request_with_its_attempts_and_decisions(
    terminal: Terminal,
) -> None:
    async with scene() as s:
        s.start_load()
        await terminal.run(*sidecar("tap", "--admin", s.admin_hostport))
        screen = await eventually(
            terminal.scrollback,
            lambda text: any("→ retry" in line and "⇒ success 200" in line for line in text.splitlines()),
            "a retried request in the tap",
        )
        line = next(x for x in screen.splitlines() if "→ retry" in x and "⇒ success 200" in x)
        assert "web→orders GET /orders/" in line
        assert f"#1 {s.hot.endpoint} overloaded 503" in line and "#2 127.0.0.1:" in line
        assert "token" not in screen and SECRET not in screen
        assert screen.startswith(f"tapping http://{s.admin_hostport}: a line per request; Ctrl-C stops")
        assert await terminal.interrupt() == "0"


async def test_sidecar_tap_with_a_filter_shows_only_that_upstream(terminal: Terminal) -> None:
    async with scene() as s:
        s.start_load()
        await terminal.run(*sidecar("tap", "--admin", s.admin_hostport, "--upstream", "elsewhere"))
        await eventually(terminal.screen, lambda t: "(upstream elsewhere)" in t, "the tap's first line")
        sent = s.sent
        await until(lambda: s.sent > sent + 50, "50 more requests")
        screen = await terminal.scrollback()
        assert "GET /orders/" not in screen, screen
        assert await terminal.interrupt() == "0"


async def test_sidecar_top_shows_each_endpoint_s_state_and_the_traffic(terminal: Terminal) -> None:
    async with scene() as s:
        s.start_load()
        await terminal.run(*sidecar("top", "--admin", s.admin_hostport))

        def shows(text: str) -> bool:
            lines = text.splitlines()
            return any(s.hot.endpoint in x and "cooldown (overloaded)" in x for x in lines) and any(
                "web → orders" in x and "overloaded" in x
                for x in lines  # retries by cause
            )

        screen = await eventually(
            terminal.screen, shows, "the overloaded endpoint and retries by cause in top"
        )
        assert "upstream orders" in screen and "ready" in screen
        for good in s.good:
            assert any(good.endpoint in x and " active" in x for x in screen.splitlines())
        state = await s.get("/api/state")
        assert f"config generation {state['config']['generation']}" in screen
        assert await terminal.interrupt() == "0"


def test_tap_and_top_say_when_the_admin_port_cannot_be_reached() -> None:
    for command in ("tap", "top"):
        r = subprocess.run(
            sidecar(command, "--admin", "127.0.0.1:1"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 1
        assert "cannot reach the admin port at http://127.0.0.1:1" in r.stdout + r.stderr
    r = subprocess.run(
        sidecar("tap", "--admin", "nowhere"), capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 2 and "--admin: 'nowhere' has no port" in r.stderr


def test_sidecar_run_never_imports_rich() -> None:
    """rich is for tap and top: the sidecar itself (its composition root and command line) runs without it."""
    code = (
        "import sys, sidecar.cli, sidecar.app; "
        "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout.strip() == "[]"
