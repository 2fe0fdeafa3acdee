"""The deadline the client did not set is the sidecar's own bound, not a userver deadline (issue 11, item 5):
the app gets the upstream's last answer unchanged, or 504 when no upstream answered; never a 498 it did not
ask for."""

from __future__ import annotations

from sidecar.policy import Reason
from sidecar.testing.http_upstream import Fault

from .conftest import config, sidecar

DL = "X-YaTaxi-Client-TimeoutMs"


async def test_a_pushback_past_the_default_deadline_delivers_the_upstream_answer_with_its_retry_after(
    client, upstream
) -> None:
    upstream.then(Fault(503, retry_after="3600", body=b"come back in an hour\n"))
    async with sidecar(config([upstream.endpoint], {"deadline": {"default": "10s"}})) as sc:
        async with client.get(sc.url + "/") as r:  # no deadline from the client
            assert r.status == 503
            assert r.headers["Retry-After"] == "3600"
            assert "X-YaTaxi-Deadline-Expired" not in r.headers
            assert await r.text() == "come back in an hour\n"
        assert upstream.hits == 1
        assert sc.requests(Reason.DEADLINE) == 1  # metrics and spans still say why it ended


async def test_the_same_pushback_past_the_clients_own_deadline_is_its_deadline_answer(client, upstream) -> None:
    upstream.then(Fault(503, retry_after="3600"))
    async with sidecar(config([upstream.endpoint], {"deadline": {"default": "10s"}})) as sc:
        async with client.get(sc.url + "/", headers={DL: "5000"}) as r:
            assert r.status == 498 and r.headers["X-YaTaxi-Deadline-Expired"] == "1"
        assert sc.requests(Reason.DEADLINE) == 1


async def test_no_upstream_answer_within_the_default_deadline_is_504_not_498(client, upstream) -> None:
    upstream.then(Fault(hang=True))
    policy = {"deadline": {"default": "300ms"}, "per_try_timeout": "10s"}
    async with sidecar(config([upstream.endpoint], policy)) as sc:
        async with client.get(sc.url + "/") as r:
            assert r.status == 504
            assert "X-YaTaxi-Deadline-Expired" not in r.headers
            assert "timed out" in await r.text()
        await upstream.wait_cancelled(1)
        assert sc.requests(Reason.DEADLINE) == 1
