"""A route_guide-style service on raw bytes (generic handlers, no generated code), with all four call
shapes and the behaviours the differential suite compares: metadata echoed both ways (``-bin`` keys too),
errors with details and binary trailers, gzip responses, a call that waits for its deadline or its
cancellation, and large messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

SERVICE = "routeguide.RouteGuide"
DETAILS_BIN = b"\x08\x03\x12\x0bbad point\x00\xff"


def _echo_md(context: grpc.aio.ServicerContext, prefix: str) -> tuple[tuple[str, Any], ...]:
    """The client's ``x-echo-*`` metadata, renamed with ``prefix`` (``-bin`` kept last)."""
    return tuple(
        (prefix + m.key[len("x-echo-") :], m.value)
        for m in context.invocation_metadata() or ()
        if m.key.startswith("x-echo-")
    )


class RouteGuide(grpc.GenericRpcHandler):
    def __init__(self) -> None:
        self.ended: asyncio.Queue[str] = asyncio.Queue()  # one "cancelled" per Wait call that ended
        self._methods: dict[str, grpc.RpcMethodHandler] = {
            "GetFeature": grpc.unary_unary_rpc_method_handler(self.get_feature),
            "ListFeatures": grpc.unary_stream_rpc_method_handler(self.list_features),
            "RecordRoute": grpc.stream_unary_rpc_method_handler(self.record_route),
            "RouteChat": grpc.stream_stream_rpc_method_handler(self.route_chat),
            "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
            "Wait": grpc.unary_stream_rpc_method_handler(self.wait),
            "Gzip": grpc.unary_unary_rpc_method_handler(self.gzip),
        }

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        service, _, method = details.method.lstrip("/").partition("/")
        return self._methods.get(method) if service == SERVICE else None

    async def get_feature(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        initial = _echo_md(context, "x-head-")
        if initial:
            await context.send_initial_metadata(initial)
        context.set_trailing_metadata((*_echo_md(context, "x-tail-"), ("x-feature", "found")))
        return b"feature at " + request

    async def list_features(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield b"feature %d" % i
        context.set_trailing_metadata((("x-count", request.decode()),))

    async def record_route(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        points = [p async for p in requests]
        return b"%d points: %s" % (len(points), b",".join(points))

    async def route_chat(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        notes: list[bytes] = []
        async for note in requests:
            for earlier in notes:
                yield b"earlier: " + earlier
            notes.append(note)
            yield b"got: " + note

    async def fail(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "no feature at " + request.decode(),
            (("grpc-status-details-bin", DETAILS_BIN), ("x-reason", "out of bounds")),
        )
        raise AssertionError("abort returns no further")

    async def wait(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Streams ``request`` messages, then waits for the deadline or the client's cancellation."""
        try:
            for i in range(int(request)):
                yield b"tick %d" % i
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.ended.put_nowait("cancelled")
            raise

    async def gzip(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        context.set_compression(grpc.Compression.Gzip)
        return request * 2
