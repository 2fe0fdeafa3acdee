"""The runtime's shared timer heap: one loop timer for many wake-ups (on a real event loop; waits are on
events, and the times used are only ever compared, never measured)."""

from __future__ import annotations

import asyncio

from sidecar.timers import Timers, timers_for


async def test_callbacks_fire_in_time_order_and_cancelled_ones_never() -> None:
    loop = asyncio.get_running_loop()
    timers = Timers(loop)
    fired: list[str] = []
    done = asyncio.Event()
    now = loop.time()
    timers.call_at(now + 0.02, lambda: fired.append("c") or done.set())
    timers.call_at(now + 0.01, lambda: fired.append("b"))
    dead = timers.call_at(now + 0.005, lambda: fired.append("never"))
    timers.call_at(now + 0.001, lambda: fired.append("a"))  # earlier than everything: re-arms the loop timer
    timers.cancel(dead)
    await done.wait()
    assert fired == ["a", "b", "c"]
    assert len(timers) == 0


async def test_cancelled_entries_are_compacted_so_memory_tracks_live_timers() -> None:
    timers = Timers(asyncio.get_running_loop())
    far = asyncio.get_running_loop().time() + 3600
    entries = [timers.call_at(far + i, lambda: None) for i in range(10_000)]
    for e in entries[:-10]:
        timers.cancel(e)
    assert len(timers) == 10
    assert len(timers._heap) < 200  # dead entries were dropped, not kept for an hour
    for e in entries[-10:]:
        timers.cancel(e)


async def test_one_heap_per_loop() -> None:
    assert timers_for(asyncio.get_running_loop()) is timers_for(asyncio.get_running_loop())
