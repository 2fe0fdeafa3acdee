"""Benchmark 1, recovery: seed-crash on the live engine, three runs per strategy.

The article's experiment with real processes: 1000 clients, a server with the seed's latency law, stopped
(SIGSTOP) for 10 s. Fixed-interval clients get 60 s after the outage to recover, backoff and sidecar 25 s.
Compared in one run of this script: recovery time, peak server in-flight and retry amplification, per
strategy (medians of the three runs, with their spread). ``sidecar+tickets`` is the sidecar with issue 12's
execution control on its upstream (``CONCURRENCY``, or ``--concurrency``: the scenario's ``sidecar.tickets``).
Every run is printed as it ends; the goals are checked on every run, not on the medians.

    .venv/bin/python bench/recovery.py [--runs 3] [--strategies sidecar sidecar+tickets]
"""

from __future__ import annotations

import argparse
import json
import time

import yaml
from common import RESULTS, machine, median, row, say, show, spread, write

from sidecar.simulate import scenario as scenarios
from sidecar.simulate.plot import save
from sidecar.simulate.report import Report, result
from sidecar.simulate.run import run_one

STRATEGIES = ("fixed", "backoff", "sidecar", "sidecar+tickets")
AFTER = {"fixed": 60, "backoff": 25, "sidecar": 25, "sidecar+tickets": 25}  # seconds of run after the outage
#: The upstream's concurrency block of ``sidecar+tickets``: probing around the server's limit of 30, refusing
#: what cannot have a ticket at once (a queue only holds requests the stopped server cannot serve).
CONCURRENCY = {"mode": "probing", "initial": 30, "min": 4, "max": 60, "max_queue": 0, "max_wait": "0s"}
COMPRESSED = {"warmup": "3s", "outage": {"start": "10s", "duration": "10s"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", default="live", choices=("live", "des"))
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    ap.add_argument("--concurrency", default=None, help="YAML: the concurrency block of sidecar+tickets")
    args = ap.parse_args()
    concurrency = CONCURRENCY if args.concurrency is None else yaml.safe_load(args.concurrency)
    strategies = tuple(args.strategies)
    started = machine()
    t0 = time.monotonic()
    summaries: dict[str, list] = {s: [] for s in strategies}
    firsts = {}
    limit = None
    for strategy in strategies:
        for i in range(args.runs):
            overrides = {**COMPRESSED, "seed": i + 1, "duration": f"{20 + AFTER[strategy]}s"}
            if strategy == "sidecar+tickets":
                overrides["sidecar"] = {"tickets": concurrency}
            sc = scenarios.load("seed-crash", overrides)
            limit = sc.server.concurrency_limit
            res = result(strategy, run_one(sc, args.engine, strategy), sc)
            summaries[strategy].append(res.summary)
            firsts.setdefault(strategy, (sc, res))
            s = res.summary
            say(
                f"{strategy} run {i + 1}: recovered={s.recovered} recovery_s={s.recovery_s} "
                f"peak_inflight={s.peak_inflight} amp_outage={s.amplification_outage:.2f} "
                f"amp_after={s.amplification_after if s.amplification_after is None else round(s.amplification_after, 2)} "
                f"success={s.success_rate:.4f} failed_after={failed_after(res.record, sc)}"
            )
    assert limit is not None

    def col(attr: str) -> dict:
        return {k: median([getattr(s, attr) for s in v]) for k, v in summaries.items()}

    def spr(attr: str) -> dict:
        return {k: spread([getattr(s, attr) for s in v]) for k, v in summaries.items()}

    measured = {
        "runs recovered": {k: f"{sum(s.recovered for s in v)}/{len(v)}" for k, v in summaries.items()},
        "recovery after the outage (median)": col("recovery_s"),
        "peak server in-flight (median)": col("peak_inflight"),
        "peak server in-flight (highest run)": {
            k: max(s.peak_inflight for s in v) for k, v in summaries.items()
        },
        "amplification during the outage": col("amplification_outage"),
        "amplification 30 s after": col("amplification_after"),
        "client success rate": col("success_rate"),
    }
    spreads = {
        "recovery after the outage (median)": spr("recovery_s"),
        "peak server in-flight (median)": spr("peak_inflight"),
        "amplification during the outage": spr("amplification_outage"),
        "amplification 30 s after": spr("amplification_after"),
        "client success rate": spr("success_rate"),
    }
    kept = previous(strategies) if set(strategies) != set(STRATEGIES) else {}
    for metric, old in kept.items():  # columns not run this time: the last full run's figures
        measured.setdefault(metric, {})
        for k, v in old.get("values", {}).items():
            measured[metric].setdefault(k, v)
        for k, v in old.get("spread", {}).items():
            spreads.setdefault(metric, {}).setdefault(k, v)
    columns = [c for c in STRATEGIES if c in measured["client success rate"]]

    def runs(strategy: str) -> list | None:
        return summaries.get(strategy)

    fixed_runs, sidecar_runs, tickets_runs = runs("fixed"), runs("sidecar"), runs("sidecar+tickets")

    def at_once(runs_: list | None) -> bool | None:
        return None if runs_ is None else all(s.recovered and s.recovery_s <= 5 for s in runs_)

    # Each goal is judged on the columns run this time (all of its runs): fixed never recovers, the sidecar
    # with and without tickets recovers within 5 s every time.
    checks = [
        None if fixed_runs is None else not any(s.recovered for s in fixed_runs),
        at_once(sidecar_runs),
        at_once(tickets_runs),
    ]
    recovered_ok = None if all(c is None for c in checks) else all(c for c in checks if c is not None)
    fast = [c for c in (at_once(sidecar_runs), at_once(tickets_runs)) if c is not None]
    sidecar_fast = all(fast) if fast else None
    tickets_peak_ok = None if tickets_runs is None else all(s.peak_inflight < 3 * limit for s in tickets_runs)
    success = measured["client success rate"]
    tickets_success_ok = None
    if success.get("sidecar+tickets") is not None and success.get("backoff") is not None:
        tickets_success_ok = success["sidecar+tickets"] >= success["backoff"]
    peak = measured["peak server in-flight (median)"]

    def goal(metric: str, text: str | None = None, met: bool | None = None) -> dict:
        old = kept.get(metric, {})
        if met is None and text is not None and "met" in old:  # its columns were not run now: as last time
            text, met = old.get("goal", text), old["met"]
        return row(metric, UNITS.get(metric, ""), measured[metric], text, met, spread=spreads.get(metric))

    rows = [
        goal("runs recovered", "fixed none within 60 s; sidecar, sidecar+tickets all", recovered_ok),
        goal(
            "recovery after the outage (median)", "sidecar, sidecar+tickets <= 5 s in every run", sidecar_fast
        ),
        goal("peak server in-flight (median)"),
        goal(
            "peak server in-flight (highest run)",
            f"sidecar+tickets < 3x limit = {3 * limit} in every run",
            tickets_peak_ok,
        ),
        row(
            "peak in-flight / fixed's",
            "x",
            {k: (v / peak["fixed"] if v and peak.get("fixed") else None) for k, v in peak.items()},
        ),
        goal("amplification during the outage"),
        goal("amplification 30 s after"),
        goal("client success rate", "sidecar+tickets >= backoff", tickets_success_ok),
    ]
    show(columns, rows)
    report = Report(firsts[strategies[0]][0], args.engine, [firsts[s][1] for s in strategies])
    # a subset's figure goes beside the full run's, which stays the table's
    name = "recovery.png" if not kept else "recovery-subset.png"
    figure = save(report, RESULTS / name, title=f"seed-crash, {args.engine} engine (run 1 of each)")
    notes = [
        f"{args.engine} engine, {args.runs} runs per strategy (seeds 1..{args.runs}), seed-crash with a 10 s "
        f"stop at t=10 s; {time.monotonic() - t0:.0f} s for {', '.join(strategies)}.",
        "Peak in-flight is set by the connections the stopped server's kernel queued (backlog 256) plus "
        "those arriving as it resumes: the same flood for every strategy, since each sends at least a first "
        "attempt per request; what differs is whether the flood is fed by retries afterwards.",
        f"sidecar+tickets: the sidecar with upstream concurrency "
        f"{yaml.safe_dump(concurrency, default_flow_style=True).strip()}.",
    ]
    if kept:
        notes.append(
            f"Measured this time: {', '.join(strategies)} (figure: {figure.name}); the other columns and the "
            "figure are the previous full run's."
        )
    write("recovery", "Recovery after a crash (seed-crash)", columns, rows, notes, "recovery.png", started)


UNITS = {
    "recovery after the outage (median)": "s",
    "amplification during the outage": "x",
    "amplification 30 s after": "x",
}


def failed_after(rec, sc) -> str:  # noqa: ANN001
    """Client requests that failed from the second after the outage on, against all that ended then: what
    "recovered at once" means beside the 5-second goodput mean (which credits a strategy whose requests
    sent during the outage are answered when it ends)."""
    assert sc.outage is not None
    after = rec.seconds[int(sc.outage.end) + 1 :]
    failed = sum(x.failed for x in after)
    return f"{failed}/{failed + sum(x.ok for x in after)}"


def previous(strategies: tuple[str, ...]) -> dict[str, dict]:
    """The rows of the last result file, by metric, for the columns not measured now."""
    path = RESULTS / "recovery.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    out = {}
    for r in data.get("rows", []):
        out[r["metric"]] = {
            "values": {k: v for k, v in r.get("values", {}).items() if k not in strategies},
            "spread": {k: v for k, v in r.get("spread", {}).items() if k not in strategies},
        }
        if "met" in r:
            out[r["metric"]].update(goal=r.get("goal"), met=r["met"])
    return out


if __name__ == "__main__":
    main()
