"""``sidecar demo``: the sidecar at work on built-in fault-injecting upstreams, one part per protocol.

A part is a module ``sidecar.demo.<name>`` with ``PART: DemoPart`` (see ``runner.py``). Parts run one after
another; each starts its upstreams and a sidecar in this process, drives real client load through it and
prints a table per second, then a summary.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import DemoPart

PARTS = ("http", "grpc", "mongodb")
_MODULES = {"http": "sidecar.demo.http", "grpc": "sidecar.demo.grpc", "mongodb": "sidecar.demo.mongo"}


def load_part(name: str) -> DemoPart:
    """The part's ``PART`` object (each part's module is imported only when it runs)."""
    return importlib.import_module(_MODULES[name]).PART
