"""The Grafana dashboard (helm/retry-sidecar/dashboards/retry-sidecar.json, shipped by the chart and provisioned
in deploy/compose): every panel's PromQL parses (promql-parser), and every metric it names is one a live
sidecar exports on /metrics, with every feature the dashboard shows turned on (admission, concurrency,
outlier detection, a fleet-wide retry budget through a real redis-server)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.http_upstream import Fault, FaultyUpstream
from sidecar.testing.redis_server import RedisServer, binary
from tests.metrics import metric, until

DASHBOARD = (
    Path(__file__).resolve().parents[3] / "helm" / "retry-sidecar" / "dashboards" / "retry-sidecar.json"
)
#: What Grafana puts in place of its variables before the query reaches Prometheus.
VARIABLES = {"$__rate_interval": "1m", "$job": ".*", "$listener": ".*", "$upstream": ".*"}


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable, Grafana's variables replaced."""
    out = []
    for p in panels(dashboard["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), *\w+\)", v["query"]["query"])
            assert m, v["query"]
            out.append((f"variable {v['name']}", m.group(1)))
    replaced = []
    for where, expr in out:
        for var, value in VARIABLES.items():
            expr = expr.replace(var, value)
        replaced.append((where, expr))
    return replaced


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (parsed, not guessed by a regular expression)."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name: {node}"
            names.add(node.name)
            return
        if isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
            return
        for attr in ("expr", "lhs", "rhs", "param"):
            child = getattr(node, attr, None)
            if child is not None:
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(promql_parser.parse(expr))
    return names


def exported(text: str) -> set[str]:
    """Every series name a scrape of ``text`` can give: its samples, and for each family it declares the
    names Prometheus keeps (``_total`` of a counter, ``_bucket``/``_sum``/``_count`` of a histogram)."""
    names = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    for fam in text_string_to_metric_families(text):
        names.update(s.name for s in fam.samples)
        names.update(fam.name + suffix for suffix in suffixes.get(fam.type, ("",)))
    return names


def test_the_checker_finds_a_misspelt_metric_and_ignores_labels_and_functions() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, upstream) (rate(sidecar_request_duration_seconds_bucket{upstream=~".*"}[1m])))'
    assert metric_names(expr) == {"sidecar_request_duration_seconds_bucket"}
    assert metric_names("sum(rate(sidecar_request_total[1m])) / on() group_left sum(up)") == {
        "sidecar_request_total",
        "up",
    }
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(sidecar_requests_total[1m])")


async def test_every_panel_names_metrics_a_live_sidecar_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "retry-sidecar"
    exprs = expressions(dashboard)
    assert len(exprs) >= 30
    try:
        binary()
    except RuntimeError as e:  # loud: make test installs it (tools/ensure-redis.sh)
        pytest.fail(str(e))
    with RedisServer() as redis:
        async with (
            FaultyUpstream(latency=0.001, keep_records=False) as good,
            FaultyUpstream(fail_rate=1.0, fail=Fault(503), keep_records=False) as hot,
        ):
            cfg = {
                "admin": {"listen": "127.0.0.1:0"},
                "fleet": {
                    "redis": {"url": redis.url, "key_prefix": "dashboard-test:", "timeout": "500ms"},
                    "lease": "100ms",
                },
                "admission": {"door": {"requests": {"rate": 1000}, "connections": {"rate": 1000}}},
                "upstreams": {
                    "orders": {
                        "endpoints": [good.endpoint, hot.endpoint],
                        "concurrency": {"mode": "probing", "initial": 8},
                        "retry_budget": {"scope": "fleet", "ratio": 0.5, "min_per_second": 10},
                    }
                },
                "policies": {"p": {"extends": "http-default", "backoff": {"initial": "0ms", "max": "0ms"}}},
                "listeners": [
                    {
                        "name": "web",
                        "protocol": "http",
                        "listen": "127.0.0.1:0",
                        "upstream": "orders",
                        "policy": "p",
                        "admission": "door",
                    }
                ],
            }
            async with App(load_dict(cfg, {})) as app, aiohttp.ClientSession() as http:
                host, port = app.address("web")
                for i in range(20):
                    async with http.get(f"http://{host}:{port}/orders/{i}") as r:
                        assert r.status == 200
                assert app.fleet is not None
                await app.fleet.wait_for(lambda m: m.up == 1)
                await until(lambda: metric(app, "sidecar_retries_total") > 0, "a retry")
                assert app.admin is not None
                admin_host, admin_port = app.admin.address
                async with http.get(f"http://{admin_host}:{admin_port}/metrics") as r:
                    names = exported(await r.text())
    names.add("up")  # Prometheus' own, beside every scrape
    unknown = [
        (where, sorted(metric_names(expr) - names)) for where, expr in exprs if metric_names(expr) - names
    ]
    assert not unknown, unknown
    used = set().union(*(metric_names(e) for _, e in exprs))
    assert {"sidecar_requests_total", "sidecar_retries_total", "sidecar_concurrency_limit"} <= used
