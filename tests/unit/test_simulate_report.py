"""Scenario files, the summary's definitions on hand-made records, the report and its JSON, the figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.simulate import scenario as scenarios
from sidecar.simulate.command import main, parse_sets
from sidecar.simulate.record import Record, percentile
from sidecar.simulate.report import Report, render, result
from sidecar.simulate.scenario import ScenarioError, from_dict
from sidecar.simulate.summary import amplification, summarize

SHIPPED = ["at-capacity", "brownout", "crash-tickets", "flaky", "full-outage", "long-tail", "seed-crash"]


def test_the_shipped_scenarios_load() -> None:
    assert scenarios.shipped() == SHIPPED
    for name in SHIPPED:
        s = scenarios.load(name)
        assert s.name == name and s.description


def test_scenario_errors_name_their_keys() -> None:
    with pytest.raises(ScenarioError) as e:
        from_dict({"clients": {"rate": -1, "timout": "1s"}, "outage": {"start": "1s", "duration": 5}})
    paths = [p for p, _ in e.value.errors]
    assert paths == ["clients.rate", "clients.timout", "outage.duration"]
    assert "a duration needs a unit" in str(e.value)


def test_a_bad_sidecar_policy_is_reported_with_its_path() -> None:
    from sidecar.simulate.policy import compile_policy

    s = from_dict({"sidecar": {"policy": {"extends": "http-default", "max_attempts": 0}}})
    with pytest.raises(ScenarioError) as e:
        compile_policy(s, ["127.0.0.1:1"])
    assert e.value.errors[0][0] == "sidecar.policies.sim.max_attempts"


def test_an_unknown_scenario_lists_the_shipped_ones() -> None:
    with pytest.raises(ScenarioError) as e:
        scenarios.load("seed-crush")
    assert "seed-crash" in str(e.value)


def test_sets_become_nested_overrides() -> None:
    assert parse_sets(["clients.rate=200", "outage.mode=error", "outage.start=20s"]) == {
        "clients": {"rate": 200},
        "outage": {"mode": "error", "start": "20s"},
    }
    with pytest.raises(ScenarioError):
        parse_sets(["clients.rate"])


def record(ok: list[int], offered: list[int] | None = None, attempts: list[int] | None = None) -> Record:
    rec = Record(len(ok))
    for i, s in enumerate(rec.seconds):
        s.ok = ok[i]
        s.offered = offered[i] if offered else ok[i]
        s.attempts = attempts[i] if attempts else s.offered
        s.inflight = 10
    return rec


SC = from_dict({"duration": "30s", "warmup": "2s", "outage": {"start": "10s", "duration": "5s"}})


def test_recovery_is_the_first_second_after_the_outage_starting_5_s_at_95_percent() -> None:
    ok = [100] * 10 + [0] * 5 + [0, 0, 50, 100, 95, 95, 95, 95, 95] + [100] * 6
    s = summarize("x", record(ok), SC)
    assert s.baseline_goodput == 100
    # from 17: 50,100,95,95,95 -> 87 < 95; from 18: 100,95,95,95,95 -> 96 >= 95
    assert s.recovered and s.recovery_s == 3.0


def test_no_recovery_when_goodput_never_comes_back() -> None:
    s = summarize("x", record([100] * 10 + [20] * 20), SC)
    assert not s.recovered and s.recovery_s is None


def test_amplification_is_attempts_over_requests_in_the_window() -> None:
    rec = record([0] * 30, offered=[10] * 30, attempts=[10] * 10 + [30] * 5 + [11] * 15)
    s = summarize("x", rec, SC)
    assert s.amplification_outage == 3.0
    assert s.amplification_after == pytest.approx(1.1)
    assert amplification(rec, 12, 14) == 3.0


def test_success_rate_counts_old_unfinished_requests_as_failures() -> None:
    rec = record([10] * 30)
    rec.seconds[5].failed = 20
    rec.open_at_end([1.0, 2.0, 29.5], end=30.0, timeout=2.0)
    s = summarize("x", rec, SC)
    assert s.success_rate == pytest.approx(300 / (300 + 20 + 2))


def test_percentiles_are_nearest_rank() -> None:
    v = list(range(1, 1001))
    assert percentile(v, 0.5) == 500 and percentile(v, 0.99) == 990 and percentile(v, 0.999) == 999
    assert percentile([], 0.5) is None


def test_a_record_survives_json_and_merges() -> None:
    a = record([5] * 30)
    a.seconds[3].latencies = [1.5, 2.5]
    b = Record.from_json(json.loads(json.dumps(a.to_json())))
    assert b.to_json() == a.to_json()
    server = Record(30)
    server.inflight(0.5, 7)
    server.inflight(20.2, 9)
    merged = Record.merge([a, b], [server])
    assert merged.seconds[3].ok == 10 and merged.seconds[3].latencies == [1.5, 2.5, 1.5, 2.5]
    assert [merged.seconds[i].inflight for i in (0, 10, 20, 29)] == [7, 7, 9, 9]


def test_the_report_and_its_json() -> None:
    rep = Report(SC, "des", [result("fixed", record([100] * 30), SC)])
    text = "\n".join(render(rep))
    assert "== fixed" in text and "  10*" in text and "recovered 0 s after the stop ended" in text
    data = rep.to_json()
    assert data["scenario"] == "custom" and data["engine"] == "des"
    keys = {
        "recovered",
        "recovery_s",
        "peak_inflight",
        "amplification_outage",
        "amplification_after",
        "success_rate",
        "p99_ms",
    }
    assert keys <= set(data["strategies"]["fixed"])


def test_the_command_ends_with_one_json_line_and_writes_a_png(tmp_path: Path) -> None:
    lines: list[str] = []
    png = tmp_path / "fig.png"
    code = main(
        "flaky",
        "des",
        ["fixed,sidecar"],
        20.0,
        png,
        True,
        ["clients.count=100", "clients.rate=50"],
        out=lines.append,
        err=lambda _: None,
    )
    assert code == 0
    data = json.loads(lines[-1])
    assert data["scenario"] == "flaky" and list(data["strategies"]) == ["fixed", "sidecar"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_refuses_bad_input_with_exit_2() -> None:
    errors: list[str] = []
    assert main("flaky", "des", ["retry-harder"], out=lambda _: None, err=errors.append) == 2
    assert main("flaky", "quantum", out=lambda _: None, err=errors.append) == 2
    assert main("nope", "des", out=lambda _: None, err=errors.append) == 2
    assert "retry-harder" in errors[0] and "quantum" in errors[1] and "no scenario named 'nope'" in errors[2]
