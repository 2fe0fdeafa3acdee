"""A record looked up now and again, on the loop: the thin driver around a pure schedule.

``Poller(name, lookup, after, on_result)`` runs ``lookup()`` at once when started, hands each result to
``on_result``, then waits ``after(result)`` seconds and looks again, until stopped. Nothing here decides
anything (``schedule.py`` does); a lookup that raises (a bug: lookups answer failures as results) is logged
and tried again after ``retry`` seconds, so a poller never dies. Used for an upstream's names
(``discovery.py``) and meant for any record an adapter follows (a ``mongodb+srv://`` seed list and its TXT
options, issue 23).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger("sidecar.dns")

R = TypeVar("R")


class Poller(Generic[R]):
    def __init__(
        self,
        name: str,
        lookup: Callable[[], Awaitable[R]],
        after: Callable[[R], float],
        on_result: Callable[[R], None],
        retry: float = 1.0,
    ) -> None:
        self.name = name
        self._lookup = lookup
        self._after = after
        self._on_result = on_result
        self._retry = retry
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()
        self.results = 0

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Look now, then on schedule (again: nothing)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"poll {self.name}")

    async def first(self) -> None:
        """Until the first result was handed over."""
        await self._first.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                result = await self._lookup()
            except Exception:
                log.exception(
                    "%s: the lookup failed unexpectedly; trying again in %gs", self.name, self._retry
                )
                await asyncio.sleep(self._retry)
                continue
            self.results += 1
            try:
                self._on_result(result)
                wait = self._after(result)
            except Exception:
                log.exception("%s: handling a lookup's result failed", self.name)
                wait = self._retry
            self._first.set()
            await asyncio.sleep(wait)
