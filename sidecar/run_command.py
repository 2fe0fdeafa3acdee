"""``sidecar run``: parse its options, load the config, serve until SIGTERM/SIGINT.

Parsed with argparse rather than through the CLI framework the other commands use (typer, ``cli.py``): this
is the command a pod runs for its whole life, and whatever parsed its arguments stays in memory as long
(typer and its click cost ~1.3 MB of RSS and ~30 ms of start; issue 27). ``entry.py`` sends ``sidecar run``
here without importing typer; ``sidecar --help`` lists it through ``cli.py``, which hands its arguments here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from .config import ConfigError, load_file
from .config.effective import redactor
from .log_redaction import install as redact_logs

HELP = "Run the sidecar until SIGTERM/SIGINT; SIGHUP or a change of the config file reloads it."


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sidecar run", description=HELP)
    p.add_argument("-c", "--config", type=Path, required=True, help="Configuration file (YAML).")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info).")
    p.add_argument(
        "--uvloop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Use uvloop when it is installed (default: yes).",
    )
    p.add_argument(
        "--watch-interval",
        type=float,
        default=1.0,
        help="Seconds between checks of the config file for a change to reload (0: reload on SIGHUP only; "
        "default: 1).",
    )
    return p


def main(argv: Sequence[str]) -> int:
    """The exit status: 0 after a drain, 2 for a configuration with errors, 1 when it cannot start."""
    args = parser().parse_args(list(argv))
    try:
        cfg = load_file(args.config)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    redact_logs(redactor(cfg))
    _import_prometheus_client()
    from .app import serve

    try:
        run_loop(serve(cfg, args.config, args.watch_interval), args.uvloop)
    except OSError as e:
        print(f"sidecar: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


def _import_prometheus_client() -> None:
    """prometheus_client without python-snappy: its exposition module imports snappy when installed, for
    push-gateway compression the sidecar never uses, and snappy's cramjam is ~3 MB of RSS (issue 27). pymongo
    imports snappy itself when a MongoDB listener or upstream uses that compressor."""
    hide = "snappy" not in sys.modules
    if hide:
        sys.modules["snappy"] = None  # type: ignore[assignment]  # import snappy: ImportError
    try:
        import prometheus_client  # noqa: F401
    finally:
        if hide:
            del sys.modules["snappy"]


def run_loop(coro: Coroutine[Any, Any, None], use_uvloop: bool) -> None:
    """Run ``coro`` on uvloop's event loop when asked and installed, else on asyncio's."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(coro)
            return
    asyncio.run(coro)
