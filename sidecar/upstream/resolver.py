"""Names to addresses, asynchronously: dnspython's asyncio resolver (custom nameservers and ports, SRV, TXT,
TTLs), never a blocking ``getaddrinfo`` on the loop, and never on a request's path (``discovery.py`` polls).

Where the answers come from (``resolver:``): the system's configuration by default (the nameservers, search
list and ``ndots`` of /etc/resolv.conf, as a pod's own lookups use them), or the ``nameservers`` given, each
asked in turn for up to ``timeout``. Either way /etc/hosts comes first, as the system resolver's does: a name
it lists (``localhost``) stays one endpoint under its name, connected as before (the operating system picks
among its addresses at each connection); /etc/hosts is not a discovery mechanism, it holds no TTL and
changes with no one told.

Every lookup answers with :class:`~sidecar.upstream.resolution.Part` records (``ok``, ``empty``,
``error``), never an exception: ``discovery.py`` merges them with the last good answer. The SRV and TXT
lookups are there for any adapter that polls a record (a MongoDB ``mongodb+srv://`` seed list, issue 23):
see :meth:`Resolver.srv` and :meth:`Resolver.txt`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver

from .resolution import ALL, EMPTY, ERROR, HOSTS, OK, V4, V6, Part
from .target import NAME, SRV, STATIC, Target, join_host_port, split_host_port

log = logging.getLogger("sidecar.dns")

#: Which questions ``family`` asks.
FAMILIES = {"auto": (V4, V6), "v4": (V4,), "v6": (V6,)}
_RDTYPE = {V4: dns.rdatatype.A, V6: dns.rdatatype.AAAA}


@dataclass(frozen=True, slots=True)
class SrvRecord:
    """One record of an SRV answer."""

    target: str
    port: int
    priority: int
    weight: int


@dataclass(frozen=True, slots=True)
class TxtAnswer:
    """A TXT lookup: its ``result`` (``ok``, ``empty``, ``error``), each record's strings joined, the TTL."""

    result: str
    records: tuple[str, ...] = ()
    ttl: float | None = None
    detail: str = ""


class HostsFile:
    """The names /etc/hosts lists, read again when the file changes."""

    def __init__(self, path: str = "/etc/hosts") -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._names: frozenset[str] = frozenset()

    def lists(self, name: str) -> bool:
        self._refresh()
        return name.rstrip(".").lower() in self._names

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._seen, self._names = None, frozenset()
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return
        names: set[str] = set()
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    fields = line.partition("#")[0].split()
                    names.update(n.rstrip(".").lower() for n in fields[1:])
        except OSError:
            return
        self._seen, self._names = seen, frozenset(names)


class Resolver:
    """One resolver configuration (``resolver:``); ``nameservers``: ``["ip:port", ...]``, ``None`` for the
    system's."""

    def __init__(
        self,
        nameservers: list[str] | None = None,
        timeout: float = 2.0,
        *,
        hosts: HostsFile | None = None,
        resolv_conf: str = "/etc/resolv.conf",
    ) -> None:
        self.hosts = hosts if hosts is not None else HostsFile()
        self.problem = ""  # why nothing can be resolved (no usable /etc/resolv.conf)
        if nameservers is None:
            try:
                r = dns.asyncresolver.Resolver(filename=resolv_conf)
            except dns.exception.DNSException as e:  # no nameserver in it, or no file
                r = dns.asyncresolver.Resolver(configure=False)
                self.problem = f"no nameserver to ask ({resolv_conf}: {e})"
            self.search = True  # a short name is looked up as the system would (search list, ndots)
        else:
            r = dns.asyncresolver.Resolver(configure=False)
            servers = []
            for ns in nameservers:
                host, port = split_host_port(ns)
                servers.append(dns.nameserver.Do53Nameserver(host, port))
            r.nameservers = servers
            self.search = False
        r.cache = None  # every refresh asks anew
        r.timeout = timeout
        r.lifetime = timeout * max(1, len(r.nameservers))
        self._resolver = r
        self.timeout = timeout

    @property
    def lifetime(self) -> float:
        """The longest one question may take (each nameserver in turn, up to ``timeout`` each)."""
        return float(self._resolver.lifetime)

    # -- an endpoint target -----------------------------------------------------------------------------
    async def resolve(self, target: Target, family: str) -> list[Part]:
        """The parts of one resolution of ``target`` (``family``: auto, v4, v6)."""
        if target.kind == STATIC:
            return [Part(target.text, HOSTS, OK, (target.text,))]
        if target.kind == NAME:
            return await self.addresses(target.host, target.port, family)
        if target.kind == SRV:
            return await self.srv_endpoints(target.host, family)
        raise ValueError(f"unknown target kind {target.kind!r}")  # pragma: no cover - parse() makes them

    async def addresses(self, host: str, port: int, family: str, absolute: bool = False) -> list[Part]:
        """The addresses of ``host`` (as ``address:port``), one part per family asked; a name in
        /etc/hosts is one part of its own (``host:port`` itself). ``absolute``: do not use the search list
        (a name from an SRV answer)."""
        name = join_host_port(host, port)
        if self.hosts.lists(host):
            return [Part(name, HOSTS, OK, (name,))]
        families = FAMILIES[family]
        answers = await asyncio.gather(*(self._query(host, _RDTYPE[f], absolute) for f in families))
        parts = []
        for fam, (result, rdatas, ttl, detail) in zip(families, answers, strict=True):
            addresses = tuple(join_host_port(rd.address, port) for rd in rdatas)
            parts.append(Part(name, fam, result, addresses, ttl, detail))
        return parts

    async def srv_endpoints(self, name: str, family: str) -> list[Part]:
        """Every target:port of SRV ``name``, each resolved to its addresses (priority and weight are not
        used: every target is an endpoint, and the balancer spreads the load by what is outstanding)."""
        result, records, ttl, detail = await self.srv(name)
        if result != OK:
            return [Part(name, ALL, result, (), ttl, detail)]
        if not records:
            return [Part(name, ALL, EMPTY, (), ttl, "no target (the service is not available)")]
        per_target = await asyncio.gather(
            *(self.addresses(r.target, r.port, family, absolute=True) for r in records)
        )
        parts: list[Part] = []
        for found in per_target:
            for p in found:
                # the SRV record's own TTL bounds every answer it led to
                t = p.ttl if p.ttl is None or ttl is None else min(p.ttl, ttl)
                parts.append(Part(p.name, p.family, p.result, p.addresses, ttl if t is None else t, p.detail))
        return parts

    # -- records, for any poller (issue 23's mongodb+srv:// seed list and its TXT options) ---------------
    async def srv(self, name: str) -> tuple[str, list[SrvRecord], float | None, str]:
        """SRV ``name``: ``(result, records, ttl, detail)``; a lone ``.`` target (RFC 2782: the service is
        not offered) is no record."""
        result, rdatas, ttl, detail = await self._query(name, dns.rdatatype.SRV, False)
        records = [
            SrvRecord(rd.target.to_text(omit_final_dot=True).lower(), rd.port, rd.priority, rd.weight)
            for rd in rdatas
            if rd.target != dns.name.root
        ]
        return result, records, ttl, detail

    async def txt(self, name: str) -> TxtAnswer:
        result, rdatas, ttl, detail = await self._query(name, dns.rdatatype.TXT, False)
        records = tuple(b"".join(rd.strings).decode("utf-8", "replace") for rd in rdatas)
        return TxtAnswer(result, records, ttl, detail)

    # -- one question -------------------------------------------------------------------------------------
    async def _query(
        self, name: str, rdtype: dns.rdatatype.RdataType, absolute: bool
    ) -> tuple[str, list, float | None, str]:
        """Ask one question: ``(result, rdatas, ttl, detail)``; never raises for an answer or a failure."""
        if self.problem:
            return ERROR, [], None, self.problem
        qname = name + "." if absolute and not name.endswith(".") else name
        kind = dns.rdatatype.to_text(rdtype)
        try:
            answer = await self._resolver.resolve(qname, rdtype, search=self.search and not absolute)
        except dns.resolver.NXDOMAIN:
            return EMPTY, [], None, "NXDOMAIN"
        except dns.resolver.NoAnswer:
            return EMPTY, [], None, f"no {kind} record"
        except dns.resolver.LifetimeTimeout:
            return ERROR, [], None, f"no answer to {kind} within {self.lifetime:g}s"
        except dns.resolver.NoNameservers as e:
            return ERROR, [], None, _short(e, kind)
        except (dns.exception.DNSException, OSError) as e:
            return ERROR, [], None, f"{kind}: {type(e).__name__}: {e}"
        ttl = float(answer.chaining_result.minimum_ttl)
        return OK, list(answer), ttl, ""


def _short(e: dns.resolver.NoNameservers, kind: str) -> str:
    """dnspython's message for every nameserver failing, without the question's text."""
    errors = e.kwargs.get("errors") or []
    said = sorted({str(err[3]) for err in errors if len(err) > 3})
    return f"{kind}: every nameserver failed ({'; '.join(said) or 'no answer'})"
