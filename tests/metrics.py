"""Reading a running sidecar's Prometheus counters in tests (the registry the admin port serves)."""

from __future__ import annotations

from sidecar.app import App


def metric(app: App, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for family in app.telemetry.metrics.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
