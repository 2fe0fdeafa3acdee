"""Fuzz the three wire formats through ``sidecar run`` (sidecar/testing/fuzz): 100,000 inputs per format by
default (``--count``), with the same assertion as tests/fuzz: the sidecar lives, a good client on another
connection never fails, and no traceback appears in the sidecar's log. A failure names the seed and the
indices to rebuild the inputs with (``sidecar.testing.fuzz.inputs.<format>(seed, index)``).

    .venv/bin/python bench/fuzz.py                   # 100,000 each (several minutes)
    .venv/bin/python bench/fuzz.py --count 20000 --formats grpc --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from common import machine, row, show, write

from sidecar.testing.fuzz.inputs import FORMATS
from sidecar.testing.fuzz.run import Report, fuzz_format, running


def _progress(r: Report) -> None:
    if r.sent % 10_000 == 0:
        print(
            f"  {r.format}: {r.sent:,} sent, {r.good} good checks, {len(r.failures)} failure(s)", flush=True
        )


async def main(args: argparse.Namespace) -> int:
    started = machine()
    reports: list[Report] = []
    for fmt in args.formats:
        async with running([fmt]) as (sidecar, clients):
            report = await fuzz_format(sidecar, clients, fmt, args.count, args.seed, progress=_progress)
        reports.append(report)
        print(
            f"{fmt}: {report.sent:,} inputs in {report.seconds:.1f}s, {report.good} good checks passed, "
            f"{report.grpcio_defect} cancelled by the grpcio defect, {len(report.failures)} failure(s)"
        )
        for failure in report.failures:
            print("  " + failure)
    columns = [r.format for r in reports]
    rows = [
        row("inputs sent", "", {r.format: r.sent for r in reports}),
        row(
            "inputs per second",
            "/s",
            {r.format: round(r.sent / r.seconds) if r.seconds else None for r in reports},
        ),
        row("good-client checks passed", "", {r.format: r.good for r in reports}),
        row(
            "good calls cancelled by grpcio's loop death (docs/grpc.md)",
            "",
            {r.format: r.grpcio_defect for r in reports},
        ),
        row(
            "failures (exit, good client error, traceback)",
            "",
            {r.format: len(r.failures) for r in reports},
            goal="0",
            met=all(not r.failures for r in reports),
        ),
    ]
    show(columns, rows)
    notes = [f"seed {args.seed}, {args.count:,} inputs per format, 8 connections at a time"]
    notes += [f"{r.format}: {f}" for r in reports for f in r.failures]
    write("fuzz", "Fuzzing the three wire formats through sidecar run", columns, rows, notes, None, started)
    return 1 if any(r.failures for r in reports) else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=100_000, help="inputs per format")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    sys.exit(asyncio.run(main(p.parse_args())))
