"""Value types of the configuration: durations, byte sizes, host:port addresses."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

from ..upstream.target import split_host_port

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "KiB": 1024,
    "MB": 1000**2,
    "MiB": 1024**2,
    "GB": 1000**3,
    "GiB": 1024**3,
}
NONE_WORDS = ("none", "off", "never", "infinite", "inf")


def parse_duration(value: object) -> float:
    """``"250ms"``, ``"2s"``, ``"1.5m"``, ``"1h"`` -> seconds. Bare numbers are refused: units are required."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 250ms, 2s or 1m")
    if isinstance(value, int | float):
        if value == 0:
            return 0.0
        raise ValueError(f"a duration needs a unit: write {value}s or {value}ms, not {value}")
    if not isinstance(value, str):
        raise ValueError("expected a duration such as 250ms, 2s or 1m")
    m = _DURATION.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a duration: use a number with ms, s, m or h (250ms, 2s, 1m)")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def parse_optional_duration(value: object) -> float:
    """Like :func:`parse_duration`, and ``none``/``null`` mean "no limit" (``inf``)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS):
        return math.inf
    return parse_duration(value)


def format_duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "none"
    ms = seconds * 1000.0
    if abs(ms - round(ms)) < 1e-6:
        ms_int = int(round(ms))
        if ms_int % 60000 == 0 and ms_int:
            return f"{ms_int // 60000}m"
        if ms_int % 1000 == 0 and ms_int:
            return f"{ms_int // 1000}s"
        return f"{ms_int}ms"
    return f"{ms:g}ms"


def parse_size(value: object) -> int:
    """``1048576``, ``"1MiB"``, ``"256KiB"`` -> bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 1MiB or 256KiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if not isinstance(value, str):
        raise ValueError("expected a size such as 1MiB or 256KiB")
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a size: use bytes or a unit (64KiB, 1MiB, 1MB)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def format_size(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def parse_host_port(value: object) -> str:
    """``"127.0.0.1:8080"``, ``"orders:80"``, ``"[::1]:9000"``; port 0 is allowed (pick a free port)."""
    if not isinstance(value, str):
        raise ValueError("expected host:port")
    if "@" in value:  # not quoted: it may hold a credential
        raise ValueError("an endpoint is host:port, without user@ (credentials go in the upstream's auth)")
    host, _ = split_host_port(value)
    if not host:
        raise ValueError(f"{value!r} has no host: expected host:port")
    return value.strip()


Duration = Annotated[
    float, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)
]
OptionalDuration = Annotated[
    float, BeforeValidator(parse_optional_duration), PlainSerializer(format_duration, return_type=str)
]
Size = Annotated[int, BeforeValidator(parse_size), PlainSerializer(format_size, return_type=str)]
HostPort = Annotated[str, BeforeValidator(parse_host_port)]
