"""Telemetry: spans and metrics, fed by the runtime's events (the core never imports OpenTelemetry)."""

from .metrics import Meters, Metrics
from .observer import RequestObserver, Telemetry

__all__ = ["Meters", "Metrics", "RequestObserver", "Telemetry"]
