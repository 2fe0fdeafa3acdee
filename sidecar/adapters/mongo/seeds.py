"""A ``mongodb+srv://`` upstream's members, from DNS, through the sidecar's own resolver and ``resolver:``
settings (``upstream/resolver.py``), as the drivers' specs say:

* **Initial DNS Seedlist Discovery**: the SRV record ``_<srvServiceName>._tcp.<name>`` lists the members
  (each ``target:port`` must end with the name's parent domain, or the name itself when it has fewer than
  three labels: others are dropped, with a log line); the TXT record at ``<name>`` may give ``authSource``,
  ``replicaSet`` and ``loadBalanced`` (the URI's own options win); ``srvMaxHosts`` picks that many at random.
* **Polling SRV Records for mongos Discovery**: for routers (no replica set, whose members monitoring
  follows), the SRV record is read again at its TTL, no more often than every second and at least every
  60 s (:func:`rescan_after`); a failed lookup or an empty answer keeps the members as they are; routers
  added are monitored, routers removed are drained (``Topology.reseed``).

The members' names are resolved to addresses through the same resolver when a connection is made
(:meth:`SrvSeeds.address`), so that what DNS said is what the sidecar uses; TLS still checks the name.
The pure rules (:func:`rescan_after`, :func:`in_domain`, :func:`choose`) take their inputs as arguments.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from ...config.mongo_uri import MongoUri, txt_options
from ...upstream.poller import Poller
from ...upstream.resolution import OK
from ...upstream.resolver import Resolver

log = logging.getLogger("sidecar.mongo.seeds")

MIN_RESCAN = 1.0
MAX_RESCAN = 60.0


def rescan_after(ttl: float | None) -> float:
    """The wait before the SRV record is read again: its TTL, within [1 s, 60 s]."""
    if ttl is None:
        return MAX_RESCAN
    return min(MAX_RESCAN, max(MIN_RESCAN, ttl))


def in_domain(name: str, host: str) -> bool:
    """May an SRV answer for ``name`` list ``host``? It must end with ``name``'s parent domain (with
    ``name`` itself when ``name`` has fewer than three labels), and not be ``name``."""
    name, host = name.lower().rstrip("."), host.lower().rstrip(".")
    labels = name.split(".")
    domain = ".".join(labels[1:]) if len(labels) >= 3 else name
    return host != name and host.endswith("." + domain)


def choose(
    current: Sequence[str], found: Sequence[str], max_hosts: int, rand: Callable[[], float]
) -> list[str]:
    """The members to use from ``found``: all, or with ``max_hosts`` at most that many, keeping those in
    ``current`` that are still found and filling up at random (the spec's srvMaxHosts)."""
    if max_hosts <= 0 or len(found) <= max_hosts:
        return list(found)
    kept = [h for h in current if h in found][:max_hosts]
    rest = [h for h in found if h not in kept]
    rng = random.Random(rand())
    rng.shuffle(rest)
    return kept + rest[: max_hosts - len(kept)]


class SrvSeeds:
    """One ``mongodb+srv://`` upstream's seed list (see the module docstring)."""

    def __init__(
        self, upstream: str, uri: MongoUri, resolver: Callable[[], Resolver], rand: Callable[[], float]
    ) -> None:
        assert uri.srv is not None
        self.upstream = upstream
        self.uri = uri
        self.name = uri.srv
        self.record = f"_{uri.srv_service}._tcp.{uri.srv}"
        self._resolver = resolver  # the current one (a reload may change resolver:)
        self._rand = rand
        self.hosts: list[str] = []
        self._poller: Poller[tuple[str, list[str], float | None, str]] | None = None
        self._said = ""

    async def lookup(self) -> tuple[str, list[str], float | None, str]:
        """One reading of the SRV record: ``(result, members, ttl, detail)``."""
        result, records, ttl, detail = await self._resolver().srv(self.record)
        if result != OK:
            return result, [], ttl, detail
        found: list[str] = []
        for r in records:
            if in_domain(self.name, r.target):
                found.append(f"{r.target}:{r.port}")
            else:
                log.warning(
                    "upstream %s: %s lists %s, which is not in %s's domain: ignored (the spec's rule)",
                    self.upstream,
                    self.record,
                    r.target,
                    self.name,
                )
        if not found:
            return "empty", [], ttl, "no usable target"
        return OK, found, ttl, ""

    async def options(self) -> dict[str, Any]:
        """The TXT record's options (``authsource``, ``replicaset``), those the URI does not set itself.
        No record: none. More than one record, or an option not allowed there: ``ValueError``."""
        answer = await self._resolver().txt(self.name)
        if answer.result != OK:
            if answer.result == "error":
                raise ValueError(f"TXT {self.name}: {answer.detail}")
            return {}
        if len(answer.records) > 1:
            raise ValueError(f"TXT {self.name}: {len(answer.records)} records, the spec allows one")
        opts = txt_options(answer.records[0]) if answer.records else {}
        return {k: v for k, v in opts.items() if not self.uri.sets(k)}

    async def first(self) -> tuple[list[str], dict[str, Any], str]:
        """The members and TXT options at start: ``(members, options, problem)``; ``problem`` says why
        there are none (the sidecar starts anyway, and keeps looking)."""
        try:
            options = await self.options()
        except ValueError as e:
            return [], {}, str(e)
        result, found, _ttl, detail = await self.lookup()
        if result != OK:
            return [], options, f"SRV {self.record}: {detail or result}"
        self.hosts = choose([], found, self.uri.srv_max_hosts, self._rand)
        return list(self.hosts), options, ""

    def follow(self, reseed: Callable[[list[str]], None]) -> None:
        """Read the record again on its schedule; ``reseed(members)`` when they change."""

        def after(r: tuple[str, list[str], float | None, str]) -> float:
            return rescan_after(r[2]) if r[0] == OK else MIN_RESCAN * 5

        def result(r: tuple[str, list[str], float | None, str]) -> None:
            ok, found, _, detail = r
            if ok != OK:
                if detail != self._said:
                    self._said = detail
                    log.warning(
                        "upstream %s: reading %s again failed (%s): its members are kept",
                        self.upstream,
                        self.record,
                        detail or ok,
                    )
                return
            self._said = ""
            hosts = choose(self.hosts, found, self.uri.srv_max_hosts, self._rand)
            if sorted(hosts) != sorted(self.hosts):
                log.info("upstream %s: %s now lists %s", self.upstream, self.record, ", ".join(hosts))
                self.hosts = hosts
                reseed(list(hosts))

        self._poller = Poller(f"polling {self.record}", self.lookup, after, result, retry=MIN_RESCAN)
        self._poller.start()

    async def address(self, host: str, port: int) -> str:
        """A member's address to connect to, through the sidecar's resolver (its name when /etc/hosts
        lists it, or when nothing answers: the operating system then tries)."""
        for part in await self._resolver().addresses(host, port, "auto", absolute=True):
            if part.result == OK and part.addresses:
                return part.addresses[0]
        return f"{host}:{port}"

    async def stop(self) -> None:
        if self._poller is not None:
            await self._poller.stop()
            self._poller = None
