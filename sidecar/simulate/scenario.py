"""The scenario format shared by both engines: the server's latency law, the clients, the fault, the sidecar.

A scenario is a YAML file (the shipped ones live in ``scenarios/`` and are named without ``.yaml``). Every
key has a default, unknown keys are errors, and errors name the key's path, as in the sidecar's config.
Durations take units (``100ms``, ``2s``, ``5m``), as in the sidecar's config.
"""

from __future__ import annotations

import copy
import math
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..config.presets import deep_merge
from ..config.units import Duration, OptionalDuration

STRATEGIES = ("fixed", "backoff", "sidecar", "sidecar+tickets")
#: The strategies whose clients go through the sidecar (``sidecar+tickets``: with ``sidecar.tickets``).
SIDECAR_STRATEGIES = ("sidecar", "sidecar+tickets")
#: ``sidecar.tickets`` unless the scenario says otherwise: execution control probing around the seed server's
#: limit of 30, refusing what cannot have a ticket at once (``bench/recovery.py``'s block).
TICKETS = {"mode": "probing", "initial": 30, "min": 4, "max": 60, "max_queue": 0, "max_wait": "0s"}


class ScenarioError(Exception):
    """A scenario that cannot be used; ``errors`` are ``(path, message)`` pairs."""

    def __init__(self, errors: list[tuple[str, str]], source: str = "") -> None:
        self.errors = errors
        self.source = source
        head = f"{source}: " if source else ""
        lines = [f"{head}{len(errors)} error{'s' if len(errors) != 1 else ''} in the scenario"]
        lines += [f"  {p}: {m}" if p else f"  {m}" for p, m in errors]
        super().__init__("\n".join(lines))


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSpec(_Base):
    """The seed's model server. An answer is due once the request's age exceeds
    ``size * delay(in-flight)`` plus its own random ``0..jitter``, where
    ``delay(c) = min_delay`` for ``c <= concurrency_limit`` and ``min_delay * factor ** ((c - limit) / k)``
    above; the server checks which answers are due every ``tick``. Work is never cancelled: a request
    whose client gave up keeps its place until its answer is due (the seed's server does the same).
    ``workers``: a server with a real knee instead, that many workers each busy ``min_delay`` per request
    and a queue in front of them (``concurrency_limit``, ``factor`` and ``k`` then play no part)."""

    min_delay: Duration = 0.1
    concurrency_limit: int = Field(30, ge=1)
    factor: float = Field(1.05, ge=1.0)
    k: float = Field(15.0, gt=0)
    tick: Duration = 0.01
    jitter: Duration = 0.02
    error_rate: float = Field(0.0, ge=0.0, le=1.0)  # share of answers that are 503 (flaky)
    slow_fraction: float = Field(0.0, ge=0.0, le=1.0)  # share of requests that take slow_factor times longer
    slow_factor: float = Field(50.0, ge=1.0)
    replicas: int = Field(1, ge=1, le=64)
    backlog: int = Field(128, ge=1)  # connections a stopped server's kernel still queues (listen backlog)
    workers: int | None = Field(None, ge=1)  # a knee instead of the seed's law: see model.py

    @property
    def limit(self) -> int:
        """Requests one replica serves at once before it slows down: ``workers``, or ``concurrency_limit``."""
        return self.workers if self.workers is not None else self.concurrency_limit

    @model_validator(mode="after")
    def _tick(self) -> ServerSpec:
        if self.tick <= 0 or self.min_delay <= 0:
            raise ValueError("min_delay and tick must be positive")
        return self


class BackoffClientSpec(_Base):
    """The seed's pseudo-code: ``delay = min(delay * factor, max_delay); delay += normal(0, delay * jitter)``,
    starting from ``min_delay``."""

    min_delay: Duration = 0.1
    max_delay: Duration = 300.0
    factor: float = Field(2.718, ge=1.0)
    jitter: float = Field(0.1, ge=0.0)


class ClientsSpec(_Base):
    """``count`` clients, each waiting an exponentially distributed gap (mean ``count / rate``) before each
    request. ``fixed`` and ``backoff`` clients retry a failed or timed-out attempt themselves until it
    succeeds, as the seed's do, unless ``patience`` (time) or ``max_attempts`` runs out; ``sidecar``
    clients send once, through the sidecar."""

    count: int = Field(1000, ge=1)
    rate: float = Field(100.0, gt=0)  # requests per second offered by all clients together
    timeout: Duration = 2.0
    fixed_interval: Duration = 0.1
    backoff: BackoffClientSpec = BackoffClientSpec()
    patience: OptionalDuration = math.inf  # give a request up after this long (none: retry until success)
    max_attempts: int | None = Field(None, ge=1)  # ... or after this many attempts (none: no limit)


class OutageSpec(_Base):
    """``stop``: the server process is stopped (SIGSTOP) from ``start`` for ``duration`` seconds, then
    resumed; connections still queue in its kernel up to ``server.backlog``. ``error``: every request is
    answered 503 at once. ``brownout``: the server runs at ``capacity`` (its concurrency limit times
    ``capacity``, its minimal delay divided by it)."""

    start: Duration
    duration: Duration
    mode: Literal["stop", "error", "brownout"] = "stop"
    capacity: float = Field(0.5, gt=0, le=1)

    @property
    def end(self) -> float:
        return self.start + self.duration

    @model_validator(mode="after")
    def _positive(self) -> OutageSpec:
        if self.duration <= 0:
            raise ValueError("an outage needs a positive duration")
        return self


class SidecarSpec(_Base):
    """The policy the sidecar applies (policy keys as in the sidecar's config, ``extends`` allowed) and the
    upstream's keys. ``instances``: how many sidecars share the clients, each with its own retry budget
    (clients are dealt to them in turn; the live engine runs one). ``tickets``: the upstream's
    ``concurrency`` block of the ``sidecar+tickets`` strategy (the ``sidecar`` strategy runs without it,
    unless ``upstream`` has one of its own)."""

    policy: dict[str, Any] = {"extends": "http-default"}
    upstream: dict[str, Any] = {}
    tickets: dict[str, Any] = TICKETS
    instances: int = Field(1, ge=1)


class Scenario(_Base):
    name: str = "custom"
    description: str = ""
    duration: Duration = 120.0
    warmup: Duration = 5.0
    seed: int = 1
    server: ServerSpec = ServerSpec()
    clients: ClientsSpec = ClientsSpec()
    outage: OutageSpec | None = None
    sidecar: SidecarSpec = SidecarSpec()
    strategies: list[Literal["fixed", "backoff", "sidecar", "sidecar+tickets"]] = [
        "fixed",
        "backoff",
        "sidecar",
    ]

    @model_validator(mode="after")
    def _times(self) -> Scenario:
        if self.duration <= 0:
            raise ValueError("duration must be positive")
        if self.warmup >= self.duration:
            raise ValueError("warmup must end before the run does")
        if self.outage is not None and self.outage.start < self.warmup:
            raise ValueError("the outage must start after the warmup (the goodput before it is the baseline)")
        return self


# -- loading ------------------------------------------------------------------------------------------
def shipped() -> list[str]:
    """Names of the scenarios shipped in the package."""
    files = resources.files(__package__).joinpath("scenarios").iterdir()
    return sorted(f.name[: -len(".yaml")] for f in files if f.name.endswith(".yaml"))


def load(name_or_path: str, overrides: dict[str, Any] | None = None) -> Scenario:
    """A shipped scenario by name, or a YAML file by path; ``overrides`` (nested keys) applied on top."""
    tree, source = _read(name_or_path)
    if overrides:
        tree = deep_merge(tree, overrides)
    return from_dict(tree, source)


def from_dict(tree: Any, source: str = "") -> Scenario:
    if not isinstance(tree, dict):
        raise ScenarioError([("", "the top level must be a mapping (name:, server:, clients:, ...)")], source)
    try:
        return Scenario.model_validate(tree)
    except ValidationError as e:
        raise ScenarioError(_errors(e), source) from None


def to_dict(s: Scenario) -> dict[str, Any]:
    """The scenario as plain data that :func:`from_dict` reads back: what the live engine hands its
    processes."""
    return s.model_dump(mode="json")


def _read(name_or_path: str) -> tuple[dict[str, Any], str]:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ScenarioError([("", f"cannot read {name_or_path!r}: {e.strerror or e}")]) from None
        source = str(p)
    else:
        res = resources.files(__package__).joinpath("scenarios").joinpath(f"{name_or_path}.yaml")
        if not res.is_file():
            known = ", ".join(shipped())
            raise ScenarioError(
                [("", f"no scenario named {name_or_path!r} (shipped: {known}; or a .yaml file)")]
            )
        text = res.read_text(encoding="utf-8")
        source = name_or_path
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ScenarioError(
            [("", f"not valid YAML: {where}{getattr(e, 'problem', None) or e}")], source
        ) from None
    return copy.deepcopy(tree) if tree is not None else {}, source


def _errors(e: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in e.errors(include_url=False):
        path = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind == "missing":
            msg = "required key is missing"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        out.append((path, msg))
    return out
