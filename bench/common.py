"""What every benchmark shares: the machine it ran on, the result file, medians.

A result is ``bench/results/<name>.json`` in one shape, which ``run_all.py`` turns into the table in
bench/README.md::

    {"name": "recovery", "title": "...", "machine": {"cores": 2, ...},
     "columns": ["fixed", "backoff", "sidecar"],            # what is compared, baseline first
     "rows": [{"metric": "...", "unit": "s", "values": {"fixed": 1.0, ...},
               "goal": "sidecar <= 5", "met": true}],      # goal/met optional
     "notes": ["..."], "figure": "recovery.png"}
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Wait until something listens on ``port``; fail with ``proc``'s last words if it exits first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"{proc.args} exited: {err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def machine() -> dict[str, Any]:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "cores": os.cpu_count() or 1,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_at_start": None if load is None else round(load, 2),
    }


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def spread(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    return f"{fmt(min(present))}..{fmt(max(present))}"


def row(
    metric: str,
    unit: str,
    values: dict[str, Any],
    goal: str | None = None,
    met: bool | None = None,
    spread: dict[str, str] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"metric": metric, "unit": unit, "values": values}
    if spread:
        out["spread"] = spread
    if goal is not None:
        out["goal"] = goal
        out["met"] = met
    return out


def write(
    name: str,
    title: str,
    columns: list[str],
    rows: list[dict[str, Any]],
    notes: list[str],
    figure: str | None,
    started: dict[str, Any],
) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "name": name,
        "title": title,
        "machine": started,
        "columns": columns,
        "rows": rows,
        "notes": notes,
        "figure": figure,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    root = RESULTS.parent.parent
    print(f"wrote {path.relative_to(root) if path.is_relative_to(root) else path}")  # --out may be a path
    return path


def show(columns: list[str], rows: list[dict[str, Any]]) -> None:
    """Print the rows as a table."""
    head = f"{'metric':<46}" + "".join(f"{c:>16}" for c in columns) + "  goal"
    print(head)
    for r in rows:
        cells = "".join(f"{fmt(r['values'].get(c)):>16}" for c in columns)
        goal = r.get("goal")
        verdict = "" if goal is None else f"  {goal}: {'met' if r.get('met') else 'NOT met'}"
        print(f"{r['metric'] + (' (' + r['unit'] + ')' if r['unit'] else ''):<46}{cells}{verdict}")


def fmt(v: Any) -> str:
    """Numbers people read: 26,856 and 1.053 rather than 2.686e+04 and 1.0527."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, float) and v.is_integer() and abs(v) >= 100:
        return fmt(int(v))
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.4g}"
    return str(v)


def say(msg: str) -> None:
    print(msg, flush=True)
    sys.stdout.flush()


# -- an OTLP trace receiver --------------------------------------------------------------------------
OTLP_TRACES = "opentelemetry.proto.collector.trace.v1.TraceService"


class OtlpReceiver:
    """A tiny OTLP/gRPC trace receiver on ``grpc.aio`` (127.0.0.1, a free port): every export is answered
    as accepted (an empty ``ExportTraceServiceResponse``); ``exports`` counts the export calls and, with
    ``count_spans``, ``spans`` the spans in them (decoded with opentelemetry-proto)."""

    def __init__(self, count_spans: bool = False) -> None:
        self.count_spans = count_spans
        self.exports = 0
        self.spans = 0
        self.port = 0
        self._server: Any = None

    def _export(self, request: bytes, context: Any) -> bytes:
        self.exports += 1
        if self.count_spans:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

            req = ExportTraceServiceRequest.FromString(request)
            self.spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        return b""

    async def start(self) -> int:
        import grpc

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    OTLP_TRACES, {"Export": grpc.unary_unary_rpc_method_handler(self._export)}
                ),
            )
        )
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
