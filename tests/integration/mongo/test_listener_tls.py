"""TLS on the MongoDB listener (issue 23 point 3): an app with ``tls=true`` and ``tlsCAFile`` connects;
with ``ca_file``, a client certificate is required and verified. Certificates made at test time (trustme)."""

from __future__ import annotations

from pathlib import Path

import pymongo
import pytest
import trustme
from pymongo.errors import ServerSelectionTimeoutError

from sidecar.testing.mongo import MongoTestServer

from .conftest import NO_DRIVER_RETRIES, config, in_thread, sidecar


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("app@example.net")
    stranger = other_ca.issue_cert("stranger@example.net")
    paths = {
        "ca": d / "ca.pem",
        "server": d / "server.pem",
        "client": d / "client.pem",
        "stranger": d / "stranger.pem",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.private_key_and_cert_chain_pem.write_to_path(str(paths["server"]))
    client.private_key_and_cert_chain_pem.write_to_path(str(paths["client"]))
    stranger.private_key_and_cert_chain_pem.write_to_path(str(paths["stranger"]))
    return paths


def client(host: str, port: int, options: str) -> pymongo.MongoClient:
    uri = f"mongodb://{host}:{port}/?{NO_DRIVER_RETRIES}" + (f"&{options}" if options else "")
    return pymongo.MongoClient(uri, serverSelectionTimeoutMS=3000)


async def test_an_app_with_tls_true_connects(pki: dict[str, Path]) -> None:
    async with MongoTestServer("mongos") as up:
        cfg = config([up.endpoint], listener={"tls": {"cert_file": str(pki["server"])}})
        async with sidecar(cfg) as sc:
            app = client(sc.host, sc.port, f"tls=true&tlsCAFile={pki['ca']}")
            plain = client(sc.host, sc.port, "")
            try:
                await in_thread(lambda: app.test.c.insert_one({"a": 1}))
                assert (await in_thread(lambda: app.test.c.find_one()))["a"] == 1
                with pytest.raises(ServerSelectionTimeoutError):  # no TLS, no conversation
                    await in_thread(lambda: plain.admin.command("ping"))
            finally:
                await in_thread(app.close)
                await in_thread(plain.close)
    assert up.count("insert") == 1


async def test_with_ca_file_a_client_certificate_is_required_and_verified(pki: dict[str, Path]) -> None:
    async with MongoTestServer("mongos") as up:
        tls = {"cert_file": str(pki["server"]), "ca_file": str(pki["ca"])}
        async with sidecar(config([up.endpoint], listener={"tls": tls})) as sc:
            base = f"tls=true&tlsCAFile={pki['ca']}"
            good = client(sc.host, sc.port, f"{base}&tlsCertificateKeyFile={pki['client']}")
            none = client(sc.host, sc.port, base)
            stranger = client(sc.host, sc.port, f"{base}&tlsCertificateKeyFile={pki['stranger']}")
            try:
                assert (await in_thread(lambda: good.admin.command("ping")))["ok"] == 1
                for refused in (none, stranger):
                    with pytest.raises(ServerSelectionTimeoutError):
                        await in_thread(lambda c=refused: c.admin.command("ping"))
            finally:
                for c in (good, none, stranger):
                    await in_thread(c.close)
