"""OpenTelemetry tracing setup: a tracer provider of our own, per the ``telemetry`` config."""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ..config.schema import TelemetryConfig

log = logging.getLogger("sidecar.telemetry")
PROPAGATOR = TraceContextTextMapPropagator()


def make_provider(cfg: TelemetryConfig, exporter: SpanExporter | None = None) -> TracerProvider | None:
    """A provider for the configured exporter, or ``None`` when tracing is off. ``exporter`` (tests) wins."""
    traces = cfg.traces
    if exporter is None and traces.exporter == "none":
        return None
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


def tracer(provider: TracerProvider | None) -> Tracer | None:
    return provider.get_tracer("retry-sidecar", __version__) if provider is not None else None
