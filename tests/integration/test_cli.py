"""The ``sidecar`` command as a user runs it: a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = [sys.executable, "-m", "sidecar"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIDECAR, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_version() -> None:
    r = run("version")
    assert r.returncode == 0 and r.stdout.startswith("retry-sidecar ")


def test_run_is_listed_and_has_its_own_help() -> None:
    r = run("--help")
    assert r.returncode == 0 and "run" in r.stdout and "sidecar run --help" in r.stdout
    r = run("run", "--help")
    assert r.returncode == 0
    for option in ("--config", "--log-level", "--uvloop", "--no-uvloop", "--watch-interval"):
        assert option in r.stdout
    r = run("run")
    assert r.returncode == 2 and "--config" in r.stderr


def test_check_prints_the_effective_config() -> None:
    r = run("check", "-c", "config.example.yaml")
    assert r.returncode == 0, r.stderr
    assert "policies:" in r.stdout and "retryable_status: [502, 503, 504]" in r.stdout


def test_check_lists_every_error_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "upstreams:\n  orders: {endpoints: ['127.0.0.1:1']}\n"
        "policies:\n  p: {max_attempts: zero}\n"
        "listeners:\n  - {name: a, protocol: http, listen: '127.0.0.1:2', upstream: ordrs, policy: p}\n"
    )
    r = run("check", "-c", str(bad))
    assert r.returncode == 2
    assert "listeners[0].upstream: no upstream named 'ordrs'" in r.stderr
    assert "policies.p.max_attempts:" in r.stderr


def test_run_with_a_broken_config_exits_2_without_starting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listeners: [{name: a}]\n")
    r = run("run", "-c", str(bad))
    assert r.returncode == 2 and "listeners[0]" in r.stderr


def test_missing_file_is_a_clear_error() -> None:
    r = run("check", "-c", "/nonexistent/sidecar.yaml")
    assert r.returncode == 2 and "cannot read" in r.stderr


def without_aiohttp(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in an installation without the ``demo`` extra (the image's): aiohttp cannot be imported."""
    code = (
        "import sys; sys.modules['aiohttp'] = None; from sidecar.entry import main; "
        f"sys.argv = ['sidecar', *{list(args)!r}]; main()"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_without_the_demo_extra_the_demo_and_live_simulation_say_what_to_install() -> None:
    r = without_aiohttp("demo", "--only", "http")
    assert r.returncode == 2 and "the http part needs aiohttp" in r.stderr, r.stderr
    assert "pip install 'retry-sidecar[demo]'" in r.stderr and "Traceback" not in r.stderr
    r = without_aiohttp("simulate", "--scenario", "flaky", "--engine", "live")
    assert r.returncode == 1 and "the live engine needs aiohttp" in r.stderr, r.stderr
    r = without_aiohttp("simulate", "--scenario", "flaky", "--duration", "10", "--no-table")
    assert r.returncode == 0, r.stderr  # the des engine needs nothing more
