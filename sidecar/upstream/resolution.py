"""What a resolution of one target says, merged with what was known before, and how an upstream's set of
addresses changes (pure: no sockets, no clock; wall-clock times come in as arguments).

A resolution is made of parts, one per question asked (a name's A addresses, its AAAA addresses, an SRV
list): each part answered (``ok``), answered nothing (``empty``: NXDOMAIN, no address of that family) or
failed (``error``: a timeout, SERVFAIL, no server). :func:`combine` makes the target's new endpoints of them:
what answered replaces what that question gave before, what failed keeps the last good answer. So a failed
resolution never empties a set, and an answer with no address does (requests then get the sidecar's
no-endpoint answer at once, never a wait for an address that may not come).

:class:`TargetState` is one target's record (its endpoints and how its resolutions went, for ``/config``);
:func:`union` makes an upstream's set of its targets' endpoints, and :func:`diff` says what changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: A resolution's result, as ``sidecar_dns_resolutions_total{result}`` counts it.
OK = "ok"
EMPTY = "empty"
ERROR = "error"
RESULTS = (OK, EMPTY, ERROR)

#: The family of a part: IPv4 and IPv6 addresses, names answered from /etc/hosts, a whole SRV list.
V4 = "v4"
V6 = "v6"
HOSTS = "hosts"
ALL = "all"


@dataclass(frozen=True, slots=True)
class Found:
    """One endpoint a target stands for: its ``address`` and the ``name`` it was found under."""

    address: str
    name: str


@dataclass(frozen=True, slots=True)
class Part:
    """The answer to one question: the addresses of ``name`` in ``family`` (for an SRV list that failed,
    ``family`` is :data:`ALL`: it covers every endpoint of the target)."""

    name: str
    family: str
    result: str
    addresses: tuple[str, ...] = ()
    ttl: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Resolution:
    """One resolution of a target: its ``result``, the ``endpoints`` it stands for now, the shortest TTL of
    the answers it used, and what went wrong (``detail``)."""

    result: str
    endpoints: tuple[Found, ...]
    ttl: float | None = None
    detail: str = ""


def family_of(address: str) -> str:
    """``[2001:db8::1]:80`` -> v6, ``10.1.2.3:80`` -> v4, ``localhost:80`` (from /etc/hosts) -> hosts."""
    if address.startswith("["):
        return V6
    host = address.rpartition(":")[0]
    return V4 if host.replace(".", "").isdigit() and host.count(".") == 3 else HOSTS


def combine(parts: Sequence[Part], previous: Sequence[Found]) -> Resolution:
    """The endpoints ``parts`` stand for, given the ``previous`` ones: a failed part keeps what ``previous``
    had of its name and family (of every name, for :data:`ALL`), in the previous order; answered parts give
    theirs, in the answer's order. ``error`` when a part failed, else ``empty`` when no endpoint is left,
    else ``ok``."""
    failed = [p for p in parts if p.result == ERROR]
    kept: list[Found] = []
    if failed:
        if any(p.family == ALL for p in failed):
            kept = list(previous)
        else:
            lost = {(p.name, p.family) for p in failed}
            kept = [f for f in previous if (f.name, family_of(f.address)) in lost]
    found: dict[str, Found] = {f.address: f for f in kept}
    for p in parts:
        if p.result == OK:
            for address in p.addresses:
                found.setdefault(address, Found(address, p.name))
    ttls = [p.ttl for p in parts if p.result == OK and p.ttl is not None]
    ttl = min(ttls) if ttls else None
    if failed:
        return Resolution(ERROR, tuple(found.values()), ttl, _details(failed))
    if not found:
        return Resolution(EMPTY, (), ttl, _details(parts))
    return Resolution(OK, tuple(found.values()), ttl)


def _details(parts: Sequence[Part]) -> str:
    """What ``parts`` said, as briefly as it can be said: ``NXDOMAIN`` when all said that; else each one's,
    named by family (and by name, when there are several)."""
    said = [p.detail or p.result for p in parts]
    if len(set(said)) == 1:
        return said[0]
    several = len({p.name for p in parts}) > 1
    return "; ".join(
        f"{p.name + ' ' if several else ''}{p.family}: {text}" for p, text in zip(parts, said, strict=True)
    )


class TargetState:
    """One target's record: the endpoints it stands for now and how its resolutions went. ``resolved``:
    at least one resolution ended (whatever its result); ``last_success``: the wall-clock time of the last
    one that answered (``ok`` or ``empty``)."""

    __slots__ = ("endpoints", "resolved", "last_result", "detail", "last_attempt", "last_success", "ttl")

    def __init__(self, endpoints: Sequence[Found] = ()) -> None:
        self.endpoints: tuple[Found, ...] = tuple(endpoints)
        self.resolved = False
        self.last_result: str | None = None
        self.detail = ""
        self.last_attempt: float | None = None
        self.last_success: float | None = None
        self.ttl: float | None = None

    def apply(self, resolution: Resolution, wall: float) -> bool:
        """Take ``resolution`` (ended at wall-clock time ``wall``). True when the endpoints changed."""
        before = self.endpoints
        self.endpoints = resolution.endpoints
        self.resolved = True
        self.last_result = resolution.result
        self.detail = resolution.detail
        self.last_attempt = wall
        self.ttl = resolution.ttl
        if resolution.result != ERROR:
            self.last_success = wall
        return before != self.endpoints


def union(sets: Iterable[Sequence[Found]]) -> list[Found]:
    """An upstream's endpoints: every target's, in order; an address two targets share is one endpoint
    (found under the first one's name)."""
    out: dict[str, Found] = {}
    for found in sets:
        for f in found:
            out.setdefault(f.address, f)
    return list(out.values())


@dataclass(frozen=True, slots=True)
class Diff:
    """How a set of addresses changed: those ``added``, and those ``removed`` (drained)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


def diff(before: Sequence[str], after: Sequence[str]) -> Diff:
    old, new = set(before), set(after)
    return Diff(tuple(a for a in after if a not in old), tuple(a for a in before if a not in new))
