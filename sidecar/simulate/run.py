"""Run a scenario's strategies on one engine and put the report together."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

from .record import Record
from .report import Report, result
from .scenario import STRATEGIES, Scenario

ENGINES = ("des", "live")


class LiveUnavailable(RuntimeError):
    """The live engine's library is not installed (the image leaves it out)."""


def run_one(scenario: Scenario, engine: str, strategy: str) -> Record:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (strategies: {', '.join(STRATEGIES)})")
    if engine == "des":
        from . import des

        return des.run(scenario, strategy)
    if engine == "live":
        if importlib.util.find_spec("aiohttp") is None:  # the model server's and clients' processes import it
            raise LiveUnavailable(
                "the live engine needs aiohttp (its model server and clients), which this installation leaves "
                "out: pip install 'retry-sidecar[demo]', or run it from a checkout (make install); the des "
                "engine needs nothing more"
            )
        from .live import engine as live

        return live.run(scenario, strategy)
    raise ValueError(f"unknown engine {engine!r} (engines: {', '.join(ENGINES)})")


def run(
    scenario: Scenario,
    engine: str,
    strategies: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Each strategy in turn (never two at once: on the live engine they would share the cores)."""
    results = []
    for strategy in strategies or scenario.strategies:
        if progress is not None:
            progress(
                f"running {strategy} on the {engine} engine ({scenario.duration:.0f} s of scenario time)"
            )
        results.append(result(strategy, run_one(scenario, engine, strategy), scenario))
    return Report(scenario, engine, results)
