"""``sidecar demo``: the sidecar at work on built-in fault-injecting upstreams, one part per protocol.

A part is a module ``sidecar.demo.<name>`` with ``PART: DemoPart`` (see ``runner.py``). Parts run one after
another; each starts its upstreams and a sidecar in this process, drives real client load through it and
prints a table per second, then a summary.
"""

from __future__ import annotations

import importlib
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import DemoPart

PARTS = ("http", "grpc", "mongodb")
_MODULES = {"http": "sidecar.demo.http", "grpc": "sidecar.demo.grpc", "mongodb": "sidecar.demo.mongo"}


class PartUnavailable(RuntimeError):
    """A part needs a library this installation leaves out (the image does: it holds what ``sidecar run``
    uses)."""


def load_part(name: str) -> DemoPart:
    """The part's ``PART`` object (each part's module is imported only when it runs)."""
    try:
        return importlib.import_module(_MODULES[name]).PART
    except ModuleNotFoundError as e:
        if e.name != "aiohttp":
            raise
        raise PartUnavailable(
            f"the {name} part needs aiohttp (its upstream and clients), which this installation leaves out: "
            "pip install 'retry-sidecar[demo]', run it from a checkout (make demo), or choose other parts "
            "(--only grpc --only mongodb)"
        ) from None


def console_address(preferred: int = 9901) -> str:
    """Where the demo's sidecars serve their admin port, one part after another: ``127.0.0.1:9901`` (the
    sidecar's own default) when it is free, else a free port."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return f"127.0.0.1:{s.getsockname()[1]}"
    raise OSError("no free port on 127.0.0.1")
