"""Telemetry: spans and metrics, fed by the runtime's events (the core never imports OpenTelemetry)."""

from .metrics import ListenerMeters, Meters, Metrics
from .observer import RequestObserver, Telemetry

__all__ = ["ListenerMeters", "Meters", "Metrics", "RequestObserver", "Telemetry"]
