"""Live-engine tests: real processes (model server, sidecar, clients) on 127.0.0.1, compressed scenarios."""

from __future__ import annotations

from typing import Any

from sidecar.config.presets import deep_merge
from sidecar.simulate.scenario import Scenario, from_dict

#: A few seconds of the lab: 200 clients offering 100 requests/s, 5% of answers 503.
COMPRESSED: dict[str, Any] = {
    "name": "compressed",
    "duration": "10s",
    "warmup": "1s",
    "clients": {"count": 200, "rate": 100, "timeout": "1s"},
    "server": {"error_rate": 0.05},
    "sidecar": {"policy": {"extends": "http-default", "throttle": {"kind": "grpc", "max_tokens": 100}}},
}


def compressed(**changes: Any) -> Scenario:
    return from_dict(deep_merge(COMPRESSED, changes))
