"""Protocol adapters. Each reads and writes its wire format, classifies upstream results into the engine's
outcome classes, and carries out the engine's commands. Nothing protocol-specific lives outside them.

A listener class takes ``(ListenerConfig, Services)`` and offers ``start()``, ``stop(grace)``, ``address``,
``serving`` (accepting connections now: ``/readyz`` asks), and
``reconfigure(config, services)``: a reloaded config (same address and protocol) for the requests that begin
from now on.
"""

from __future__ import annotations

from typing import Protocol

from .. import parts
from ..config import ListenerConfig
from ..services import Services


class Listener(Protocol):
    name: str

    @property
    def address(self) -> tuple[str, int]: ...

    @property
    def serving(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...

    def reconfigure(self, config: ListenerConfig, services: Services) -> None: ...


def make_listener(config: ListenerConfig, services: Services) -> Listener:
    """The listener for ``config``'s protocol (each protocol's package is imported only when used: parts.py)."""
    return parts.load(f"listener.{config.protocol}")(config, services)
