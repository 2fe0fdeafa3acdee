"""The composition root: build shared services from a validated config, start listeners and the admin port,
drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import signal
from collections.abc import Callable

from opentelemetry.sdk.trace.export import SpanExporter

from . import native
from .adapters import Listener, make_listener
from .admin import AdminServer
from .config import Config, effective
from .fleet.link import fleet_link
from .services import Services
from .telemetry import Telemetry

log = logging.getLogger("sidecar")


class App:
    """The sidecar. ``async with App(config) as app:`` starts it; ``app.address(name)`` tells where a
    listener is bound (useful with port 0)."""

    def __init__(
        self,
        config: Config,
        *,
        rand: Callable[[], float] | None = None,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        self.config = config
        self.telemetry = Telemetry(config.telemetry, span_exporter=span_exporter)
        self.services = Services(config, self.telemetry, rand or random.Random().random)
        self.listeners: list[Listener] = [make_listener(lc, self.services) for lc in config.listeners]
        self.fleet = fleet_link(config, self.services)  # None: no fleet-wide budget
        self.ready = False
        self.admin: AdminServer | None = None
        if config.admin.listen is not None:
            self.admin = AdminServer(
                config.admin.listen,
                registry=self.telemetry.metrics.registry,
                ready=lambda: self.ready,
                effective_config=effective(config),
            )

    def address(self, listener: str) -> tuple[str, int]:
        for lst in self.listeners:
            if lst.name == listener:
                return lst.address
        raise KeyError(f"no listener named {listener!r}")

    async def start(self) -> None:
        try:
            if self.admin is not None:
                await self.admin.start()
            for lst in self.listeners:
                await lst.start()
                host, port = lst.address
                log.info("listener %s ready on %s:%d", lst.name, host, port)
            if self.fleet is not None:
                await self.fleet.start()
        except BaseException:
            await self.stop(0)
            raise
        self.ready = True

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let requests in progress finish for up to ``grace`` seconds, then close."""
        self.ready = False
        g = self.config.shutdown.grace if grace is None else grace
        await asyncio.gather(*(lst.stop(g) for lst in self.listeners), return_exceptions=True)
        if self.fleet is not None:
            await self.fleet.stop()
        if self.admin is not None:
            await self.admin.stop()
        self.telemetry.shutdown()

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(0)


async def serve(config: Config) -> None:
    """Run until SIGTERM or SIGINT, then drain."""
    app = App(config)
    await app.start()
    log.info("hot path %s", "compiled with mypyc" if native.compiled() else "running as pure Python (slower)")
    # Everything built so far lives as long as the process: keep the cyclic GC from scanning it again and
    # again (its thresholds stay: rarer, larger collections showed in the p99 at 1,000 requests/s).
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if app.admin is not None:
        log.info("admin on http://%s:%d (healthz, readyz, metrics, config)", *app.admin.address)
    await stop.wait()
    log.info("shutting down: draining for up to %.1fs", config.shutdown.grace)
    await app.stop()
