"""The admin port: health, readiness, Prometheus metrics and the effective configuration."""

from .server import AdminServer

__all__ = ["AdminServer"]
