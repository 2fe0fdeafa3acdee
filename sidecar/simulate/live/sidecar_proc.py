"""The sidecar as a process: the real :class:`sidecar.app.App` with its HTTP listener, configured for the
scenario (``policy.config_dict``), on uvloop when installed, as ``sidecar run`` would be.

It counts the attempts it sends upstream, per second of the run, from its own attempt spans (span kind
CLIENT, by start time) through an exporter handed to ``App``: the public telemetry hook, so nothing in
the request path is changed for the measurement.

Run by the live engine: ``python -m sidecar.simulate.live.sidecar_proc`` (settings on stdin).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from ...app import App
from ...config import load_dict
from ..record import Record
from .wire import clock, hear, run, say


class AttemptCounter(SpanExporter):
    """Bins attempt spans by their start, on the engine's clock (spans carry wall-clock nanoseconds)."""

    def __init__(self, rec: Record) -> None:
        self.rec = rec
        self.epoch = 0.0
        self.wall_minus_clock = time.time() - clock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            if span.kind is SpanKind.CLIENT and span.start_time is not None:
                started = span.start_time / 1e9 - self.wall_minus_clock
                self.rec.attempt(started - self.epoch)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


async def serve(settings: dict[str, Any]) -> None:
    rec = Record(float(settings["duration"]))
    counter = AttemptCounter(rec)
    async with App(load_dict(settings["config"], {}), span_exporter=counter) as app:
        host, port = app.address(settings["listener"])
        say(ready={"host": host, "port": port})
        counter.epoch = float((await hear())["epoch"])
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
    say(record=rec.to_json())


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="sidecar: %(levelname)s %(name)s: %(message)s")

    async def go() -> None:
        await serve(await hear())

    run(go)


if __name__ == "__main__":
    main()
