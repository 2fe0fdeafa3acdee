"""Turns the runtime's events into spans and metrics. It observes; it never steers.

``Telemetry.request(...)`` gives an adapter one :class:`RequestObserver` per incoming request: the runtime
reports attempts, decisions and the finish to it; the adapter adds protocol attributes and ends it once
the response is complete. One request span (kind SERVER), one child span per attempt (kind CLIENT), named
and attributed after the OpenTelemetry semantic conventions of the protocol; ``sidecar.*`` attributes carry
the engine's view (attempt, endpoint, outcome class, decision reason, backoff, hedge, deadline remaining).
While the console's tap is armed (``Telemetry.tap``), each observer also fills the request's ``TapRecord``
(``tap.py``); unarmed, that costs one ``None`` test per hook.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, Final

from .. import parts
from ..admission.refusal import Refusal
from ..config.schema import TelemetryConfig
from ..policy import CancelAttempt, Decision, Finish, Outcome, OutcomeClass, Reason, SendAttempt
from ..policy.reasons import GIVE_UPS
from ..runtime import CallObserver
from .metrics import Meters, Metrics
from .tap import Tap, TapRecord

_EMPTY: Final[Mapping[str, str]] = {}
# Enum members as Final aliases, every one the code reads (the convention: sidecar/native.py).
_THROTTLED: Final = Reason.THROTTLED
_RETRY: Final = Reason.RETRY
_TRANSPARENT_RETRY: Final = Reason.TRANSPARENT_RETRY
_DEADLINE: Final = Reason.DEADLINE
_PER_TRY_TIMEOUT: Final = Reason.PER_TRY_TIMEOUT
_BUFFER_EXCEEDED: Final = Reason.BUFFER_EXCEEDED
_SUCCESS: Final = OutcomeClass.SUCCESS
_TIMEOUT: Final = OutcomeClass.TIMEOUT
_perf_counter: Final = time.perf_counter


class Telemetry:
    def __init__(
        self,
        cfg: TelemetryConfig | None = None,
        *,
        metrics: Metrics | None = None,
        span_exporter: Any = None,
    ) -> None:
        """``span_exporter``: an OpenTelemetry ``SpanExporter`` receiving every span (tests), traces or not
        in ``cfg``."""
        self.cfg = cfg or TelemetryConfig()
        self.metrics = metrics or Metrics()
        #: ``tracing.Tracer`` when traces are on (its module, and OpenTelemetry, imported only then), else None.
        self.tracer: Any = None
        if span_exporter is not None or parts.traced(self.cfg):
            self.tracer = parts.load("tracing")(self.cfg, span_exporter)
        #: The console's tap while someone reads it (``None``: nobody does, and requests are not recorded).
        self.tap: Tap | None = None

    def request(
        self,
        *,
        listener: str,
        upstream: str,
        protocol: str,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        parent: Mapping[str, str] | None = None,
        attempt_name: str | None = None,
        meters: Meters | None = None,
    ) -> RequestObserver:
        """Start observing one request. ``name`` is the request span's name (``GET``, ``pkg.Svc/Method``,
        ``find orders``); ``parent`` the incoming headers/metadata carrying the caller's trace context;
        ``meters``: the (listener, upstream) pair's, when the caller keeps them at hand."""
        return RequestObserver(
            self, listener, upstream, protocol, name, attributes, parent, attempt_name, meters
        )

    def shutdown(self) -> None:
        if self.tracer is not None:
            self.tracer.shutdown()


class RequestObserver(CallObserver):
    __slots__ = (
        "t",
        "meters",
        "protocol",
        "span",
        "attempt_name",
        "attempt_attrs",
        "attempt_spans",
        "started",
        "last_delay",
        "ended",
        "reason",
        "listener",
        "tap",
    )

    def __init__(
        self,
        t: Telemetry,
        listener: str,
        upstream: str,
        protocol: str,
        name: str,
        attributes: Mapping[str, Any] | None,
        parent: Mapping[str, str] | None,
        attempt_name: str | None,
        meters: Meters | None = None,
    ) -> None:
        self.t = t
        self.listener = listener
        self.meters: Meters = meters if meters is not None else t.metrics.meters(listener, upstream)
        self.meters.listener.inflight += 1
        self.protocol = protocol
        self.started = _perf_counter()
        self.last_delay = 0.0
        self.ended = False
        self.reason: Reason | None = None
        self.attempt_spans: dict[int, Any] | None = None  # only a traced request keeps attempt spans
        self.attempt_attrs: Mapping[str, Any] = attributes or _EMPTY
        self.attempt_name = attempt_name or name
        tap = t.tap
        self.tap: TapRecord | None = (
            None if tap is None else tap.record(listener, upstream, protocol, name, attributes, self.started)
        )
        self.span = None
        if t.tracer is not None:
            self.attempt_spans = {}
            attrs = dict(self.attempt_attrs)
            attrs["sidecar.listener"] = listener
            attrs["sidecar.upstream"] = upstream
            self.span = t.tracer.request_span(name, parent, attrs)

    # -- what adapters call ---------------------------------------------------------------------------
    def set_attribute(self, key: str, value: Any) -> None:
        if self.span is not None:
            self.span.set_attribute(key, value)
        rec = self.tap
        if rec is not None and (key == "http.response.status_code" or key == "rpc.grpc.status_code"):
            rec.status_answered(str(value))

    def set_attempt_attribute(self, attempt: int, key: str, value: Any) -> None:
        if not self.attempt_spans:
            return
        span = self.attempt_spans.get(attempt)
        if span is not None:
            span.set_attribute(key, value)

    def deadline_received(self, timeout_s: float) -> None:
        self.meters.listener.deadline_received += 1
        rec = self.tap
        if rec is not None:
            rec.deadline_received(timeout_s)
        if self.span is not None:
            self.span.set_attribute("deadline_received_ms", int(timeout_s * 1000))

    def buffer_exceeded(self) -> None:
        self.meters.buffer_exceeded += 1
        if self.span is not None:
            self.span.set_attribute("sidecar.buffer_exceeded", True)
            self.span.set_attribute("sidecar.decision.reason", _BUFFER_EXCEEDED.value)

    def refused(self, refusal: Refusal) -> None:
        """Admission refused the request (the adapter answers it, then calls :meth:`end` with the error):
        its span carries the limiter, the reason and when to come back."""
        rec = self.tap
        if rec is not None:
            rec.refused(f"admission-{refusal.limiter.value}")
        span = self.span
        if span is not None:
            for key, value in refusal.attributes().items():
                span.set_attribute(key, value)
            span.set_attribute("sidecar.decision.reason", f"admission-{refusal.limiter.value}")

    def end(self, error: str | None = None) -> None:
        """The response is complete (or broke off with ``error``). Idempotent."""
        if self.ended:
            return
        self.ended = True
        self.meters.listener.inflight -= 1
        took = _perf_counter() - self.started
        self.meters.duration.observe(took)
        rec = self.tap
        if rec is not None:
            rec.end(took, error)
        if self.span is not None:
            if self.attempt_spans:
                for span in self.attempt_spans.values():
                    span.end()
                self.attempt_spans.clear()
            if error is not None:
                self.t.tracer.fail(self.span, error)
            self.span.end()

    def __enter__(self) -> RequestObserver:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        self.end(None if exc is None else f"{type(exc).__name__}: {exc}")

    # -- what the runtime calls (sidecar.runtime.CallObserver) ---------------------------------------
    def describe(self) -> str:
        trace = ""
        if self.span is not None:
            trace = f", trace {self.span.get_span_context().trace_id:032x}"
        return f"{self.protocol} request {self.attempt_name!r} on listener {self.listener!r}{trace}"

    def attempt_started(self, cmd: SendAttempt) -> Mapping[str, str]:
        if cmd.hedge:
            self.meters.hedges += 1
        rec = self.tap
        if rec is not None:
            rec.attempt_started(cmd)
        tracer = self.t.tracer
        spans = self.attempt_spans
        if tracer is None or self.span is None or spans is None:
            return _EMPTY
        attrs = dict(self.attempt_attrs)
        attrs["sidecar.attempt"] = cmd.attempt
        attrs["sidecar.endpoint"] = cmd.endpoint
        host, _, port = cmd.endpoint.rpartition(":")
        attrs["server.address"] = host.strip("[]")
        if port.isdigit():
            attrs["server.port"] = int(port)
        if cmd.hedge:
            attrs["sidecar.hedge"] = cmd.hedge
        if math.isfinite(cmd.timeout):
            attrs["sidecar.deadline_remaining_ms"] = int(cmd.timeout * 1000)
        if self.last_delay:
            attrs["sidecar.backoff_waited_ms"] = round(self.last_delay * 1000, 3)
        if self.protocol == "http" and cmd.attempt > 1:
            attrs["http.request.resend_count"] = cmd.attempt - 1
        span, carrier = tracer.attempt_span(self.span, self.attempt_name, attrs)
        spans[cmd.attempt] = span
        return carrier

    def attempt_ended(self, attempt: int, outcome: Outcome) -> None:
        self.meters.attempt(outcome.cls)
        rec = self.tap
        if rec is not None:
            rec.attempt_ended(attempt, outcome)
        span = self.attempt_spans.get(attempt) if self.attempt_spans else None
        if span is not None:
            span.set_attribute("sidecar.outcome", outcome.cls.value)
            if outcome.detail:
                span.set_attribute("sidecar.outcome.detail", outcome.detail)
            if outcome.pushback is not None:
                pb = outcome.pushback.delay
                span.set_attribute("sidecar.pushback_ms", -1 if pb is None else round(pb * 1000, 3))
            if outcome.cls is not _SUCCESS:
                self.t.tracer.fail(span, outcome.detail or outcome.cls.value)

    def attempt_cancelled(self, cmd: CancelAttempt) -> None:
        if cmd.reason is _DEADLINE:
            self.meters.cancelled_by_deadline += 1
        if cmd.reason is _PER_TRY_TIMEOUT:
            self.meters.attempt(_TIMEOUT)  # its Decision follows
        else:
            self.meters.attempt("cancelled")
        rec = self.tap
        if rec is not None:
            rec.attempt_cancelled(cmd)
        spans = self.attempt_spans
        span = spans.get(cmd.attempt) if spans else None
        if spans is None or span is None:
            return
        span.set_attribute("sidecar.cancelled", cmd.reason.value)
        if cmd.reason is _PER_TRY_TIMEOUT:
            span.set_attribute("sidecar.outcome", _TIMEOUT.value)
            self.t.tracer.fail(span, "per-try timeout")
        else:
            del spans[cmd.attempt]
            span.end()

    def decision(self, d: Decision) -> None:
        if d.reason is _RETRY or d.reason is _TRANSPARENT_RETRY:
            self.meters.retry(d.outcome)
        self.last_delay = d.delay
        rec = self.tap
        if rec is not None:
            rec.decision(d)
        if self.attempt_spans:
            span = self.attempt_spans.pop(d.attempt, None)
            if span is None:
                return
            span.set_attribute("sidecar.decision.reason", d.reason.value)
            if d.delay:
                span.set_attribute("sidecar.backoff_ms", round(d.delay * 1000, 3))
            span.end()

    def finished(self, f: Finish) -> None:
        reason = f.reason
        self.reason = reason
        m = self.meters
        m.request(reason)
        if reason in GIVE_UPS:
            m.give_up(reason)
        if reason is _THROTTLED:
            m.throttled += 1
        elif reason is _DEADLINE:
            m.deadline_expired += 1
        rec = self.tap
        if rec is not None:
            rec.finished(f)
        if self.span is not None:
            self.span.set_attribute("sidecar.attempts", f.attempts)
            self.span.set_attribute("sidecar.decision.reason", reason.value)
            if reason is _DEADLINE:
                self.span.set_attribute("cancelled_by_deadline", 1)
