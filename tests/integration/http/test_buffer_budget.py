"""Request bodies kept for replay count against ``limits.max_buffered_bytes``: stalled uploads cannot take
the sidecar past it, a request without a body still goes through, and every byte is given back."""

from __future__ import annotations

import asyncio

import aiohttp

from sidecar.testing.http_upstream import FaultyUpstream

from .conftest import config, sidecar


async def test_stalled_uploads_stay_within_the_budget_and_give_it_back(upstream: FaultyUpstream) -> None:
    cfg = config([upstream.endpoint], listener={"request_body_timeout": "1s"})
    cfg["limits"] = {"max_buffered_bytes": "1MiB"}
    async with sidecar(cfg) as sc, aiohttp.ClientSession() as http:
        budget = sc.app.services.buffers
        head = b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 900000\r\n\r\n"
        uploads = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection(sc.host, sc.port)
            writer.write(head + b"x" * 800_000)  # most of the body, then nothing more
            uploads.append((reader, writer))
        async with asyncio.timeout(20):
            while budget.used < 1024 * 1024:  # the budget fills up: reading stops there
                await asyncio.sleep(0.01)
        assert budget.used <= 1024 * 1024 + 800_000  # at most what one read brought in past it
        async with http.get(sc.url + "/plain") as r:  # no body: not held back
            assert r.status == 200
        for reader, writer in uploads:  # each stalled body is cut (408: request_body_timeout), bytes go back
            try:
                async with asyncio.timeout(30):
                    answer = await reader.read()
                assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
            except ConnectionResetError:
                pass  # closed with our unread bytes in its buffer: the kernel resets, the 408 may be lost
            writer.close()
        async with asyncio.timeout(10):
            while budget.used:
                await asyncio.sleep(0.01)
