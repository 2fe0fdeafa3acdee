"""The JSON-lines exchange between the live engine and its processes, and the shared clock."""

from __future__ import annotations

import asyncio
import gc
import json
import resource
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any


def clock() -> float:
    """The clock every process measures on: monotonic and system-wide (Linux CLOCK_MONOTONIC)."""
    return time.monotonic()


def say(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def hear() -> dict[str, Any]:
    """The next line from the engine (stdin), read without blocking the loop."""
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if not line:
        raise SystemExit(0)  # the engine went away
    return json.loads(line)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a process's main coroutine on uvloop (as ``sidecar run`` does), with the garbage collector's
    start-up objects frozen: a full collection among thousands of connections would stall the loop."""
    raise_fd_limit()
    gc.freeze()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is pinned on Linux
        asyncio.run(main())
    else:
        uvloop.run(main())


def raise_fd_limit() -> int:
    """Thousands of connections are the point of the exercise: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard
