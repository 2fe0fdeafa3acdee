"""The composition root: build shared services from a validated config, start listeners and the admin port,
reload the config on SIGHUP or when its file changes (``reload.py``), drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import log_redaction, native, parts
from .adapters import Listener, make_listener
from .admin import AdminServer
from .admin.console import Console
from .config import Config, ConfigError, effective, load_file
from .config.effective import redactor
from .reload import ConfigWatcher, ReloadLog, restart_reasons
from .services import Services
from .telemetry import Telemetry
from .upstream.target import join_host_port, split_host_port

if TYPE_CHECKING:
    from .fleet.link import FleetLink

log = logging.getLogger("sidecar")


class App:
    """The sidecar. ``async with App(config) as app:`` starts it; ``app.address(name)`` tells where a
    listener is bound (useful with port 0)."""

    def __init__(
        self,
        config: Config,
        *,
        rand: Callable[[], float] | None = None,
        span_exporter: Any = None,
        config_path: Path | None = None,
    ) -> None:
        """``config_path``: where ``config`` was read from; ``reload()`` reads it again. ``span_exporter``: an
        OpenTelemetry ``SpanExporter`` that receives every span (tests)."""
        self.config = config
        self.config_path = config_path
        self.telemetry = Telemetry(config.telemetry, span_exporter=span_exporter)
        self.services = Services(config, self.telemetry, rand or random.Random().random)
        self.reload_log = ReloadLog(time.time())
        self._reload_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()  # removed listeners finishing their requests
        self.listeners: list[Listener] = [make_listener(lc, self.services) for lc in config.listeners]
        fleet_link = parts.load_if_used("fleet", config)
        self.fleet: FleetLink | None = None if fleet_link is None else fleet_link(config, self.services)
        self.ready = False
        self.admin: AdminServer | None = None
        self.console: Console | None = None  # the page at / on the admin port, its JSON and the tap
        if config.admin.listen is not None:
            self.admin = AdminServer(
                config.admin.listen,
                registry=self.telemetry.metrics.registry,
                ready=self.is_ready,
                effective_config=effective(config),
                live=self.live,
            )
            self.console = Console(self)
            self.console.install(self.admin)

    def is_ready(self) -> bool:
        """Started, not draining, every listener accepting (a gRPC one being rebuilt is not), and every
        upstream's names resolved once (successfully or not)."""
        return self.ready and all(lst.serving for lst in self.listeners) and self.services.resolved

    def live(self) -> dict[str, object]:
        """What ``/config`` shows beside the config: each upstream's names and addresses as resolved now
        (a name that came from ``${VAR}`` hidden as in the config itself)."""
        return {"discovery": redactor(self.config).tree(self.services.discovery_view())}

    def address(self, listener: str) -> tuple[str, int]:
        for lst in self.listeners:
            if lst.name == listener:
                return lst.address
        raise KeyError(f"no listener named {listener!r}")

    async def reload(self) -> bool:
        """Read the config file again and make it live (``update``). True when the new config is live."""
        assert self.config_path is not None, "reload() needs the App built with config_path"
        async with self._reload_lock:
            try:
                new = load_file(self.config_path)
            except ConfigError as e:
                for path, msg in e.errors:
                    log.error("config reload rejected: %s: %s", path or "(file)", msg)
                self._reloaded("rejected", [f"{path or '(file)'}: {msg}" for path, msg in e.errors])
                return False
            return await self.update(new)

    async def update(self, new: Config) -> bool:
        """``apply``, with listeners added and removed. A new listener's protocol is loaded (grpcio for the
        first gRPC listener) and its address tried before anything changes, so a config whose listener cannot
        load or bind is refused whole; then it is started, and the config switched. A removed listener is out
        of the sidecar at the switch, stops accepting and finishes what it holds (up to ``shutdown.grace``)."""
        if new != self.config and not restart_reasons(self.config, new):
            # names the new config adds are resolved first: their upstreams do not start out empty
            await self.services.discovery.prepare(new)
        names = {lc.name for lc in new.listeners}
        current = {lst.name for lst in self.listeners}
        if names == current:
            return self.apply(new)
        adding = [lc for lc in new.listeners if lc.name not in current]
        if self._verdict(new) != "go":
            return False
        for lc in adding:
            try:
                parts.load(f"listener.{lc.protocol}")
                await can_listen(lc.listen)
            except Exception as e:  # its protocol cannot load, or its address is taken: nothing changes
                return self._refused(f"listeners.{lc.name}: cannot start: {e}")
        services = Services(new, self.telemetry, self.services.rand, previous=self.services)
        added: list[Listener] = []
        for lc in adding:
            try:
                lst = make_listener(lc, services)
                await lst.start()
            except Exception as e:  # taken since it was tried: the live config is made again, unchanged
                await asyncio.gather(*(a.stop(0) for a in added), return_exceptions=True)
                self._restore(services)
                return self._refused(f"listeners.{lc.name}: cannot start: {e}")
            added.append(lst)
            log.info("listener %s ready on %s:%d", lst.name, *lst.address)
        removed = [lst for lst in self.listeners if lst.name not in names]
        self._switch(new, services, [*(lst for lst in self.listeners if lst.name in names), *added])
        for lst in removed:
            log.info("listener %s removed: draining for up to %.1fs", lst.name, new.shutdown.grace)
            task = asyncio.get_running_loop().create_task(
                lst.stop(new.shutdown.grace), name=f"retire {lst.name}"
            )
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return True

    def _refused(self, reason: str) -> bool:
        log.error("config reload rejected: %s", reason)
        self._reloaded("rejected", [reason])
        return False

    def _restore(self, touched: Services) -> None:
        """Building services for a config hands them the state they share with the live ones (doors, budgets,
        names followed); when that config is then refused, the live config is built again the same way."""
        services = Services(self.config, self.telemetry, self.services.rand, previous=touched)
        by_name = {lc.name: lc for lc in self.config.listeners}
        for lst in self.listeners:
            lst.reconfigure(by_name[lst.name], services)
        self.services = services

    def apply(self, new: Config) -> bool:
        """Make ``new`` the live config, at once for every listener: requests that start from now on use it,
        those in progress finish under the one they started with. Refused (False, logged, the old config
        stays) when it changes what only a restart can (a listener's address or protocol, ...), or adds or
        removes a listener (that takes starting or stopping one: ``update``)."""
        changed = sorted({lc.name for lc in new.listeners} ^ {lst.name for lst in self.listeners})
        if changed:
            reason = f"listeners {', '.join(changed)} added or removed: App.update does that"
            log.error("config not applied: %s", reason)
            self._reloaded("rejected", [reason])
            return False
        verdict = self._verdict(new)
        if verdict != "go":
            return verdict == "unchanged"
        self._switch(
            new, Services(new, self.telemetry, self.services.rand, previous=self.services), self.listeners
        )
        return True

    def _verdict(self, new: Config) -> str:
        """``go``: ``new`` may replace the live config; ``unchanged`` or ``rejected`` (counted and logged)."""
        if new == self.config:
            log.info("config reload: no change")
            self._reloaded("unchanged")
            return "unchanged"
        reasons = restart_reasons(self.config, new)
        if reasons:
            for reason in reasons:
                log.error("config reload rejected: %s", reason)
            self._reloaded("rejected", reasons)
            return "rejected"
        log_redaction.learn(redactor(new))  # before anything under the new config can log
        return "go"

    def _switch(self, new: Config, services: Services, listeners: list[Listener]) -> None:
        by_name = {lc.name: lc for lc in new.listeners}
        # No await from here to the end: no request can begin between two listeners' swaps.
        for lst in listeners:
            lst.reconfigure(by_name[lst.name], services)
        self.listeners = listeners
        self.services = services
        self.config = new
        if self.admin is not None:
            self.admin.show(effective(new))
        if self.console is not None:
            self.console.reconfigure(new)
        self._reloaded("applied")
        log.info("config reloaded from %s", self.config_path)

    def _reloaded(self, result: str, messages: Sequence[str] = ()) -> None:
        self.telemetry.metrics.reloaded(result)
        self.reload_log.record(time.time(), result, messages)

    async def start(self) -> None:
        """The admin port first (``/readyz`` answers 503 meanwhile), the listeners, then every upstream's names
        resolved once: ready then, whatever the answers (an upstream whose name does not resolve yet gets the
        no-endpoint answer at once, and its name is tried again on its schedule)."""
        try:
            if self.admin is not None:
                await self.admin.start()
            if self.console is not None:
                self.console.start()
            for lst in self.listeners:
                await lst.start()
                log.info("listener %s ready on %s", lst.name, join_host_port(*lst.address))
            if self.fleet is not None:
                await self.fleet.start()
            await self.services.discovery.start()
        except BaseException:
            await self.stop(0)
            raise
        self.ready = True

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let requests in progress finish for up to ``grace`` seconds, then close."""
        self.ready = False
        g = self.config.shutdown.grace if grace is None else grace
        await asyncio.gather(*(lst.stop(g) for lst in self.listeners), return_exceptions=True)
        if self._retiring:  # listeners a reload removed, still draining: as long as the others, no longer
            _, late = await asyncio.wait(self._retiring, timeout=g)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self.fleet is not None:
            await self.fleet.stop()
        if self.console is not None:
            self.console.stop()  # ends long polls of the tap, which the admin server would wait for
        await self.services.discovery.stop()
        if self.admin is not None:
            await self.admin.stop()
        self.telemetry.shutdown()

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(0)


async def can_listen(listen: str) -> None:
    """Raises ``OSError`` when ``listen`` (``host:port``) cannot be bound now (taken, or not an address of
    this host); port 0 always can. The socket is let go at once: the listener binds its own."""
    host, port = split_host_port(listen)
    if port == 0:
        return
    infos = await asyncio.get_running_loop().getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as the listeners bind
            s.bind(address)


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``): the imports and the
    config's validation leave about a megabyte freed but still held by the allocator, and a pod pays for what
    the process holds (issue 27). Nothing where the C library has no such call (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


async def serve(config: Config, config_path: Path | None = None, watch_interval: float = 1.0) -> None:
    """Run until SIGTERM or SIGINT, then drain. With ``config_path``, SIGHUP and a change of that file
    (checked every ``watch_interval`` seconds; 0: not watched) reload the config."""
    app = App(config, config_path=config_path)
    await app.start()
    log.info("hot path %s", "compiled with mypyc" if native.compiled() else "running as pure Python (slower)")
    log.info("parts loaded for this config: %s", parts.describe(config))
    # Everything built so far lives as long as the process: keep the cyclic GC from scanning it again and
    # again (its thresholds stay: rarer, larger collections showed in the p99 at 1,000 requests/s).
    gc.collect()
    gc.freeze()
    release_free_memory()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher: ConfigWatcher | None = None
    if config_path is not None:
        watcher = ConfigWatcher(config_path, app.reload, watch_interval)

        async def on_sighup() -> None:
            assert watcher is not None
            watcher.seen()
            await app.reload()

        pending: set[asyncio.Task[None]] = set()

        def sighup() -> None:
            task = loop.create_task(on_sighup())
            pending.add(task)
            task.add_done_callback(pending.discard)

        loop.add_signal_handler(signal.SIGHUP, sighup)
        if watch_interval > 0:
            watcher.start()
    if app.admin is not None:
        log.info(
            "admin on http://%s (the console at /, healthz, readyz, metrics, config)",
            join_host_port(*app.admin.address),
        )
    await stop.wait()
    if watcher is not None:
        # Draining: a reload now would reconfigure stopping listeners (and SIGHUP's default would kill us).
        loop.add_signal_handler(signal.SIGHUP, log.warning, "SIGHUP ignored: shutting down")
        await watcher.stop()
    log.info("shutting down: draining for up to %.1fs", app.config.shutdown.grace)
    await app.stop()
