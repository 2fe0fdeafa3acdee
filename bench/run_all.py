"""``make bench``: run every benchmark in bench/, then rebuild the results table in bench/README.md.

Benchmarks are the ``*.py`` files here other than this one and ``common.py``: the per-protocol overhead
benchmarks first (``*_overhead.py``, whichever exist), then the system benchmarks. Each writes
``bench/results/<name>.json``; a benchmark that fails is reported and the others still run. The table is
rebuilt from every result file present, in the common shape (see common.py) or any other JSON object
(shown as its scalar values, nested keys joined with dots).

    .venv/bin/python bench/run_all.py [NAME ...]     # names: recovery, amplification, http_overhead, ...
    .venv/bin/python bench/run_all.py --table-only   # only rebuild the table from bench/results/
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import fmt as number  # noqa: E402

RESULTS = HERE / "results"
README = HERE / "README.md"
BEGIN, END = "<!-- results:begin (bench/run_all.py writes this part) -->", "<!-- results:end -->"
SYSTEM = ["recovery", "amplification", "tail_at_scale", "goodput"]


def benchmarks() -> list[str]:
    names = sorted(p.stem for p in HERE.glob("*.py") if p.stem not in ("run_all", "common"))
    overhead = [n for n in names if n.endswith("_overhead")]
    system = [n for n in SYSTEM if n in names]
    return overhead + system + [n for n in names if n not in overhead and n not in system]


def run(names: list[str]) -> dict[str, tuple[int, float]]:
    outcomes = {}
    for name in names:
        print(f"\n===== {name}", flush=True)
        t0 = time.monotonic()
        code = subprocess.call([sys.executable, str(HERE / f"{name}.py")], cwd=HERE.parent)
        outcomes[name] = (code, time.monotonic() - t0)
        print(f"===== {name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {outcomes[name][1]:.0f} s")
    return outcomes


# -- the table ----------------------------------------------------------------------------------------
def fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return number(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v).replace("|", "\\|")


def common_shape(data: dict[str, Any]) -> bool:
    return isinstance(data.get("rows"), list) and isinstance(data.get("columns"), list)


def render_common(data: dict[str, Any]) -> list[str]:
    cols = data["columns"]
    has_goal = any("goal" in r for r in data["rows"])
    head = ["metric", *cols] + (["goal", "met"] if has_goal else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in data["rows"]:
        unit = f" ({r['unit']})" if r.get("unit") else ""
        cells = [f"{r['metric']}{unit}"]
        for c in cols:
            cell = fmt(r.get("values", {}).get(c))
            sp = r.get("spread", {}).get(c)
            cells.append(cell if not sp or sp == "-" else f"{cell} <sub>({sp})</sub>")
        if has_goal:
            cells += [fmt(r.get("goal")), "" if "met" not in r else ("✔" if r["met"] else "✘")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(data, dict) and {"median", "min", "max"} <= set(data):
        out.append((prefix, f"{fmt(data['median'])} <sub>({fmt(data['min'])}..{fmt(data['max'])})</sub>"))
    elif isinstance(data, dict):
        for k, v in data.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif not isinstance(data, list):
        out.append((prefix, data))
    return out


def render_other(data: dict[str, Any]) -> list[str]:
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {k} | {fmt(v)} |" for k, v in flatten(data) if k not in ("name", "title")]
    return lines


def section(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return [f"### {path.stem}", "", f"(unreadable: {e})", ""]
    if not isinstance(data, dict):
        return [f"### {path.stem}", "", "(not a JSON object)", ""]
    title = data.get("title") or path.stem
    m = data.get("machine") or {}
    cores = m.get("cores") if isinstance(m, dict) else None
    lines = [f"### {title}", "", f"`bench/results/{path.name}`" + (f", {cores} cores" if cores else "")]
    lines.append("")
    lines += render_common(data) if common_shape(data) else render_other(data)
    notes = data.get("notes") or []
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    if data.get("figure"):
        lines += ["", f"![{title}](results/{data['figure']})"]
    lines.append("")
    return lines


def order(paths: list[Path]) -> list[Path]:
    rank = {"recovery": 0, "amplification": 1, "throttle-tuning": 2, "tail-at-scale": 3}
    return sorted(paths, key=lambda p: (rank.get(p.stem, 10), p.stem))


def rebuild_table() -> None:
    body = []
    for path in order(list(RESULTS.glob("*.json"))):
        body += section(path)
    text = README.read_text() if README.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip() + f"\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + BEGIN + "\n\n" + "\n".join(body) + "\n" + END + tail)
    print(f"rebuilt the results table in {README.relative_to(HERE.parent)}")


def main() -> None:
    ap = argparse.ArgumentParser(description="Run the benchmarks and rebuild bench/README.md's table.")
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    failed = []
    if not args.table_only:
        names = args.names or benchmarks()
        unknown = [n for n in names if not (HERE / f"{n}.py").exists()]
        if unknown:
            sys.exit(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(benchmarks())})")
        outcomes = run(names)
        failed = [n for n, (code, _) in outcomes.items() if code != 0]
        print(
            "\n"
            + "\n".join(
                f"{n:<20} {'ok' if c == 0 else 'FAILED'} {t:6.0f} s" for n, (c, t) in outcomes.items()
            )
        )
    rebuild_table()
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
