"""Real pymongo -> the sidecar (in-process App) -> MongoDB test servers, all on 127.0.0.1 port 0."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pymongo
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pymongo.errors import OperationFailure

from sidecar.app import App
from sidecar.config import load_dict

NO_DRIVER_RETRIES = "retryReads=false&retryWrites=false&maxAdaptiveRetries=0"
OVERLOAD = {"error_code": 462, "error_labels": ["SystemOverloadedError", "RetryableError"]}


def config(
    endpoints: list[str],
    policy: dict[str, Any] | None = None,
    upstream: dict[str, Any] | None = None,
    listener: dict[str, Any] | None = None,
) -> dict[str, Any]:
    pol = {"extends": "mongodb-backpressure", **(policy or {})}
    return {
        "admin": {"listen": None},
        "policies": {"p": pol},
        "upstreams": {"db": {"endpoints": endpoints, **(upstream or {})}},
        "listeners": [
            {
                "name": "mongo",
                "protocol": "mongodb",
                "listen": "127.0.0.1:0",
                "upstream": "db",
                "policy": "p",
                **(listener or {}),
            }
        ],
    }


class Sidecar:
    def __init__(self, app: App, spans: InMemorySpanExporter) -> None:
        self.app = app
        self.spans = spans
        self.host, self.port = app.address("mongo")

    def uri(self, options: str = NO_DRIVER_RETRIES) -> str:
        return (
            f"mongodb://{self.host}:{self.port}/?{options}"
            if options
            else f"mongodb://{self.host}:{self.port}/"
        )

    def client(self, options: str = NO_DRIVER_RETRIES, **kwargs: Any) -> pymongo.MongoClient:
        return pymongo.MongoClient(self.uri(options), serverSelectionTimeoutMS=5000, **kwargs)

    async def failure(
        self, op: Callable[[pymongo.MongoClient], Any], options: str = NO_DRIVER_RETRIES
    ) -> pytest.ExceptionInfo[OperationFailure]:
        """Run ``op`` with a fresh client (off the event loop); it must fail. Returns what the app got."""
        client = self.client(options)
        try:
            with pytest.raises(OperationFailure) as e:
                await in_thread(lambda: op(client))
        finally:
            await in_thread(client.close)
        return e


@contextlib.asynccontextmanager
async def sidecar(
    cfg: dict[str, Any], rand: Callable[[], float] = lambda: 0.0, environ: dict[str, str] | None = None
) -> AsyncIterator[Sidecar]:
    spans = InMemorySpanExporter()
    async with App(load_dict(cfg, environ or {}), rand=rand, span_exporter=spans) as app:
        yield Sidecar(app, spans)


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run blocking pymongo code off the event loop that runs the sidecar and the test servers."""
    return await asyncio.to_thread(fn)


@pytest.fixture
def overload() -> dict[str, Any]:
    return dict(OVERLOAD)
