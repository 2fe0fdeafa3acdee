"""deploy/compose brought up with podman-compose and compose.test.yaml (local stand-ins for the images CI
cannot pull), the image built by `make image-test`: the app's pymongo load reaches the MongoDB stand-in through
the sidecar on 127.0.0.1, a pymongo client of ours in the app's container does too, traces reach the collector's stand-in, the
scraper sees the sidecar's request counters, and Grafana's stand-in finds the provisioned data source and dashboard."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import IMAGE
from .podman import Container, podman

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "deploy" / "compose"
PROJECT = "retry-sidecar-ci"
PODMAN_COMPOSE = str(Path(sys.executable).parent / "podman-compose")


def compose(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [PODMAN_COMPOSE, "-p", PROJECT, "-f", "compose.yaml", "-f", "compose.test.yaml", *args]
    return subprocess.run(cmd, cwd=COMPOSE_DIR, capture_output=True, text=True, timeout=300)


def until(check: str, what: str, attempts: int = 120) -> None:
    """Podman without systemd schedules no healthchecks (and podman-compose skips `service_healthy` on this
    podman): run the service's own check by hand until it passes. Nothing here can notify us, so this polls."""
    for _ in range(attempts):
        if podman("healthcheck", "run", check, check=False).returncode == 0:
            return
        time.sleep(0.5)
    pytest.fail(f"{what} never became healthy")


def stats(container: str, port: int) -> dict[str, object]:
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/stats').read().decode())"
    return json.loads(podman("exec", container, "python", "-c", code).stdout)


@pytest.fixture
def stack() -> object:
    assert IMAGE == "localhost/retry-sidecar:dev", "compose.test.yaml runs localhost/retry-sidecar:dev"
    compose("down", "-t", "0")
    r = compose("up", "-d", "--no-build")
    assert r.returncode == 0, r.stdout + r.stderr
    yield
    compose("down", "-t", "5")


async def test_the_compose_stack_serves_pymongo_through_the_sidecar(stack: object) -> None:
    for service in ("mongo", "sidecar", "prometheus"):
        until(f"{PROJECT}_{service}_1", service)
    app = Container(f"{PROJECT}_app_1")
    await app.follow()
    try:
        await app.wait_for("100 orders written and read through the sidecar")
    finally:
        await app.close()
    client = (
        "import pymongo; c = pymongo.MongoClient('mongodb://127.0.0.1:27017/?directConnection=true'); "
        "c.ci.things.insert_one({'k': 'v'}); print(c.ci.things.find_one({'k': 'v'})['k'])"
    )
    # A client of ours in the app's container, whose 127.0.0.1 is the sidecar's (network_mode: service:sidecar).
    r = podman("exec", f"{PROJECT}_app_1", "python", "-c", client)
    assert r.stdout.strip() == "v"
    for _ in range(60):  # the sidecar exports its spans in batches (every 5 s)
        if stats(f"{PROJECT}_otel-collector_1", 4318)["requests"]:
            break
        time.sleep(0.5)
    else:
        pytest.fail("no traces reached the collector's stand-in")
    scraped = stats(f"{PROJECT}_prometheus_1", 9090)
    assert 'listener="db",reason="success"' in str(scraped["last_scrape"]), scraped
    # Grafana's provisioning, as mounted: the Prometheus data source and the chart's dashboard
    grafana = stats(f"{PROJECT}_grafana_1", 3000)
    assert grafana["datasources"] == [
        {"name": "Prometheus", "type": "prometheus", "url": "http://prometheus:9090"}
    ]
    assert [(d["uid"], d["panels"] > 20) for d in grafana["dashboards"]] == [("retry-sidecar", True)], grafana
