"""Which servers may take a command, from what their hello said: no sockets."""

from __future__ import annotations

from bson.objectid import ObjectId

from sidecar.adapters.mongo.commands import ReadPreference
from sidecar.adapters.mongo.members import Members

PRIMARY = ReadPreference()
SECONDARY = ReadPreference("secondary")


def member(role: str, hosts: list[str], **extra: object) -> dict:
    doc = {
        "ok": 1.0,
        "setName": "rs0",
        "hosts": hosts,
        "isWritablePrimary": role == "primary",
        "secondary": role == "secondary",
    }
    doc.update(extra)
    return doc


def test_routers_are_all_eligible_once_they_answer_and_all_are_when_none_does() -> None:
    m = Members(["a:1", "b:2"])
    assert m.eligible(PRIMARY) == ["a:1", "b:2"]  # nobody answered yet: try them all
    m.observe("a:1", {"ok": 1.0, "msg": "isdbgrid"})
    m.observe("b:2", None, "connection refused")
    assert m.eligible(PRIMARY) == ["a:1"] and m.eligible(SECONDARY) == ["a:1"]


def test_replica_set_discovery_primary_and_read_preferences() -> None:
    hosts = ["a:1", "b:2", "c:3"]
    m = Members(["a:1"], replica_set="rs0")
    seen = m.observe("a:1", member("primary", hosts, electionId=ObjectId(), setVersion=1))
    assert seen.discovered == ("b:2", "c:3") and seen.primary_changed
    m.observe("b:2", member("secondary", hosts, tags={"dc": "east"}))
    m.observe("c:3", member("secondary", hosts, tags={"dc": "west"}))
    assert m.eligible(PRIMARY) == ["a:1"]
    assert m.eligible(SECONDARY) == ["b:2", "c:3"]
    assert m.eligible(ReadPreference("secondary", ((("dc", "west"),),))) == ["c:3"]
    assert m.eligible(ReadPreference("secondary", ((("dc", "north"),), ()))) == [
        "b:2",
        "c:3",
    ]  # {} matches all
    assert m.eligible(ReadPreference("nearest")) == hosts
    m.observe("b:2", None, "down")
    m.observe("c:3", None, "down")
    assert m.eligible(ReadPreference("secondaryPreferred")) == ["a:1"]
    assert m.eligible(SECONDARY) == []


def test_the_newest_election_wins_and_the_stale_primary_is_checked_again() -> None:
    hosts = ["a:1", "b:2"]
    m = Members(hosts, replica_set="rs0")
    old, new = ObjectId(), ObjectId()
    m.observe("a:1", member("primary", hosts, electionId=old, setVersion=1))
    seen = m.observe("b:2", member("primary", hosts, electionId=new, setVersion=1))
    assert m.primary == "b:2" and seen.stale == ("a:1",)
    assert m.eligible(PRIMARY) == ["b:2"]


def test_a_member_of_another_set_is_never_eligible() -> None:
    m = Members(["a:1"], replica_set="rs0")
    m.observe("a:1", {**member("primary", ["a:1"]), "setName": "other"})
    assert m.eligible(PRIMARY) == [] and "expected 'rs0'" in m.describe_unselectable(PRIMARY, "db")


def test_facts_take_the_lowest_value_and_defaults_until_someone_answers() -> None:
    m = Members(["a:1", "b:2"])
    assert m.facts()["maxWireVersion"] == 21
    m.observe("a:1", {"ok": 1.0, "msg": "isdbgrid", "maxWireVersion": 25, "logicalSessionTimeoutMinutes": 30})
    m.observe("b:2", {"ok": 1.0, "msg": "isdbgrid", "maxWireVersion": 17, "logicalSessionTimeoutMinutes": 20})
    f = m.facts()
    assert f["maxWireVersion"] == 17 and f["logicalSessionTimeoutMinutes"] == 20
