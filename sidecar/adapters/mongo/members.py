"""What the monitors have learned about an upstream's servers, and which of them may take a command.

Pure: ``observe(endpoint, hello reply or None)`` updates the picture and says what follows (hosts to start
monitoring, stale primaries to check again); ``eligible(read_preference)`` answers from it.

* A list of routers or standalone servers: every server that answers is eligible for everything; when none
  answers, all are (a command then fails with a clear error instead of waiting).
* A replica set: members come from the ``hosts``/``passives`` the members report; the primary is the member
  that says so, the newest (``setVersion``, ``electionId``) if two do; reads go to the members the read
  preference allows (mode, then the first tag set that matches any member).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .commands import ReadPreference

#: What the sidecar says about itself before any upstream has answered (MongoDB 7.0's values).
DEFAULT_FACTS = {
    "maxWireVersion": 21,
    "minWireVersion": 0,
    "logicalSessionTimeoutMinutes": 30,
    "maxBsonObjectSize": 16 * 1024 * 1024,
    "maxMessageSizeBytes": 48_000_000,
    "maxWriteBatchSize": 100_000,
}


@dataclass
class ServerState:
    endpoint: str
    kind: str = "unknown"  # unknown | mongos | standalone | primary | secondary | other
    set_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    election: tuple[int, bytes] = (0, b"")
    hello: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.kind != "unknown"


@dataclass(frozen=True)
class Observed:
    """What follows an observation: ``changed`` (a server's kind or the primary), ``discovered`` (hosts
    not monitored yet), ``stale`` (servers that still claim to be primary after a newer election), and
    ``went_down`` (the server was usable before)."""

    changed: bool
    discovered: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()
    went_down: bool = False
    primary_changed: bool = False


class Members:
    def __init__(self, seeds: Sequence[str], replica_set: str | None = None) -> None:
        self.seeds = list(seeds)
        self.replica_set = replica_set
        self.servers: dict[str, ServerState] = {e: ServerState(e) for e in self.seeds}
        self.primary: str | None = None

    def observe(self, endpoint: str, reply: dict[str, Any] | None, err: str | None = None) -> Observed:
        s = self.servers.setdefault(endpoint, ServerState(endpoint))
        before = (s.kind, self.primary)
        went_down = False
        discovered: list[str] = []
        if reply is None or reply.get("ok") != 1:
            went_down = s.kind != "unknown"
            s.kind, s.error, s.hello = "unknown", err or "hello failed", {}
        else:
            s.hello, s.error = reply, None
            s.kind = _kind(reply)
            s.set_name = reply.get("setName")
            tags = reply.get("tags")
            s.tags = {str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else {}
            eid = reply.get("electionId")
            s.election = (int(reply.get("setVersion", 0) or 0), bytes(eid.binary) if eid is not None else b"")
            if self.replica_set is not None:
                if s.set_name != self.replica_set:
                    s.kind = "other"
                    s.error = f"replica set name {s.set_name!r}, expected {self.replica_set!r}"
                else:
                    for h in list(reply.get("hosts") or []) + list(reply.get("passives") or []):
                        if isinstance(h, str) and h not in self.servers:
                            self.servers[h] = ServerState(h)
                            discovered.append(h)
        stale = self._choose_primary()
        return Observed(
            changed=(s.kind, self.primary) != before,
            discovered=tuple(discovered),
            stale=tuple(stale),
            went_down=went_down,
            primary_changed=before[1] != self.primary,
        )

    def _choose_primary(self) -> list[str]:
        claims = [s for s in self.servers.values() if s.kind == "primary"]
        if not claims:
            self.primary = None
            return []
        best = max(claims, key=lambda s: s.election)
        stale = []
        for s in claims:
            if s is not best:  # a primary that has not noticed the newer election yet
                s.kind = "unknown"
                s.error = f"stale primary (newer election on {best.endpoint})"
                stale.append(s.endpoint)
        self.primary = best.endpoint
        return stale

    def reseed(self, seeds: Sequence[str]) -> list[str]:
        """A new seed list (a mongodb+srv:// record read again): servers added are unknown until monitored;
        seeds that left, and are not members a replica set reported, are forgotten. The ones forgotten."""
        gone = [e for e in self.seeds if e not in seeds]
        self.seeds = list(seeds)
        for e in seeds:
            self.servers.setdefault(e, ServerState(e))
        if self.replica_set is None:
            for e in gone:
                self.servers.pop(e, None)
        else:
            gone = []
        self._choose_primary()
        return gone

    # -- selection -------------------------------------------------------------------------------------
    def eligible(self, rp: ReadPreference) -> list[str]:
        if self.replica_set is None:
            up = [e for e, s in self.servers.items() if s.up and s.kind != "other"]
            return up or list(self.seeds)
        primary = [self.primary] if self.primary else []
        if rp.mode == "primary":
            return primary
        secondaries = _tagged([s for s in self.servers.values() if s.kind == "secondary"], rp)
        if rp.mode == "secondary":
            return secondaries
        if rp.mode == "secondaryPreferred":
            return secondaries or primary
        if rp.mode == "primaryPreferred":
            return primary or secondaries
        return _tagged([s for s in self.servers.values() if s.kind in ("primary", "secondary")], rp)

    def describe_unselectable(self, rp: ReadPreference, upstream: str) -> str:
        states = ", ".join(
            f"{e}: {s.kind}" + (f" ({s.error})" if s.error else "") for e, s in self.servers.items()
        )
        target = "a primary" if rp.primary_only else f"a server for read preference {rp.describe()}"
        return f"no {target} in upstream {upstream!r} [{states}]"

    # -- what the sidecar says about itself ------------------------------------------------------------
    def facts(self) -> dict[str, Any]:
        """The upstream's limits as the sidecar's own ``hello`` reports them: the lowest value wins."""
        answered = [s.hello for s in self.servers.values() if s.up and s.hello]
        out: dict[str, Any] = dict(DEFAULT_FACTS)
        for key in DEFAULT_FACTS:
            values = [h[key] for h in answered if isinstance(h.get(key), int | float)]
            if values:
                out[key] = int(min(values))
        if any(h.get("logicalSessionTimeoutMinutes") is None for h in answered):
            out["logicalSessionTimeoutMinutes"] = None  # a server without sessions: the app gets none
        return out


def _tagged(members: list[ServerState], rp: ReadPreference) -> list[str]:
    if not rp.tag_sets:
        return [s.endpoint for s in members]
    for tag_set in rp.tag_sets:
        hits = [s.endpoint for s in members if all(s.tags.get(k) == v for k, v in tag_set)]
        if hits:
            return hits
    return []


def _kind(reply: dict[str, Any]) -> str:
    if reply.get("msg") == "isdbgrid":
        return "mongos"
    if reply.get("setName") is not None:
        if reply.get("isWritablePrimary") or reply.get("ismaster"):
            return "primary"
        if reply.get("secondary"):
            return "secondary"
        return "other"
    return "standalone"
