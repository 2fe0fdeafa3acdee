"""``sidecar simulate``: options in, report out. The typer command in ``sidecar/cli.py`` only calls this."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from . import scenario as scenarios
from .report import render
from .run import ENGINES, run
from .scenario import STRATEGIES, ScenarioError


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["clients.rate=200", "outage.mode=error"]`` -> nested overrides (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError([("", f"--set {item!r}: expected KEY.PATH=VALUE")])
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ScenarioError([("", f"--set {item!r}: {p} is set twice")])
        node[parts[-1]] = yaml.safe_load(value)
    return out


def main(
    scenario: str,
    engine: str = "des",
    strategies: list[str] | None = None,
    duration: float | None = None,
    plot: Path | None = None,
    as_json: bool = False,
    sets: list[str] | None = None,
    table: bool = True,
    out: Callable[[str], None] = print,
    err: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> int:
    """Returns the exit code: 0, or 2 for a bad scenario or option."""
    wanted = [s.strip() for item in strategies or [] for s in item.split(",") if s.strip()]
    bad = [s for s in wanted if s not in STRATEGIES]
    if bad or engine not in ENGINES:
        if bad:
            err(f"sidecar simulate: unknown strategy {', '.join(bad)} (strategies: {', '.join(STRATEGIES)})")
        else:
            err(f"sidecar simulate: unknown engine {engine!r} (engines: {', '.join(ENGINES)})")
        return 2
    try:
        overrides = parse_sets(sets or [])
        if duration is not None:
            overrides["duration"] = f"{duration}s"
        sc = scenarios.load(scenario, overrides)
        report = run(sc, engine, wanted or None, progress=err)
    except ScenarioError as e:
        err(str(e))
        return 2
    except RuntimeError as e:  # the live engine could not run (LiveError): say what, not a traceback
        err(f"sidecar simulate: {e}")
        return 1
    for line in render(report, with_tables=table):
        out(line)
    if plot is not None:
        from .plot import PlotUnavailable, save

        try:
            out(f"plot: {save(report, plot)}")
        except PlotUnavailable as e:
            err(f"sidecar simulate: {e}")
            return 2
    if as_json:
        out(json.dumps(report.to_json(), sort_keys=False))
    return 0
