"""The same app session, directly against a MongoDB test server and through the sidecar, with pymongo 4.16
and 4.20, sync and async: the app must see the same results and the same errors, byte for byte.

Each run is a real pymongo in a subprocess (``scenario.py``), so that two pymongo versions can be tried from
one test run: 4.20 from the lock, 4.16 from ``.venv/pymongo-4.16`` (``make install`` puts it there).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.testing.mongo import MongoTestServer
from tests.integration.mongo.conftest import config, sidecar

HERE = Path(__file__).parent
OLD = Path(sys.prefix) / "pymongo-4.16"
VERSIONS = {"4.20": None, "4.16": OLD}


async def run(uri: str, mode: str, path: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = f"{path}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE / "scenario.py"),
        uri,
        mode,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("version", sorted(VERSIONS))
async def test_the_app_sees_the_same_session_directly_and_through_the_sidecar(
    version: str, mode: str
) -> None:
    path = VERSIONS[version]
    if path is not None and not path.exists():
        pytest.fail(f"pymongo {version} is not installed in {path}: run `make install`")
    async with MongoTestServer("mongos") as direct_server, MongoTestServer("mongos") as proxied_server:
        direct = await run(direct_server.uri, mode, path)
        async with sidecar(config([proxied_server.endpoint])) as sc:
            proxied = await run(sc.uri(""), mode, path)
    assert direct["pymongo"].startswith(version) and proxied["pymongo"] == direct["pymongo"]
    assert proxied["steps"].keys() == direct["steps"].keys()
    for step, answer in direct["steps"].items():
        assert proxied["steps"][step] == answer, step
    # the session really exercised what it claims to
    assert direct["steps"]["insert_duplicate"]["code"] == 11000
    assert direct["steps"]["unknown_command"]["codeName"] == "CommandNotFound"
    assert len(direct["steps"]["find_sorted_batches"]) > 17  # more than one batch: getMore went through


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_app_keeps_its_uri_with_credentials_and_compression(mode: str) -> None:
    """Issue 23: the app's own URI (its user, authSource, compressors) unchanged but for host:port; the
    sidecar verifies the login, logs in upstream as that user, compresses upstream on its own: the session's
    answers are the same as direct, byte for byte."""
    options = "authSource=admin&compressors=zlib"
    async with MongoTestServer("mongos") as direct_server, MongoTestServer("mongos") as proxied_server:
        for server in (direct_server, proxied_server):
            server.add_user("orders", "orders-pw")
        direct = await run(f"mongodb://orders:orders-pw@{direct_server.endpoint}/?{options}", mode, None)
        cfg = config([], listener={"app_auth": {}, "compressors": ["zstd", "zlib"]})
        cfg["upstreams"]["db"] = {
            "uri": f"mongodb://orders:${{PW}}@{proxied_server.endpoint}/?authSource=admin&compressors=zstd"
        }
        async with sidecar(cfg, environ={"PW": "orders-pw"}) as sc:
            proxied = await run(f"mongodb://orders:orders-pw@{sc.host}:{sc.port}/?{options}", mode, None)
    assert proxied["steps"] == direct["steps"]
    assert {c.user for c in proxied_server.commands("insert")} == {"orders"}
    assert {c.compressor for c in proxied_server.commands("insert")} == {"zstd"}
