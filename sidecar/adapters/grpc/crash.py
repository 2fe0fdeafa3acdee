"""When grpc.aio's own server loop dies: notice it at once and name the cause, once.

grpcio (1.85.1) runs each ``grpc.aio`` server as one asyncio task that takes every new call from the C core.
An exception in that task (one is known: a HEADERS frame whose ``:path`` is not UTF-8 raises
``UnicodeDecodeError`` there, before any handler of ours runs; docs/grpc.md) shuts the server down: its
listening socket closes, calls in progress go on to their end, and nothing tells the application. grpcio
offers no callback for it; what it does do, at once and in the loop's thread, is log the exception on its
``grpc._cython.cygrpc`` logger and flip ``is_running()`` to False. :func:`died` waits on both (the log
record wakes it, a short poll backs it up), and the filter installed by :func:`watch_logs` keeps grpcio's
own reports of the crash (its log line and asyncio's "Task exception was never retrieved" traceback for
its shutdown task) out of the log: the listener logs the cause itself, once, with what it did about it.

The same filter shortens two more grpcio reports of things it handled, to one line without the traceback
(so that a client's bad input is one line in the log, as every other bad input is): a metadata value that is
not UTF-8, which grpcio decodes as latin-1 ("Invalid encoding on ..."), and a call's final status that
could not be sent because the client's stream was already gone ("ExecuteBatchError raised in core by
servicer method ...": grpcio ignores that case only when it noticed the client leave first).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

#: How often a server's state is checked besides the wake-up by grpcio's log record.
POLL = 0.05
_GRPC_LOGGER = "grpc._cython.cygrpc"
_HANDLED = ("Invalid encoding on ", "ExecuteBatchError raised in core by servicer method")
_causes: list[BaseException] = []  # the latest crash causes grpcio reported, newest last (a few at most)
_waiters: set[asyncio.Future[None]] = set()
_installed = False


def _from_grpc_loop(exc: BaseException | None) -> bool:
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_server_main_loop":
            return True
        tb = tb.tb_next
    return False


class _CrashReports(logging.Filter):
    """Drops grpcio's reports of its server loop's death (the listener reports it) and wakes the watchers."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == _GRPC_LOGGER and isinstance(record.msg, str) and record.msg.startswith(_HANDLED):
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        exc: Any = record.msg if isinstance(record.msg, BaseException) else None
        if exc is None and record.exc_info:
            exc = record.exc_info[1]
        if not _from_grpc_loop(exc):
            return True
        if record.name == _GRPC_LOGGER:  # the first report: the crash handler's, at once
            _causes.append(exc)
            del _causes[:-4]
            for fut in list(_waiters):
                if not fut.done():
                    fut.get_loop().call_soon(_wake, fut)
        return False


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def watch_logs() -> None:
    """Install the filter (once per process) on grpcio's logger and on asyncio's."""
    global _installed
    if _installed:
        return
    _installed = True
    f = _CrashReports()
    logging.getLogger(_GRPC_LOGGER).addFilter(f)
    logging.getLogger("asyncio").addFilter(f)


def _running(server: grpc.aio.Server) -> bool:
    inner = getattr(server, "_server", None)  # the Cython AioServer: is_running() is its public method
    return bool(inner.is_running()) if inner is not None else True


async def died(server: grpc.aio.Server) -> str:
    """Returns when ``server`` stopped serving without being asked to (its loop died), with the cause."""
    loop = asyncio.get_running_loop()
    while _running(server):
        fut: asyncio.Future[None] = loop.create_future()
        _waiters.add(fut)
        try:
            await asyncio.wait((fut,), timeout=POLL)
        finally:
            _waiters.discard(fut)
    cause = _causes.pop() if _causes else None
    return f"{type(cause).__name__}: {cause}" if cause is not None else "grpcio's server loop ended"
