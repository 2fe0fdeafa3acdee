"""Limits change on reload without dropping queued requests; a listener may switch profiles or drop admission.
Real aiohttp clients through the sidecar; the reload is ``App.apply`` (what SIGHUP and the file watcher run)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from sidecar.config import load_dict
from sidecar.testing.http_upstream import FaultyUpstream

from ..http.conftest import sidecar
from .test_http import get, wait_for, with_admission


def reloaded(endpoint: str, profiles: dict[str, Any], use: str | None, **listener: Any) -> Any:
    cfg = with_admission(endpoint, {}, **listener)
    cfg["admission"] = profiles
    if use is None:
        del cfg["listeners"][0]["admission"]
    else:
        cfg["listeners"][0]["admission"] = use
    return load_dict(cfg, {})


async def test_a_reload_keeps_queued_requests_and_applies_the_new_limits(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    slow = {"requests": {"rate": 0.1, "burst": "10s", "max_queue": 5, "max_wait": "none"}}  # 1, then 1 per 10 s
    async with sidecar(with_admission(upstream.endpoint, slow)) as sc:
        assert (await get(client, sc.url + "/first"))[0] == 200
        queued = asyncio.create_task(get(client, sc.url + "/queued"))  # due in 10 s
        await wait_for(lambda: sc.metric("sidecar_admission_added_to_queue_total", listener="web") == 1)
        bucket = sc.app.services.door("web").requests
        faster = {"requests": {"rate": 1, "burst": "1s", "max_queue": 0}}
        assert sc.app.apply(reloaded(upstream.endpoint, {"front": faster}, "front"))
        assert sc.app.services.door("web").requests is bucket and bucket.rate == 1
        assert bucket.queued == 1  # still waiting for the token it borrowed; not dropped
        # a new request comes after it (its borrowed token is not jumped): refused, under the new policy
        status, headers, _ = await get(client, sc.url + "/new")
        assert status == 429 and headers["RateLimit-Policy"] == '"front";q=1;w=1'
        queued.cancel()  # its client gives up: its token goes back
        await wait_for(lambda: bucket.queued == 0)
        async with asyncio.timeout(20):  # the new rate refills a token within a second
            while (await get(client, sc.url + "/after"))[0] != 200:
                pass


async def test_a_listener_switches_profile_and_drops_admission(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    none_left = {"requests": {"rate": 0.001, "burst": "1s"}}
    profiles = {"strict": none_left, "open": {"requests": {"rate": 1000}}}
    async with sidecar(with_admission(upstream.endpoint, none_left)) as sc:
        assert (await get(client, sc.url + "/a"))[0] == 200
        assert (await get(client, sc.url + "/b"))[0] == 429
        assert sc.app.apply(reloaded(upstream.endpoint, profiles, "open"))
        # the empty balance carries over (the same bucket, so a queue would too): refilled within 1 ms
        async with asyncio.timeout(20):
            while (answer := await get(client, sc.url + "/c"))[0] != 200:
                assert answer[1]["RateLimit-Policy"] == '"open";q=1000;w=1' and answer[1]["Retry-After"] == "1"
        assert sc.app.apply(reloaded(upstream.endpoint, profiles, "strict"))
        # what the bucket holds carries over, capped at the strict capacity (one token): one more at most
        first, second = await get(client, sc.url + "/e"), await get(client, sc.url + "/e")
        assert first[0] in (200, 429)
        assert second[0] == 429 and second[1]["RateLimit-Policy"] == '"strict";q=1;w=1000'
        assert sc.app.apply(reloaded(upstream.endpoint, profiles, None))
        assert [(await get(client, sc.url + "/f"))[0] for _ in range(5)] == [200] * 5
        assert sc.app.services.door("web") is None
