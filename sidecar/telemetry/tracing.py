"""OpenTelemetry tracing: the only module that imports the OpenTelemetry SDK, loaded only when traces are on
(``telemetry.traces.exporter`` other than ``none``, or a test's exporter: ``sidecar/parts.py``). With traces
off no OpenTelemetry module is imported at all: the observer checks for a tracer and goes no further.

:class:`Tracer` is what the observer calls: a request span continuing the caller's trace context, a child
span per attempt with the context to send upstream, an error status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as ot
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ..config.schema import TelemetryConfig

PROPAGATOR = TraceContextTextMapPropagator()


class Tracer:
    """Spans for the sidecar's requests and attempts, through a tracer provider of our own (never the global
    one) exporting as ``cfg`` says; ``exporter`` (tests) wins."""

    def __init__(self, cfg: TelemetryConfig, exporter: SpanExporter | None = None) -> None:
        self.provider = make_provider(cfg, exporter)
        self.tracer = self.provider.get_tracer("retry-sidecar", __version__)

    def request_span(self, name: str, parent: Mapping[str, str] | None, attributes: Mapping[str, Any]) -> Any:
        """A request's span (kind SERVER), the child of the trace context in ``parent`` (incoming headers or
        metadata) when it carries one."""
        ctx = PROPAGATOR.extract(parent) if parent else None
        return self.tracer.start_span(name, context=ctx, kind=SpanKind.SERVER, attributes=attributes)

    def attempt_span(
        self, request_span: Any, name: str, attributes: Mapping[str, Any]
    ) -> tuple[Any, dict[str, str]]:
        """An attempt's span (kind CLIENT) under its request's, and the trace context to send upstream with it."""
        span = self.tracer.start_span(
            name, context=ot.set_span_in_context(request_span), kind=SpanKind.CLIENT, attributes=attributes
        )
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, context=ot.set_span_in_context(span))
        return span, carrier

    @staticmethod
    def fail(span: Any, description: str) -> None:
        span.set_status(Status(StatusCode.ERROR, description))

    def shutdown(self) -> None:
        self.provider.shutdown()


def make_provider(cfg: TelemetryConfig, exporter: SpanExporter | None = None) -> TracerProvider:
    traces = cfg.traces
    provider = TracerProvider(
        resource=Resource.create({"service.name": cfg.service_name, "service.version": __version__}),
        sampler=ParentBased(TraceIdRatioBased(traces.sample_ratio)),
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif traces.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(traces.protocol, traces.endpoint)))
    return provider


def _otlp_exporter(protocol: str, endpoint: str | None) -> Any:
    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(endpoint=endpoint) if endpoint else HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint) if endpoint else GrpcExporter()
