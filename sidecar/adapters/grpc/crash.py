"""When grpc.aio's own server loop dies: notice it at once and name the cause, once.

grpcio (1.85.1) runs each ``grpc.aio`` server as one asyncio task that takes every new call from the C core.
An exception in that task (one is known: a HEADERS frame whose ``:path`` is not UTF-8 raises
``UnicodeDecodeError`` there, before any handler of ours runs; docs/grpc.md) shuts the server down: its
listening socket closes, calls in progress go on to their end, and nothing tells the application. grpcio
offers no callback for it; what it does do, at once and in the loop's thread, is log the exception on its
``grpc._cython.cygrpc`` logger and flip its server's ``is_running()`` to False. :meth:`GrpcioLog.died`
waits on both (the log record wakes it, a short poll backs it up), and the filter keeps grpcio's own
reports of the crash (its log line and asyncio's "Task exception was never retrieved" traceback for its
shutdown task) out of the log: the listener logs the cause itself, once, with what it did about it.

The same filter shortens two more grpcio reports of things it handled, to one line without the traceback
(so that a client's bad input is one line in the log, as every other bad input is): a metadata value that is
not UTF-8, which grpcio decodes as latin-1 ("Invalid encoding on ..."), and a call's final status that
could not be sent because the client's stream was already gone ("ExecuteBatchError raised in core by
servicer method ...": grpcio ignores that case only when it noticed the client leave first).

The process has one grpcio logger, so it has one :class:`GrpcioLog`: it lives on that logger (its filter),
and :meth:`GrpcioLog.installed` finds it there; nothing of it is held at module level.

**What grpcio gives no public way to do, in this one place** (the rest of the adapter uses grpcio's public
API only; check these when grpcio is upgraded, ``tests/integration/grpc/test_unkillable.py`` exercises all
three):

- whether a ``grpc.aio.Server`` still serves: its Cython server's ``is_running()``, reached through the
  private attribute ``Server._server`` (:func:`serving`);
- which task died: the frame name of grpcio's accept loop, ``_server_main_loop``, in the exception's
  traceback (``_LOOP_FRAME``);
- where grpcio reports it, and the texts of its reports of what it handled: its logger's name and the
  messages' beginnings (``_GRPC_LOGGER``, ``_HANDLED``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import grpc

#: How often a server's state is checked besides the wake-up by grpcio's log record.
POLL = 0.05
_GRPC_LOGGER = "grpc._cython.cygrpc"
_LOOP_FRAME = "_server_main_loop"
_HANDLED = ("Invalid encoding on ", "ExecuteBatchError raised in core by servicer method")


def serving(server: grpc.aio.Server) -> bool:
    """Does ``server`` still serve (grpcio's server object says so; no public accessor)?"""
    inner = getattr(server, "_server", None)  # the Cython AioServer: is_running() is its public method
    return bool(inner.is_running()) if inner is not None else True


def _from_grpc_loop(exc: BaseException | None) -> bool:
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == _LOOP_FRAME:
            return True
        tb = tb.tb_next
    return False


class GrpcioLog(logging.Filter):
    """grpcio's log, watched: drops its reports of its server loop's death (the listener reports it), keeps
    the latest causes and wakes the listeners waiting in :meth:`died`; shortens the reports of what it
    handled."""

    def __init__(self) -> None:
        super().__init__()
        self.causes: deque[BaseException] = deque(maxlen=4)  # the latest crash causes, newest last
        self.waiters: set[asyncio.Future[None]] = set()

    @classmethod
    def installed(cls) -> GrpcioLog:
        """The process's one filter, installed on grpcio's logger and asyncio's the first time."""
        grpc_log = logging.getLogger(_GRPC_LOGGER)
        for f in grpc_log.filters:
            if isinstance(f, cls):
                return f
        f = cls()
        grpc_log.addFilter(f)
        logging.getLogger("asyncio").addFilter(f)
        return f

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
            self.causes.append(exc)
            for fut in list(self.waiters):
                if not fut.done():
                    fut.get_loop().call_soon(_wake, fut)
        return False

    async def died(self, server: grpc.aio.Server) -> str:
        """Returns when ``server`` stopped serving without being asked to (its loop died), with the cause."""
        loop = asyncio.get_running_loop()
        while serving(server):
            fut: asyncio.Future[None] = loop.create_future()
            self.waiters.add(fut)
            try:
                await asyncio.wait((fut,), timeout=POLL)
            finally:
                self.waiters.discard(fut)
        cause = self.causes.pop() if self.causes else None
        return f"{type(cause).__name__}: {cause}" if cause is not None else "grpcio's server loop ended"


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
