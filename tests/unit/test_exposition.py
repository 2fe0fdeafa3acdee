"""/metrics' text is what prometheus_client would write for the same families, byte for byte, and its parser
reads it back (the sidecar writes the format itself: ``sidecar/telemetry/exposition.py``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as PromSample

from sidecar.telemetry.exposition import (
    CONTENT_TYPE,
    CounterFamily,
    Family,
    GaugeFamily,
    HistogramFamily,
    Registry,
    render,
)
from sidecar.telemetry.metrics import Metrics


class _Theirs:
    """Our families handed to prometheus_client as its own ``Metric`` objects, sample for sample."""

    def __init__(self, families: Iterable[Family]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        for f in self.families:
            m = Metric(f.name, f.documentation, f.type)
            m.samples = [PromSample(s.name, s.labels, s.value) for s in f.samples]
            yield m


def generate(families: Iterable[Family]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Theirs(families))
    return generate_latest(registry)


def awkward_families() -> list[Family]:
    counter = CounterFamily(
        "sidecar_things_total", 'Things, with a \\ and a\nnewline "quoted"', labels=["a", "b"]
    )
    counter.add_metric(['back\\slash "quote"', "new\nline"], 3)
    counter.add_metric(["", "é ü 中"], 0)
    gauge = GaugeFamily("sidecar_level", "A level", labels=["z", "a"])  # labels written sorted by name
    for i, value in enumerate((0.1, -2.5, 1e7, 12345678.9, 1e-9, math.inf, -math.inf, math.nan, 123456.0)):
        gauge.add_metric([str(i), "x"], value)
    hist = HistogramFamily("sidecar_wait_seconds", "Waits", labels=["listener"])
    hist.add_metric(["web"], [("0.001", 1.0), ("0.5", 4.0), ("+Inf", 6.0)], 2.75)
    return [
        counter,
        gauge,
        hist,
        GaugeFamily("sidecar_up", "Up", value=1),
        CounterFamily("sidecar_plain", "No labels", value=7),
        HistogramFamily("sidecar_empty_histogram", "No rows"),
    ]


def populated_metrics() -> Metrics:
    metrics = Metrics()
    for listener, upstream in (("web", "orders"), ("rpc", "users")):
        m = metrics.meters(listener, upstream)
        m.attempt("success")
        m.attempt("overloaded")
        m.retry("overloaded")
        m.request("success")
        m.give_up("budget")
        m.hedges += 2
        m.duration.observe(0.004)
        m.duration.observe(42.0)
        m.listener.reject("malformed")
        m.listener.inflight = 3
    metrics.http_upstream("orders").tls_handshake("10.0.0.1:443", "ok")
    metrics.http_listener("web").tunnel_opened()
    metrics.dns("orders").count("orders.svc", "ok")
    metrics.reloaded("applied")
    metrics.reloaded("rejected")
    return metrics


@pytest.mark.parametrize("source", ["awkward", "sidecar"])
def test_text_is_prometheus_clients_byte_for_byte(source: str) -> None:
    families = awkward_families() if source == "awkward" else list(populated_metrics().registry.collect())
    ours = render(families)
    assert ours == generate(families)
    parsed = {f.name: f for f in text_string_to_metric_families(ours.decode())}
    assert {f.name for f in families} <= set(parsed)


def test_the_sidecars_families_read_back_with_their_values() -> None:
    metrics = populated_metrics()
    text = render(metrics.registry.collect()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert (
        samples[
            (
                "sidecar_attempts_total",
                (("listener", "web"), ("outcome", "overloaded"), ("upstream", "orders")),
            )
        ]
        == 1
    )
    assert (
        samples[
            (
                "sidecar_request_duration_seconds_bucket",
                (("le", "+Inf"), ("listener", "rpc"), ("upstream", "users")),
            )
        ]
        == 2
    )
    assert samples[("sidecar_config_reloads_total", (("result", "rejected"),))] == 1
    assert (
        metrics.registry.get_sample_value("sidecar_hedges_total", {"listener": "web", "upstream": "orders"})
        == 2
    )
    assert (
        metrics.registry.get_sample_value("sidecar_hedges_total", {"listener": "nope", "upstream": "x"})
        is None
    )


def test_a_row_with_the_wrong_number_of_label_values_is_refused() -> None:
    family = CounterFamily("sidecar_x", "X", labels=["a", "b"])
    with pytest.raises(ValueError, match="sidecar_x: 1 label values"):
        family.add_metric(["only-one"], 1)


def test_registry_serves_collectors_in_order_and_the_content_type_names_the_format() -> None:
    registry = Registry()
    registry.register(_Fixed([GaugeFamily("b", "B", value=1)]))
    registry.register(_Fixed([GaugeFamily("a", "A", value=2)]))
    assert [f.name for f in registry.collect()] == ["b", "a"]
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


class _Fixed:
    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> list[Family]:
        return self.families
