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
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from .config import ConfigError, load_file
from .config.effective import redactor
from .log_redaction import install as redact_logs

HELP = "Run the sidecar until SIGTERM/SIGINT; SIGHUP or a change of the config file reloads it."


class _Help(argparse.HelpFormatter):
    """argparse's formatter, told the terminal's width here: its own asks ``shutil``, whose import (with bz2
    and lzma) would then stay in the pod's memory for good, ~0.5 MB (issue 27). The width as shutil finds it:
    ``COLUMNS``, else the terminal's, else 80."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)  # argparse's own margin


def _columns() -> int:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sidecar run", description=HELP, formatter_class=_Help)
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
    from .app import serve

    try:
        run_loop(serve(cfg, args.config, args.watch_interval), args.uvloop)
    except OSError as e:
        print(f"sidecar: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


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
