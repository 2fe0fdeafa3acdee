"""``sidecar demo``: the sidecar at work on built-in fault-injecting upstreams, one part per protocol.

A part is a module ``sidecar.demo.<name>`` with ``PART: DemoPart`` (see ``runner.py``). Parts run one after
another; each starts its upstreams and a sidecar in this process, drives real client load through it and
prints a table per second, then a summary.
"""

from __future__ import annotations

import importlib

PARTS = ("http", "grpc", "mongodb")
_MODULES = {"http": "sidecar.demo.http", "grpc": "sidecar.demo.grpc", "mongodb": "sidecar.demo.mongo"}


def load_part(name: str):  # noqa: ANN201
    """The part's ``PART`` object, or ``None`` when this build has no such part."""
    try:
        module = importlib.import_module(_MODULES[name])
    except ModuleNotFoundError as e:
        if e.name == _MODULES[name]:
            return None
        raise
    return module.PART
