"""``sidecar check`` on a gRPC listener with a service config: the synthesized policies are printed, and a
bad service config is refused with the path of each error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFIG = """
upstreams:
  greeter: {endpoints: ["127.0.0.1:50051"]}
listeners:
  - name: greeter
    protocol: grpc
    listen: 127.0.0.1:15051
    upstream: greeter
    service_config: |
      {"methodConfig": [{"name": [{"service": "helloworld.Greeter"}],
        "retryPolicy": {"maxAttempts": %s, "initialBackoff": "0.1s", "maxBackoff": "1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}
"""


def check(tmp_path: Path, max_attempts: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "sidecar.yaml"
    path.write_text(CONFIG % max_attempts)
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "check", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_prints_the_policies_a_service_config_became(tmp_path: Path) -> None:
    r = check(tmp_path, "4")
    assert r.returncode == 0, r.stderr
    assert "greeter.methodConfig[0]:" in r.stdout and "max_attempts: 4" in r.stdout
    assert "helloworld.Greeter: 'greeter.methodConfig[0]'" in r.stdout


def test_check_refuses_a_bad_service_config_naming_the_key(tmp_path: Path) -> None:
    r = check(tmp_path, "1")
    assert r.returncode == 2
    assert (
        "listeners[0].service_config.methodConfig[0].retryPolicy.maxAttempts: must be greater than 1"
        in r.stderr
    )
