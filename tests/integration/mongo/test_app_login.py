"""The app keeps its connection string: it logs in to the sidecar with its own user (SCRAM-SHA-256 and
SCRAM-SHA-1, speculative in the first hello or not), the sidecar verifies it, and the app's commands reach
the upstream over connections logged in as that same user, so the server's own authorization applies.
Real pymongo (sync and async) against the MongoDB test server with users and roles (issue 23 point 2)."""

from __future__ import annotations

import logging
from typing import Any

import pymongo
import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure

from sidecar.testing.mongo import MongoTestServer

from .conftest import NO_DRIVER_RETRIES, config, in_thread, sidecar

ORDERS_PW = "orders-Pa55,w=rd"
REPORTS_PW = "reports-pa55word"


def uri_config(uri: str, listener: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's config with the upstream written as a URI (no ``endpoints``)."""
    cfg = config([], upstream={"uri": uri}, listener=listener)
    del cfg["upstreams"]["db"]["endpoints"]
    return cfg


def two_users(uri: str, **app_auth: Any) -> dict[str, Any]:
    users = [
        {"username": "orders", "password": "${ORDERS_PW}", "source": "admin"},
        {"username": "reports", "password": "${REPORTS_PW}", "source": "admin"},
    ]
    return uri_config(uri, {"app_auth": {"users": users, **app_auth}})


def upstream_with_users() -> MongoTestServer:
    up = MongoTestServer("mongos")
    up.add_user("orders", ORDERS_PW)
    up.add_user("reports", REPORTS_PW, role="read")
    return up


ENV = {"ORDERS_PW": ORDERS_PW, "REPORTS_PW": REPORTS_PW}


def app_uri(host: str, port: int, user: str, password: str, extra: str = "") -> str:
    from urllib.parse import quote_plus

    return (
        f"mongodb://{user}:{quote_plus(password)}@{host}:{port}/?authSource=admin&{NO_DRIVER_RETRIES}{extra}"
    )


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1", None])
async def test_the_apps_unchanged_uri_with_credentials_works(mechanism: str | None) -> None:
    """None: no authMechanism, so pymongo asks saslSupportedMechs and logs in speculatively in its hello."""
    async with upstream_with_users() as up:
        uri = f"mongodb://orders:${{ORDERS_PW}}@{up.endpoint}/?authSource=admin"
        async with sidecar(two_users(uri), environ=ENV) as sc:
            extra = f"&authMechanism={mechanism}" if mechanism else ""
            client = pymongo.MongoClient(app_uri(sc.host, sc.port, "orders", ORDERS_PW, extra))
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
                assert await in_thread(lambda: client.test.c.count_documents({})) == 1
            finally:
                await in_thread(client.close)
    ran = [c for c in up.commands() if c.name in ("insert", "aggregate")]
    assert ran and {c.user for c in ran} == {"orders"}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
async def test_speculative_login_in_the_first_hello_with_the_async_client(
    mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    """pymongo sends speculativeAuthenticate in its handshake; the sidecar begins the exchange there (no
    saslStart), and says so when the login is done."""
    async with upstream_with_users() as up:
        uri = f"mongodb://orders:${{ORDERS_PW}}@{up.endpoint}/?authSource=admin"
        async with sidecar(two_users(uri), environ=ENV) as sc:
            client = AsyncMongoClient(
                app_uri(sc.host, sc.port, "orders", ORDERS_PW, f"&authMechanism={mechanism}")
            )
            try:
                with caplog.at_level(logging.DEBUG, logger="sidecar.mongo"):
                    await client.test.c.insert_one({"b": 2})
            finally:
                await client.close()
    assert f"logged in as 'orders' (source 'admin', {mechanism}, speculative)" in caplog.text
    assert ORDERS_PW not in caplog.text
    assert [c.user for c in up.commands("insert")] == ["orders"]


async def test_a_wrong_password_fails_with_18_and_nothing_reaches_the_upstream_as_that_user(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with upstream_with_users() as up:
        uri = f"mongodb://orders:${{ORDERS_PW}}@{up.endpoint}/?authSource=admin"
        async with sidecar(two_users(uri), environ=ENV) as sc:
            for bad_user, bad_pw in [("orders", "not-the-password"), ("nobody", "whatever-pw")]:
                client = pymongo.MongoClient(
                    app_uri(sc.host, sc.port, bad_user, bad_pw), serverSelectionTimeoutMS=5000
                )
                with caplog.at_level(logging.WARNING), pytest.raises(OperationFailure) as e:
                    await in_thread(lambda c=client: c.test.c.find_one())
                await in_thread(client.close)
                assert e.value.code == 18 and "Authentication failed" in str(e.value)
                assert "not-the-password" not in caplog.text and "whatever-pw" not in caplog.text
            assert (
                "login failed for user 'orders'" in caplog.text
                and "login failed for user 'nobody'" in caplog.text
            )
            metrics = sc.app.services.telemetry.metrics.listener("mongo").rejected
            assert metrics.get("auth-failed", 0) >= 2
    assert up.count("find") == 0


async def test_two_users_reach_the_upstream_as_themselves_and_its_authorization_applies() -> None:
    async with upstream_with_users() as up:
        uri = f"mongodb://orders:${{ORDERS_PW}}@{up.endpoint}/?authSource=admin"
        async with sidecar(two_users(uri), environ=ENV) as sc:
            orders = pymongo.MongoClient(app_uri(sc.host, sc.port, "orders", ORDERS_PW))
            reports = pymongo.MongoClient(app_uri(sc.host, sc.port, "reports", REPORTS_PW))
            try:
                await in_thread(lambda: orders.shop.items.insert_one({"n": 1}))
                assert (await in_thread(lambda: reports.shop.items.find_one({})))["n"] == 1
                with pytest.raises(OperationFailure) as e:  # reports may only read: the upstream says so
                    await in_thread(lambda: reports.shop.items.insert_one({"n": 2}))
                assert e.value.code == 13 and "not authorized on shop" in str(e.value)
            finally:
                await in_thread(orders.close)
                await in_thread(reports.close)
    by_user = {(c.name, c.user) for c in up.commands() if c.name in ("insert", "find")}
    assert by_user == {("insert", "orders"), ("find", "reports"), ("insert", "reports")}


async def test_commands_before_a_login_are_refused_with_13_except_what_mongod_allows() -> None:
    async with upstream_with_users() as up:
        uri = f"mongodb://orders:${{ORDERS_PW}}@{up.endpoint}/?authSource=admin"
        async with sidecar(two_users(uri), environ=ENV) as sc:
            client = sc.client()
            try:
                assert (await in_thread(lambda: client.admin.command("ping")))["ok"] == 1
                with pytest.raises(OperationFailure) as e:
                    await in_thread(lambda: client.test.c.find_one())
                assert e.value.code == 13 and "requires authentication" in str(e.value)
            finally:
                await in_thread(client.close)
            assert sc.app.services.telemetry.metrics.listener("mongo").rejected.get("unauthorized", 0) >= 1
    assert up.count("find") == 0


async def test_allow_unauthenticated_acts_as_the_upstreams_identity() -> None:
    async with upstream_with_users() as up:
        uri = f"mongodb://orders:${{ORDERS_PW}}@{up.endpoint}/?authSource=admin"
        async with sidecar(two_users(uri, allow_unauthenticated=True), environ=ENV) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"x": 1}))
            finally:
                await in_thread(client.close)
    assert [c.user for c in up.commands("insert")] == ["orders"]


async def test_app_auth_without_users_takes_the_upstream_uris_user() -> None:
    async with upstream_with_users() as up:
        cfg = uri_config(f"mongodb://orders:${{ORDERS_PW}}@{up.endpoint}/?authSource=admin", {"app_auth": {}})
        async with sidecar(cfg, environ=ENV) as sc:
            client = pymongo.MongoClient(app_uri(sc.host, sc.port, "orders", ORDERS_PW))
            try:
                await in_thread(lambda: client.test.c.insert_one({"x": 1}))
            finally:
                await in_thread(client.close)
    assert [c.user for c in up.commands("insert")] == ["orders"]


async def test_an_upstream_without_credentials_means_no_upstream_login() -> None:
    async with MongoTestServer("mongos") as up:
        users = [{"username": "orders", "password": ORDERS_PW, "source": "admin"}]
        cfg = config([up.endpoint], listener={"app_auth": {"users": users}})
        async with sidecar(cfg) as sc:
            client = pymongo.MongoClient(app_uri(sc.host, sc.port, "orders", ORDERS_PW))
            try:
                await in_thread(lambda: client.test.c.insert_one({"x": 1}))
            finally:
                await in_thread(client.close)
    assert up.count("saslStart") == 0 and [c.user for c in up.commands("insert")] == [None]
