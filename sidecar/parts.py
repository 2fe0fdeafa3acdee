"""The sidecar's optional parts, and which configs need each: one table, so that a process imports what its
config uses and nothing more (issue 27: grpcio, pymongo, redis-py and the OpenTelemetry SDK cost each pod
megabytes of memory and tenths of a second of start; a pod pays only for what its config names).

A part is an object named ``"module:attribute"``, imported the first time it is needed: when the process
starts with a config that uses it, or at a reload that turns it on (a reload that adds a gRPC listener
imports grpcio then). Validating a config never needs a part: the schema (``sidecar/config/``) imports
none of them, so ``sidecar check`` checks every key whatever is installed or loaded.

To add a protocol or a feature, add its entry here: a listener under ``listener.<protocol>`` (what
``adapters.make_listener`` builds), or a part with the test of a config that uses it, and ask for it with
``load(name)`` where it is built. ``used(config)`` lists the parts a config needs (``describe``: logged at
start).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import Config
    from .config.schema import TelemetryConfig


@dataclass(frozen=True, slots=True)
class Part:
    target: str  # "module:attribute", imported when first needed
    used: Callable[[Config], bool]  # does this config need it?
    brings: str  # the heavy libraries it imports (for people reading the table, and the start log)


def traced(telemetry: TelemetryConfig) -> bool:
    return telemetry.traces.exporter != "none"


def fleet_wide(config: Config) -> bool:
    """A retry budget or a listener's request rate shared by the fleet (``scope: fleet``)."""
    if config.fleet is None:
        return False
    if any(u.retry_budget is not None and u.retry_budget.scope == "fleet" for u in config.upstreams.values()):
        return True
    for lc in config.listeners:
        profile = config.admission.get(lc.admission) if lc.admission is not None else None
        if profile is not None and profile.requests is not None and profile.requests.scope == "fleet":
            return True
    return False


def names_resolved(config: Config) -> bool:
    """An endpoint written as a name the sidecar resolves itself (``upstream/discovery.py``)."""
    from .upstream.target import STATIC, parse

    found = config.discovered_upstreams()
    return any(parse(text).kind != STATIC for name in found for text in config.upstreams[name].endpoints)


def _listens(protocol: str) -> Callable[[Config], bool]:
    return lambda config: any(lc.protocol == protocol for lc in config.listeners)


PARTS: dict[str, Part] = {
    "listener.http": Part("sidecar.adapters.http.server:HttpListener", _listens("http"), "httptools"),
    "listener.grpc": Part("sidecar.adapters.grpc.server:GrpcListener", _listens("grpc"), "grpcio"),
    "listener.mongodb": Part(
        "sidecar.adapters.mongo.server:MongoListener",
        _listens("mongodb"),
        "bson (and pymongo, for SASLprep, with SCRAM-SHA-256 authentication)",
    ),
    "tracing": Part(
        "sidecar.telemetry.tracing:Tracer",
        lambda config: traced(config.telemetry),
        "the OpenTelemetry SDK and its exporter (OTLP/gRPC: grpcio, protobuf)",
    ),
    "fleet": Part("sidecar.fleet.link:fleet_link", fleet_wide, "redis-py"),
    "dns": Part("sidecar.upstream.resolver:Resolver", names_resolved, "dnspython"),
}


def register(name: str, part: Part) -> None:
    """Add a part (a protocol or feature defined outside this table)."""
    if name in PARTS and PARTS[name] != part:
        raise ValueError(f"a part named {name!r} is already registered")
    PARTS[name] = part


def load(name: str) -> Any:
    """The part's object, its module imported now if it was not yet."""
    module, _, attribute = PARTS[name].target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_if_used(name: str, config: Config) -> Any:
    """The part's object when ``config`` needs it (imported now if it was not yet), else None."""
    return load(name) if PARTS[name].used(config) else None


def used(config: Config) -> list[str]:
    """The parts ``config`` needs, in the table's order."""
    return [name for name, part in PARTS.items() if part.used(config)]


def describe(config: Config) -> str:
    """One line for the log: the parts ``config`` needs and what each brings."""
    names = used(config)
    return "; ".join(f"{name} ({PARTS[name].brings})" for name in names) if names else "none"
