"""What a live reload may change (``reload.restart_reasons``, pure): the fleet's leases are fixed at start."""

from __future__ import annotations

from sidecar.config import load_dict
from sidecar.reload import restart_reasons


def config(budget: dict | None, fleet: dict | None, endpoints: tuple[str, ...] = ("127.0.0.1:1",)):  # noqa: ANN201
    up: dict = {"endpoints": list(endpoints)}
    if budget is not None:
        up["retry_budget"] = budget
    tree: dict = {
        "admin": {"listen": None},
        "upstreams": {"api": up},
        "listeners": [{"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "api"}],
    }
    if fleet is not None:
        tree["fleet"] = fleet
    return load_dict(tree, {})


FLEET = {"redis": {"url": "redis://127.0.0.1:6399/0"}}


def test_a_fleet_scoped_upstream_or_the_fleet_block_cannot_change_live() -> None:
    old = config({"scope": "fleet", "ratio": 0.2}, FLEET)
    assert restart_reasons(old, config({"scope": "fleet", "ratio": 0.2}, FLEET)) == []
    reasons = restart_reasons(old, config({"scope": "fleet", "ratio": 0.5}, FLEET))
    assert reasons == [
        "upstreams.api: its retry_budget is leased fleet-wide; changing this upstream needs a restart"
    ]
    moved = config({"scope": "fleet", "ratio": 0.2}, {"redis": {"url": "redis://127.0.0.1:6400/0"}})
    assert "fleet: changing the fleet block needs a restart" in restart_reasons(old, moved)


def test_a_local_budget_changes_live() -> None:
    old = config({"scope": "local", "ratio": 0.2}, None)
    assert restart_reasons(old, config({"scope": "local", "ratio": 0.5}, None, ("127.0.0.1:2",))) == []


def with_listeners(*names: str, admission: dict | None = None):  # noqa: ANN201
    tree: dict = {
        "admin": {"listen": None},
        "upstreams": {"api": {"endpoints": ["127.0.0.1:1"]}},
        "listeners": [
            {"name": n, "protocol": "http", "listen": f"127.0.0.1:{ord(n)}", "upstream": "api"}
            | ({"admission": "door"} if admission is not None else {})
            for n in names
        ],
    }
    if admission is not None:
        tree["admission"] = {"door": {"requests": admission}}
        tree["fleet"] = FLEET
    return load_dict(tree, {})


def test_listeners_may_come_and_go_unless_the_fleet_leases_their_rate() -> None:
    assert restart_reasons(with_listeners("a"), with_listeners("a", "b")) == []
    assert restart_reasons(with_listeners("a", "b"), with_listeners("b")) == []
    leased = {"rate": 100, "scope": "fleet"}
    assert restart_reasons(
        with_listeners("a", admission=leased), with_listeners("a", "b", admission=leased)
    ) == [
        "listeners.b.admission: its request rate is leased fleet-wide; adding this listener needs a restart"
    ]
    assert restart_reasons(
        with_listeners("a", "b", admission=leased), with_listeners("a", admission=leased)
    ) == [
        "listeners.b.admission: its request rate is leased fleet-wide; removing this listener needs a restart"
    ]
    local = {"rate": 100}
    assert (
        restart_reasons(with_listeners("a", admission=local), with_listeners("a", "b", admission=local)) == []
    )
