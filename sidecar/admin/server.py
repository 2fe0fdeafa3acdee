"""``/healthz`` (the process runs), ``/readyz`` (every listener is bound and accepting), ``/metrics`` (Prometheus text),
``/config`` (the effective configuration, secrets redacted).

The pages are plain functions in a route table (``routes.py``); this module only carries them over HTTP."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..config.units import split_host_port
from .routes import JSON, NOT_FOUND, AdminRequest, AdminResponse, Route, text


class AdminServer:
    def __init__(
        self,
        listen: str,
        *,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        effective_config: dict[str, Any],
        live: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """``live``: what ``/config`` shows beside the effective config, read when asked (each upstream's
        resolved addresses)."""
        self.host, self.port = split_host_port(listen)
        self._registry = registry
        self._ready = ready
        self._config: dict[str, Any] = {}
        self._live = live
        self.show(effective_config)
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] = (self.host, self.port)
        #: GET routes by exact path; more may be added before ``start`` (``add``).
        self.routes: dict[str, Route] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/config": self._config_page,
        }

    def add(self, path: str, route: Route) -> None:
        self.routes[path] = route

    def show(self, effective_config: dict[str, Any]) -> None:
        """``/config`` answers with this from now on (the live config, after a reload)."""
        self._config = effective_config

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._serve)
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

    async def _serve(self, request: web.Request) -> web.Response:
        route = self.routes.get(request.path)
        if route is None:
            found = NOT_FOUND
        elif request.method not in ("GET", "HEAD"):
            found = AdminResponse(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
        else:
            query = {k: request.query[k] for k in request.query}
            result = route(AdminRequest(request.method, request.path, query, request.remote or ""))
            found = await result if inspect.isawaitable(result) else result
        return web.Response(
            status=found.status,
            body=found.body,
            headers={"Content-Type": found.content_type, **dict(found.headers)},
        )

    def _healthz(self, request: AdminRequest) -> AdminResponse:
        return text("ok\n")

    def _readyz(self, request: AdminRequest) -> AdminResponse:
        return text("ready\n") if self._ready() else text("not ready\n", 503)

    def _metrics(self, request: AdminRequest) -> AdminResponse:
        return AdminResponse(200, generate_latest(self._registry), CONTENT_TYPE_LATEST)

    def _config_page(self, request: AdminRequest) -> AdminResponse:
        data = self._config if self._live is None else {**self._config, **self._live()}
        return AdminResponse(200, json.dumps(data, indent=2).encode(), JSON)
