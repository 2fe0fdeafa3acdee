"""The floor problem and its fix at fleet scale, in the des engine: 300 sidecars in a full outage, each with
its own ``retry_budget`` floor against one budget shared by the fleet (what the Redis leases approximate)."""

from __future__ import annotations

import pytest

from sidecar.simulate import des
from sidecar.simulate.scenario import load
from sidecar.simulate.summary import amplification


def outage_amplification(scope: str, sidecars: int = 300) -> float:
    s = load(
        "full-outage",
        {
            "duration": "40s",
            "outage": {"start": "10s", "duration": "20s"},
            "sidecar": {
                "instances": sidecars,
                "policy": {"throttle": None},  # the retry budget alone decides
                "upstream": {"retry_budget": {"scope": scope, "ratio": 0.2, "min_per_second": 10}},
            },
        },
    )
    rec = des.run(s, "sidecar")
    amp = amplification(rec, 15, 30)  # the outage, after the budgets' first window of requests
    assert amp is not None
    return amp


def test_local_floors_add_up_to_every_retry_the_policy_allows():
    # 100 requests/s over 300 sidecars: each one's floor (10/s) covers all its retries: 3 attempts each
    assert outage_amplification("local") == pytest.approx(3.0, abs=0.05)


def test_one_fleet_budget_allows_ratio_plus_one_floor():
    # 0.2 x 100 requests/s + 10/s of floor = 30 retries/s for 100 requests/s: 1.3 attempts per request
    assert outage_amplification("fleet") == pytest.approx(1.3, abs=0.1)


def test_one_sidecar_is_its_own_fleet():
    assert outage_amplification("fleet", 1) == pytest.approx(outage_amplification("local", 1), abs=0.02)
