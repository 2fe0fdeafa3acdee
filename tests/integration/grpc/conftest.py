"""Real grpcio clients -> the sidecar (in-process App) -> real grpc.aio upstreams that inject faults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.grpc_upstream import GrpcUpstream
from tests.metrics import metric

FAST = {"initial": "1ms", "max": "1ms", "multiplier": 1, "jitter": "none"}


class Spans(SpanExporter):
    """Keeps finished spans and lets a test wait for the request (SERVER) spans to end."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self._ended = asyncio.Event()
        self._exported = asyncio.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        self._exported.set()
        if any(s.kind is SpanKind.SERVER for s in spans):
            self._ended.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def requests(self) -> list[ReadableSpan]:
        return [s for s in self.spans if s.kind is SpanKind.SERVER]

    def attempts(self) -> list[ReadableSpan]:
        return sorted(
            (s for s in self.spans if s.kind is SpanKind.CLIENT),
            key=lambda s: s.attributes["sidecar.attempt"],
        )

    async def wait_attempts(self, n: int) -> list[ReadableSpan]:
        """Until ``n`` attempt spans ended (an attempt span ends with its result, or when it is cancelled)."""
        while len(self.attempts()) < n:
            self._exported.clear()
            await self._exported.wait()
        return self.attempts()

    async def wait_requests(self, n: int) -> list[ReadableSpan]:
        while len(self.requests()) < n:
            self._ended.clear()
            await self._ended.wait()
        return self.requests()


def config(endpoints: list[str], policy: dict | None = None, **listener: Any) -> dict:
    policies = {"p": {"extends": "grpc-a6", "backoff": FAST, **(policy or {})}}
    return {
        "admin": {"listen": None},
        "upstreams": {"u": {"endpoints": endpoints}},
        "policies": policies,
        "listeners": [
            {
                "name": "g",
                "protocol": "grpc",
                "listen": "127.0.0.1:0",
                "upstream": "u",
                "policy": "p",
                **listener,
            }
        ],
    }


class Sidecar:
    def __init__(self, app: App, channel: grpc.aio.Channel, spans: Spans) -> None:
        self.app = app
        self.channel = channel
        self.spans = spans

    def unary(self, method: str = "/pkg.Svc/Get") -> grpc.aio.UnaryUnaryMultiCallable:
        return self.channel.unary_unary(method)

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.app, name, **labels)


@asynccontextmanager
async def sidecar(cfg: dict, rand: Callable[[], float] = lambda: 0.0) -> AsyncIterator[Sidecar]:
    spans = Spans()
    async with App(load_dict(cfg, {}), rand=rand, span_exporter=spans) as app:
        host, port = app.address("g")
        async with grpc.aio.insecure_channel(f"{host}:{port}", options=(("grpc.enable_retries", 0),)) as ch:
            yield Sidecar(app, ch, spans)


@pytest.fixture
async def up() -> AsyncIterator[GrpcUpstream]:
    async with GrpcUpstream() as u:
        yield u


@pytest.fixture
async def up2() -> AsyncIterator[GrpcUpstream]:
    async with GrpcUpstream() as u:
        yield u
