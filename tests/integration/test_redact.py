"""Secrets stay hidden where an operator looks: the admin port's ``/config`` (a real HTTP client against a
running sidecar) and ``sidecar check`` (a real process, the secret in its environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from sidecar.app import App
from sidecar.config import load_text

ROOT = Path(__file__).resolve().parents[2]
SECRET = "otlp-S3cr3t-from-env"

CONFIG = """
admin: {listen: "127.0.0.1:0"}
telemetry:
  traces:
    exporter: otlp  # no request is made: nothing is exported, but the endpoint must be one the exporter reads
    protocol: http
    endpoint: "https://tracer:pa55word@collector.example:4318/v1/traces?key=${OTLP_SECRET}"
upstreams:
  orders: {endpoints: ["127.0.0.1:8081"]}
  db: {endpoints: ["127.0.0.1:27017"], auth: {username: app, password: "${DB_PASSWORD}"}}
policies:
  p: {extends: http-default, max_attempts: 2}
"""
ENV = {"OTLP_SECRET": SECRET, "DB_PASSWORD": "db-pa55w0rd-env"}
LEAKS = (SECRET, "db-pa55w0rd-env", "pa55word")


def _assert_hidden(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, f"{leak!r} shown in clear"


async def test_config_on_the_admin_port_hides_every_secret() -> None:
    async with App(load_text(CONFIG, ENV)) as app, aiohttp.ClientSession() as http:
        assert app.admin is not None
        host, port = app.admin.address
        async with http.get(f"http://{host}:{port}/config") as r:
            assert r.status == 200
            text = await r.text()
            cfg = await r.json()
    _assert_hidden(text)
    traces = cfg["telemetry"]["traces"]
    assert traces["endpoint"] == "https://<redacted>@collector.example:4318/v1/traces?key=<redacted>"
    assert cfg["upstreams"]["db"]["auth"]["password"] == "<redacted>"
    assert cfg["upstreams"]["db"]["auth"]["username"] == "app"


def _check(config: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "sidecar.yaml"
    path.write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "check", "-c", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, **env},
    )


def test_check_prints_the_config_without_secrets(tmp_path: Path) -> None:
    r = _check(CONFIG, ENV, tmp_path)
    assert r.returncode == 0, r.stderr
    _assert_hidden(r.stdout + r.stderr)
    shown = yaml.safe_load(r.stdout)
    traces = shown["telemetry"]["traces"]
    assert traces["endpoint"] == "https://<redacted>@collector.example:4318/v1/traces?key=<redacted>"
    assert shown["upstreams"]["db"]["auth"]["password"] == "<redacted>"


def test_check_error_quoting_a_secret_value_hides_it(tmp_path: Path) -> None:
    broken = CONFIG.replace('"127.0.0.1:8081"', '"${ORDERS_ADDR}"')
    r = _check(broken, {**ENV, "ORDERS_ADDR": "user:" + SECRET + "@orders:8081"}, tmp_path)
    assert r.returncode == 2
    assert "upstreams.orders.endpoints[0]" in r.stderr
    _assert_hidden(r.stdout + r.stderr)


def test_run_logs_hide_expanded_values(tmp_path: Path) -> None:
    # ``sidecar run`` logs each listener by name when it is ready: a name from ${...} is hunted there too.
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        "admin: {listen: null}\n"
        'upstreams: {orders: {endpoints: ["127.0.0.1:8081"]}}\n'
        'listeners: [{name: "${LISTENER}", protocol: http, listen: "127.0.0.1:0", upstream: orders}]\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "-c", str(path)],
        cwd=ROOT,
        env={**os.environ, "LISTENER": "listener-" + SECRET},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # until the listener says it is ready (or the process ends)
            lines.append(line)
            if "ready on" in line:
                break
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=30)
    text = "".join(lines) + (rest or "")
    assert any("listener <redacted> ready on 127.0.0.1:" in line for line in lines), text
    assert SECRET not in text


async def test_a_reload_hands_its_new_secrets_to_the_log_redaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret that only the reloaded config has (an expanded value, a password) is hidden in logs too."""
    import io
    import logging

    from sidecar import log_redaction
    from sidecar.app import App
    from sidecar.config import load_file
    from sidecar.config.effective import redactor

    base = (
        "admin: {listen: null}\n"
        'upstreams: {orders: {endpoints: ["127.0.0.1:8081"]}}\n'
        'listeners: [{name: web, protocol: http, listen: "127.0.0.1:0", upstream: orders}]\n'
    )
    path = tmp_path / "sidecar.yaml"
    path.write_text(base)
    expanded, password = "token-" + SECRET, "pw-" + SECRET[::-1]
    monkeypatch.setenv("NEW_TOKEN", expanded)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        cfg = load_file(path)
        log_redaction.install(redactor(cfg))
        async with App(cfg, config_path=path) as app:
            path.write_text(
                base.replace(
                    "upstreams: {",
                    'upstreams: {billing: {endpoints: ["127.0.0.1:8082"], auth: {username: "${NEW_TOKEN}",'
                    f' password: "{password}"}}}}, ',
                )
            )
            assert await app.reload()
            logging.getLogger("sidecar.test").error("upstream said %s and %s", expanded, password)
    finally:
        root.removeHandler(handler)
        monkeypatch.setattr(log_redaction, "_secrets", None)
    text = out.getvalue()
    assert "upstream said <redacted> and <redacted>" in text, text
    assert SECRET not in text and SECRET[::-1] not in text
