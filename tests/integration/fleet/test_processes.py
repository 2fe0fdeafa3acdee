"""``sidecar check`` and ``sidecar run`` as a user runs them: real processes (uvloop, the CLI's logging)
settling with a real redis-server; waits read the processes' own log lines, never sleep."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sidecar.testing.redis_server import RedisServer, free_port
from tests.integration.fleet.fleet_sidecars import new_prefix

SIDECAR = [sys.executable, "-m", "sidecar"]


def config(tmp: Path, name: str, redis_url: str, prefix: str) -> tuple[Path, int]:
    admin = free_port()
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"""admin: {{listen: "127.0.0.1:{admin}"}}
fleet:
  redis: {{url: "{redis_url}", timeout: 200ms, key_prefix: "{prefix}"}}
  lease: 100ms
upstreams:
  api:
    endpoints: ["127.0.0.1:{free_port()}"]
    retry_budget: {{scope: fleet, ratio: 0.2, min_per_second: 10}}
listeners:
  - {{name: web, protocol: http, listen: "127.0.0.1:{free_port()}", upstream: api}}
"""
    )
    return path, admin


@contextmanager
def sidecar_run(conf: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [*SIDECAR, "run", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()


def wait_log(proc: subprocess.Popen[str], text: str) -> str:
    """Read the process's log until a line contains ``text`` (fails if it exits first)."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"{text!r} never logged; the process said:\n{''.join(seen[-30:])}")


def metrics(admin: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as r:
        return r.read().decode()


def test_two_sidecar_processes_join_one_fleet(redis_session: RedisServer, tmp_path: Path):
    prefix = new_prefix()
    a_conf, _ = config(tmp_path, "a", redis_session.url, prefix)
    b_conf, b_admin = config(tmp_path, "b", redis_session.url, prefix)
    with sidecar_run(a_conf) as a:
        wait_log(a, "fleet: settled with Redis, 1 member(s) alive")
        with sidecar_run(b_conf) as b:
            wait_log(b, "fleet: settled with Redis, 2 member(s) alive")
            text = metrics(b_admin)
            assert "sidecar_fleet_redis_up 1.0" in text
            assert 'sidecar_fleet_share{limiter="retry_budget",listener="",upstream="api"}' in text


def test_run_starts_without_redis_and_says_so(redis_binary: str, tmp_path: Path):
    conf, admin = config(tmp_path, "alone", f"redis://:hunter2@127.0.0.1:{free_port()}/0", new_prefix())
    with sidecar_run(conf) as proc:
        line = wait_log(proc, "fleet: Redis unreachable")
        assert "falls back to a local share as 1 of 1 member(s)" in line
        # the admin port opened before the listeners, and the settle task starts after them
        text = metrics(admin)
        assert "sidecar_fleet_redis_up 0.0" in text and "sidecar_fleet_members 1.0" in text


def test_check_prints_the_fleet_block_without_the_password(tmp_path: Path):
    conf, _ = config(tmp_path, "c", "rediss://app:hunter2@redis.internal:6380/0", "p:")
    r = subprocess.run([*SIDECAR, "check", "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "rediss://<redacted>@redis.internal:6380/0" in r.stdout
    assert "hunter2" not in r.stdout + r.stderr
