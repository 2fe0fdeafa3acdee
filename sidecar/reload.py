"""Live configuration reload: what a new config may change, and when to read it again.

``SIGHUP`` or a change of the config file (Kubernetes updates a mounted ConfigMap by swapping its ``..data``
symlink: the file's resolved path and inode change) re-reads and re-validates it. A valid config that needs no
restart replaces policies, upstreams and their endpoints, and routes in one step (``App.apply``), and adds or
removes listeners (``App.update``: a new one is started before the switch, a removed one drains after it):
requests in progress finish under the config they started with. Anything else is refused and the old config
keeps serving: every validation error is logged with its key path, and a change that needs a restart says
which.

Decide (``restart_reasons``, pure) apart from do (``App.update``, ``App.apply``) apart from when
(``ConfigWatcher``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from .config import Config

log = logging.getLogger("sidecar.reload")

#: What a running listener cannot change without a restart, by protocol (its socket, or its server's options).
_FIXED_LISTENER_KEYS = {
    "http": ("listen", "protocol"),
    "grpc": ("listen", "protocol", "max_message_size", "idle_timeout", "max_connections"),
    "mongodb": ("listen", "protocol", "max_message_size"),
}


def restart_reasons(old: Config, new: Config) -> list[str]:
    """Why ``new`` cannot replace ``old`` in a running sidecar (empty: it can), each naming its key."""
    reasons: list[str] = []
    olds = {lc.name: lc for lc in old.listeners}
    news = {lc.name: lc for lc in new.listeners}
    # Listeners may come and go (App.update starts and drains them), except one whose request rate the
    # fleet's settle task leases: it leases for the listeners it started with.
    for name in sorted(olds.keys() ^ news.keys()):
        config, lc = (new, news[name]) if name in news else (old, olds[name])
        profile = _profile(config, lc.admission)
        if profile is not None and profile.requests is not None and profile.requests.scope == "fleet":
            verb = "adding" if name in news else "removing"
            reasons.append(
                f"listeners.{name}.admission: its request rate is leased fleet-wide; {verb} this listener"
                " needs a restart"
            )
    for name in sorted(olds.keys() & news.keys()):
        o, n = olds[name], news[name]
        for key in _FIXED_LISTENER_KEYS[o.protocol]:
            if getattr(o, key) != getattr(n, key, None):
                reasons.append(
                    f"listeners.{name}.{key}: changed from {getattr(o, key)!r} to {getattr(n, key, None)!r};"
                    " this needs a restart"
                )
        # A MongoDB listener's topology monitors the members it was started with; its policy may still change.
        if (
            o.protocol == "mongodb"
            and n.protocol == "mongodb"
            and (o.upstream != n.upstream or old.upstreams[o.upstream] != new.upstreams[n.upstream])
        ):
            reasons.append(
                f"upstreams.{n.upstream}: the MongoDB listener {name!r} monitors this replica set's members;"
                " changing its upstream needs a restart"
            )
    # The fleet's settle task leases for the budgets it was started with (sidecar/fleet/link.py).
    if old.fleet != new.fleet:
        reasons.append("fleet: changing the fleet block needs a restart")
    for name in sorted(old.upstreams.keys() | new.upstreams.keys()):
        o_up, n_up = old.upstreams.get(name), new.upstreams.get(name)
        fleet_scoped = any(
            u is not None and u.retry_budget is not None and u.retry_budget.scope == "fleet"
            for u in (o_up, n_up)
        )
        if fleet_scoped and o_up != n_up:
            reasons.append(
                f"upstreams.{name}: its retry_budget is leased fleet-wide; changing this upstream needs a restart"
            )
    # A fleet-wide request rate is leased by the settle task for the listener and profile it started with.
    for name in sorted(olds.keys() & news.keys()):
        o_prof, n_prof = _profile(old, olds[name].admission), _profile(new, news[name].admission)
        fleet_scoped = any(
            p is not None and p.requests is not None and p.requests.scope == "fleet" for p in (o_prof, n_prof)
        )
        if fleet_scoped and (olds[name].admission != news[name].admission or o_prof != n_prof):
            reasons.append(
                f"listeners.{name}.admission: its request rate is leased fleet-wide; changing it needs a restart"
            )
    if old.admin.listen != new.admin.listen:
        reasons.append("admin.listen: changing the admin port needs a restart")
    if old.telemetry != new.telemetry:
        reasons.append("telemetry: changing the trace exporter needs a restart")
    return reasons


class ReloadLog:
    """The config's history as the console shows it: the ``generation`` live (1 at start, one more for each
    reload applied), when it was loaded (wall clock), and the last reload's result (``applied``,
    ``unchanged``, ``rejected``) with its messages (the first :data:`MESSAGES`; path-named, secrets already
    hidden as in the log)."""

    MESSAGES = 20

    def __init__(self, now: float) -> None:
        self.generation = 1
        self.loaded_at = now
        self.last: tuple[float, str, tuple[str, ...]] | None = None

    def record(self, now: float, result: str, messages: Sequence[str] = ()) -> None:
        if result == "applied":
            self.generation += 1
            self.loaded_at = now
        self.last = (now, result, tuple(messages[: self.MESSAGES]))


def _profile(config: Config, name: str | None) -> Any:
    return config.admission.get(name) if name is not None else None


FileState = tuple[str, int, int, int, int] | None


def file_state(path: Path) -> FileState:
    """What changes when the file does: its resolved path (a ConfigMap's symlink swap), inode, size, mtime."""
    try:
        st = os.stat(path)
        return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return None  # gone for a moment (an editor's rename, a swap in progress): wait for it to come back


class ConfigWatcher:
    """Polls the config file every ``interval`` seconds and calls ``on_change`` when it changed (no inotify:
    a ConfigMap volume's swap is a rename of a symlink in the directory, which polling the resolved path sees
    the same way everywhere)."""

    def __init__(self, path: Path, on_change: Callable[[], Awaitable[object]], interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self._on_change = on_change
        self._last = file_state(path)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="config-watcher")

    def seen(self) -> None:
        """The file as it is now has been read (by a SIGHUP reload): no need to read it again."""
        self._last = file_state(self.path)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            state = file_state(self.path)
            if state is not None and state != self._last:
                self._last = state
                log.info("config file %s changed", self.path)
                try:
                    await self._on_change()
                except Exception:  # a reload that failed in an unforeseen way must not end the watching
                    log.exception("config reload failed")
