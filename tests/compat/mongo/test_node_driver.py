"""The MongoDB Node.js driver (npm ``mongodb``, in ``tests/compat/mongo/node``, installed by
``tools/test-deps.sh``) keeps its connection string through the sidecar (issue 23): its own user (SCRAM-SHA-256
and SCRAM-SHA-1), zlib compression, TLS to the listener; the session's answers are the same as direct."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import trustme

from sidecar.testing.mongo import MongoTestServer
from tests.integration.mongo.conftest import config, sidecar

NODE_DIR = Path(__file__).parent / "node"


def node() -> str:
    path = shutil.which("node")
    if path is None or not (NODE_DIR / "node_modules" / "mongodb").exists():
        pytest.fail(
            "the Node.js driver is not installed: `make test` installs it (tools/test-deps.sh: Debian's nodejs "
            f"and npm, then `npm ci` in {NODE_DIR})"
        )
    return path


async def run(uri: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        node(),
        str(NODE_DIR / "session.js"),
        uri,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
async def test_the_node_driver_keeps_its_uri_with_credentials(mechanism: str, tmp_path: Path) -> None:
    ca = trustme.CA()
    server_pem, ca_pem = tmp_path / "server.pem", tmp_path / "ca.pem"
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    options = f"authSource=admin&authMechanism={mechanism}&compressors=zlib"
    async with MongoTestServer("mongos") as direct_server, MongoTestServer("mongos") as proxied_server:
        for server in (direct_server, proxied_server):
            server.add_user("orders", "orders-pw")
        direct = await run(f"mongodb://orders:orders-pw@{direct_server.endpoint}/?{options}")
        cfg = config(
            [],
            listener={"app_auth": {}, "compressors": ["zlib"], "tls": {"cert_file": str(server_pem)}},
        )
        cfg["upstreams"]["db"] = {
            "uri": f"mongodb://orders:orders-pw@{proxied_server.endpoint}/?authSource=admin"
        }
        async with sidecar(cfg) as sc:
            proxied = await run(
                f"mongodb://orders:orders-pw@{sc.host}:{sc.port}/?{options}&tls=true&tlsCAFile={ca_pem}"
            )
            wrong = await run(
                f"mongodb://orders:nope@{sc.host}:{sc.port}/?{options}&tls=true&tlsCAFile={ca_pem}"
            )
    assert proxied == direct
    assert direct["insert_duplicate"]["code"] == 11000 and direct["find_one"]["ok"]["s"] == "changed"
    assert {c.user for c in proxied_server.commands("insert")} == {"orders"}
    assert (wrong["ping"]["code"], wrong["ping"]["codeName"]) == (18, "AuthenticationFailed")
