"""What a running process imported, read from the interpreter's own record (``-X importtime``, or
``PYTHONPROFILEIMPORTTIME=1`` in its environment): every module, at start or later (a reload that turns a
feature on), as one ``import time:`` line on stderr. Tests of what a config loads and bench/footprint.py
read it; nothing is patched in the process looked at.
"""

from __future__ import annotations

import re

#: Packages that cost a pod several megabytes each, loaded only when a config uses what needs them (and
#: prometheus_client, whose package imports HTTP, WSGI and e-mail modules: never loaded by ``sidecar run``,
#: which writes /metrics itself, ``telemetry/exposition.py``).
HEAVY = (
    "aiohttp",
    "prometheus_client",
    "grpc",
    "google.protobuf",
    "pymongo",
    "bson",
    "redis",
    "dns",
    "opentelemetry",
    "opentelemetry.sdk",
    "opentelemetry.exporter",
)

_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)\s*$", re.M)


def imported(stderr: str) -> list[str]:
    """The modules imported, in order, from a process's stderr with import times on."""
    return [m.group(3) for m in _LINE.finditer(stderr)]


def import_seconds(stderr: str) -> float:
    """The time spent importing (the sum of each module's own time)."""
    return sum(int(m.group(1)) for m in _LINE.finditer(stderr)) / 1e6


def loads(modules: list[str], package: str) -> bool:
    """Was ``package`` (or a module inside it) imported?"""
    return any(m == package or m.startswith(package + ".") for m in modules)


def loaded_heavy(modules: list[str]) -> list[str]:
    """The packages of ``HEAVY`` among ``modules``."""
    return [p for p in HEAVY if loads(modules, p)]
