"""The clients as a process: ``clients.count`` asyncio tasks on one aiohttp session (keep-alive pool, no
connection limit), each waiting exponentially distributed gaps between requests.

* ``fixed`` / ``backoff``: a client sends to a server replica chosen at random, with its own timeout per
  attempt (``asyncio.timeout``: the connection is closed, the server is not told), and retries failed
  or timed-out attempts itself, waiting as :class:`~..retry.Waits` says, until one succeeds.
* ``sidecar``: a client sends once, to the sidecar, telling it its timeout in the policy's deadline header
  (``X-YaTaxi-Client-TimeoutMs``); the sidecar answers by then. The client's own timer (the timeout plus
  ``GRACE``) is only a safety net. An answer of the policy's ``deadline.expired_status`` (498) or 504 is
  counted as a timeout, any other non-2xx as an error.

Run by the live engine: ``python -m sidecar.simulate.live.clients`` (settings on stdin).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp

from ..record import Record
from ..retry import Waits, mean_gap
from ..scenario import Scenario, from_dict
from .wire import clock, hear, run, say

GRACE = 0.25


class Clients:
    def __init__(
        self,
        sc: Scenario,
        strategy: str,
        targets: list[str],
        deadline_header: str,
        deadline_statuses: frozenset[int],
    ) -> None:
        self.sc = sc
        self.spec = sc.clients
        self.strategy = strategy
        self.targets = targets
        self.deadline_header = deadline_header
        self.deadline_statuses = deadline_statuses
        self.rand = random.Random(f"{sc.seed}-clients")
        self.rec = Record(sc.duration)
        self.open: dict[int, float] = {}
        self.epoch = 0.0
        self.session: aiohttp.ClientSession | None = None

    def now(self) -> float:
        return clock() - self.epoch

    async def run(self, epoch: float) -> Record:
        self.epoch = epoch
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as s:
            self.session = s
            tasks = [asyncio.create_task(self.client(i)) for i in range(self.spec.count)]
            await asyncio.sleep(max(0.0, self.sc.duration - self.now()))
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.rec.open_at_end(list(self.open.values()), self.sc.duration, self.spec.timeout)
        return self.rec

    async def client(self, i: int) -> None:
        gap = mean_gap(self.spec)
        rand = self.rand
        while True:
            await asyncio.sleep(rand.expovariate(1.0 / gap))
            since = self.now()
            self.open[i] = since
            self.rec.started(since)
            if self.strategy == "sidecar":
                ok = await self.through_sidecar()
            else:
                ok = await self.by_itself()
            self.rec.ended(self.now(), since, ok)
            del self.open[i]

    async def by_itself(self) -> bool:
        waits: Waits | None = None
        attempts = 0
        start = self.now()
        limit = self.spec.max_attempts
        while True:
            attempts += 1
            url = self.targets[int(self.rand.random() * len(self.targets))]
            self.rec.attempt(self.now())
            result = await self.attempt(url, {}, self.spec.timeout)
            if result == "ok":
                return True
            self.record_failure(result)
            if self.now() - start >= self.spec.patience or (limit is not None and attempts >= limit):
                return False
            if waits is None:
                waits = Waits(self.strategy, self.spec, self.rand)
            await asyncio.sleep(waits.next())

    async def through_sidecar(self) -> bool:
        timeout = self.spec.timeout
        headers = {self.deadline_header: str(int(timeout * 1000))}
        result = await self.attempt(self.targets[0], headers, timeout + GRACE)
        if result != "ok":
            self.record_failure(result)
        return result == "ok"

    def record_failure(self, result: str) -> None:
        if result == "timeout":
            self.rec.timeout(self.now())
        else:
            self.rec.error(self.now())

    async def attempt(self, url: str, headers: dict[str, str], timeout: float) -> str:
        assert self.session is not None
        try:
            async with asyncio.timeout(timeout):
                async with self.session.get(url, headers=headers) as resp:
                    await resp.read()
                    if 200 <= resp.status < 300:
                        return "ok"
                    return "timeout" if resp.status in self.deadline_statuses else "error"
        except TimeoutError:
            return "timeout"
        except (aiohttp.ClientError, OSError):
            return "error"


def main() -> None:
    async def go() -> None:
        settings: dict[str, Any] = await hear()
        clients = Clients(
            from_dict(settings["scenario"]),
            settings["strategy"],
            settings["targets"],
            settings.get("deadline_header", "X-YaTaxi-Client-TimeoutMs"),
            frozenset(settings.get("deadline_statuses", (498, 504))),
        )
        say(ready={})
        epoch = float((await hear())["epoch"])
        rec = await clients.run(epoch)
        say(record=rec.to_json())

    run(go)


if __name__ == "__main__":
    main()
