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
