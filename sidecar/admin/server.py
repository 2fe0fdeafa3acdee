"""``/healthz`` (the process runs), ``/readyz`` (every listener is bound and accepting), ``/metrics`` (Prometheus text),
``/config`` (the effective configuration, secrets redacted)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..config.units import split_host_port


class AdminServer:
    def __init__(
        self,
        listen: str,
        *,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        effective_config: dict[str, Any],
    ) -> None:
        self.host, self.port = split_host_port(listen)
        self._registry = registry
        self._ready = ready
        self._config_json = ""
        self.show(effective_config)
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] = (self.host, self.port)

    def show(self, effective_config: dict[str, Any]) -> None:
        """``/config`` answers with this from now on (the live config, after a reload)."""
        self._config_json = json.dumps(effective_config, indent=2)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/config", self._config)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.address = tuple(addresses[0][:2])  # type: ignore[assignment]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _config(self, request: web.Request) -> web.Response:
        return web.Response(text=self._config_json, content_type="application/json")
