"""gRPC metadata rules of the proxy (pure): what passes each way, what the sidecar adds, what it reads.

Metadata is a sequence of ``(key, value)`` pairs; keys are lower case; ``-bin`` keys carry ``bytes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ...policy import PUSHBACK_STOP, Pushback

Metadata = Sequence[tuple[str, str | bytes]]

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"
PUSHBACK = "grpc-retry-pushback-ms"

#: Connection-level (hop-by-hop) headers and the ones gRPC itself owns on the wire: never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "te",
        "host",
        "content-type",
        "content-length",
        "user-agent",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "grpc-status",
        "grpc-message",
    }
)
#: Keys the sidecar sets itself on each attempt (the client's values are replaced).
OWN_REQUEST_KEYS = frozenset({PREVIOUS_ATTEMPTS, "traceparent", "tracestate"})


def _forwardable(key: str) -> bool:
    return not key.startswith(":") and key not in HOP_BY_HOP


def request_metadata(
    incoming: Iterable[tuple[str, str | bytes]], deadline_header: str
) -> list[tuple[str, str | bytes]]:
    """The client's metadata minus hop-by-hop keys, the sidecar's own keys and the deadline header (which
    each attempt sets again with what remains)."""
    dl = deadline_header.lower()
    return [(k, v) for k, v in incoming if _forwardable(k) and k not in OWN_REQUEST_KEYS and k != dl]


def attempt_metadata(
    base: list[tuple[str, str | bytes]],
    previous_attempts: int,
    trace: Mapping[str, str],
    deadline_header: str | None = None,
    timeout_ms: int | None = None,
) -> tuple[tuple[str, str | bytes], ...]:
    """One attempt's metadata: the client's, its trace context, ``grpc-previous-rpc-attempts`` (from the
    second attempt on) and, when the client sent the deadline header, its value renewed to what remains."""
    md = list(base)
    if trace:
        md.extend(trace.items())
    if previous_attempts > 0:
        md.append((PREVIOUS_ATTEMPTS, str(previous_attempts)))
    if deadline_header is not None and timeout_ms is not None:
        md.append((deadline_header.lower(), str(timeout_ms)))
    return tuple(md)


def response_metadata(upstream: Iterable[tuple[str, str | bytes]]) -> list[tuple[str, str | bytes]]:
    """An upstream's initial or trailing metadata as it may go to the client."""
    return [(k, v) for k, v in upstream if _forwardable(k) and k != PREVIOUS_ATTEMPTS]


def with_previous_attempts(md: list[tuple[str, str | bytes]], previous: int) -> list[tuple[str, str | bytes]]:
    if previous > 0:
        md.append((PREVIOUS_ATTEMPTS, str(previous)))
    return md


def with_give_up_pushback(md: list[tuple[str, str | bytes]]) -> list[tuple[str, str | bytes]]:
    """Replace any pushback with ``-1``: a retrying client must not multiply the sidecar's attempts."""
    out = [(k, v) for k, v in md if k != PUSHBACK]
    out.append((PUSHBACK, "-1"))
    return out


def parse_pushback(trailing: Iterable[tuple[str, str | bytes]]) -> Pushback | None:
    """A6 server pushback from trailing metadata: one non-negative integer -> wait that many ms; a negative,
    unparseable or repeated value -> do not retry; absent -> ``None``."""
    values = [v for k, v in trailing if k == PUSHBACK]
    if not values:
        return None
    if len(values) > 1:
        return PUSHBACK_STOP
    v = values[0]
    text = v.decode("ascii", "replace") if isinstance(v, bytes) else v
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return PUSHBACK_STOP
    return Pushback(int(text) / 1000.0)


def first_value(md: Iterable[tuple[str, str | bytes]], key: str) -> str | None:
    key = key.lower()
    for k, v in md:
        if k == key:
            return v.decode("latin-1") if isinstance(v, bytes) else v
    return None
