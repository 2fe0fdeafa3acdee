"""The sidecar authenticates upstream with SCRAM (credentials from config, never logged) and speaks TLS."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest

from sidecar.testing.mongo import MongoTestServer

from ..tls import server_certificate
from .conftest import config, in_thread, sidecar

SECRET = "s3cr3t-Pa55,word="


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
async def test_scram_credentials_from_the_environment(
    mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    auth = {"username": "app", "password": "${DB_PASSWORD}", "mechanism": mechanism}
    async with MongoTestServer("mongos", users={"app": SECRET}) as up:
        with caplog.at_level(logging.DEBUG):
            async with sidecar(
                config([up.endpoint], upstream={"auth": auth}), environ={"DB_PASSWORD": SECRET}
            ) as sc:
                client = sc.client()
                try:
                    await in_thread(lambda: client.test.c.insert_one({"a": 1}))
                    assert await in_thread(lambda: client.test.c.count_documents({})) == 1
                finally:
                    await in_thread(client.close)
    assert up.count("saslStart") >= 1
    assert SECRET not in caplog.text


async def test_wrong_credentials_reach_the_app_as_a_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    auth = {"username": "app", "password": "wrong-password"}
    async with MongoTestServer("mongos", users={"app": SECRET}) as up:
        with caplog.at_level(logging.DEBUG):
            async with sidecar(config([up.endpoint], upstream={"auth": auth})) as sc:
                e = await sc.failure(lambda client: client.test.c.find_one())
    assert e.value.code == 18 and "upstream 'db'" in str(e.value)
    assert up.count("find") == 0
    assert "wrong-password" not in caplog.text and "wrong-password" not in str(e.value)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return server_certificate(tmp_path_factory.mktemp("tls"), "localhost", "IP:127.0.0.1,DNS:localhost")


async def test_tls_to_the_upstream_verified_against_a_ca_file(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    async with (
        MongoTestServer("mongos", ssl_context=ctx) as up,
        sidecar(config([up.endpoint], upstream={"tls": {"ca_file": str(cert)}})) as sc,
    ):
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))
        finally:
            await in_thread(client.close)
    assert up.count("insert") == 1


async def test_tls_with_an_unknown_ca_fails_as_a_connect_failure(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    async with (
        MongoTestServer("mongos", ssl_context=ctx) as up,
        sidecar(config([up.endpoint], upstream={"tls": {}})) as sc,
    ):  # system CAs only
        e = await sc.failure(lambda client: client.test.c.find_one())
    assert e.value.code == 133 and "CERTIFICATE_VERIFY_FAILED" in str(e.value)
    assert up.count("find") == 0


async def test_tls_with_a_client_certificate(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(cert))
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED  # the server insists on a client certificate
    tls = {"ca_file": str(cert), "cert_file": str(cert), "key_file": str(key), "server_name": "localhost"}
    async with (
        MongoTestServer("mongos", ssl_context=ctx) as up,
        sidecar(config([up.endpoint], upstream={"tls": tls})) as sc,
    ):
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))
        finally:
            await in_thread(client.close)
    assert up.count("insert") == 1
