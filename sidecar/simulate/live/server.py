"""The model server as a process: HTTP/1.1 on 127.0.0.1 (aiohttp), answers timed by :mod:`..model`.

Every request is admitted to the :class:`~sidecar.simulate.model.ModelServer` core; a ticker asks the core
every ``tick`` which answers are due and completes them (200 ``OK`` or 503). A handler never gives up on
its request: if the client leaves, the request still holds its place until its answer is due (the core's
rule, the seed's behaviour), and aiohttp is told not to cancel handlers of closed connections. The
listening socket's backlog is ``server.backlog``: while the engine keeps the process stopped (SIGSTOP),
that many connections wait in the kernel, and the rest are not accepted.

Run by the live engine: ``python -m sidecar.simulate.live.server`` (settings on stdin).
"""

from __future__ import annotations

import asyncio
import random
import signal
from typing import Any

from aiohttp import web

from ..model import OK, ModelServer
from ..record import Record
from ..scenario import from_dict
from .wire import clock, hear, run, say

_BODIES = {OK: b"OK\n"}


async def serve(settings: dict[str, Any]) -> None:
    sc = from_dict(settings["scenario"])
    replica = int(settings.get("replica", 0))
    core = ModelServer(sc.server, sc.outage, random.Random(f"{sc.seed}-server-{replica}"))
    loop = asyncio.get_running_loop()
    epoch = loop.time() + 3600.0  # replaced by the engine's start time
    rec = Record(sc.duration)

    async def handle(request: web.Request) -> web.Response:
        fut: asyncio.Future[int] = loop.create_future()
        status = core.admit(clock() - epoch, fut)
        if status is None:
            status = await asyncio.shield(fut)
        return web.Response(status=status, body=_BODIES.get(status, b"unavailable\n"))

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", int(settings.get("port", 0)), backlog=sc.server.backlog)
    await site.start()
    port = site.port
    say(ready={"port": port})
    epoch = float((await hear())["epoch"])

    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    tick = sc.server.tick

    async def ticker() -> None:
        while True:
            now = clock() - epoch
            for fut, status in core.due(now):
                if not fut.done():  # type: ignore[attr-defined]
                    fut.set_result(status)  # type: ignore[attr-defined]
            if now >= 0:
                rec.inflight(now, core.inflight)
            await asyncio.sleep(tick)

    task = asyncio.create_task(ticker())
    await stop.wait()
    task.cancel()
    say(record=rec.to_json())
    await runner.cleanup()


def main() -> None:
    async def go() -> None:
        await serve(await hear())

    run(go)


if __name__ == "__main__":
    main()
