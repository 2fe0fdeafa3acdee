"""Follow one MongoDB command through the sidecar from its first byte, and count the walk
(docs/ARCHITECTURE.md, "A command's walk").

    .venv/bin/python tools/walk.py [--case find|refused|hello] [--all]

A test server runs in a thread of its own; the sidecar (an in-process ``App``) and a raw client run on this
thread's loop. After the client's handshake, a profiler (``sys.setprofile``, this thread only) records every
Python call into a ``sidecar/`` file while one command's bytes go in and its reply comes back. The rule:

* a **stay** begins when a call enters a file from another file (calls inside a file, returns, and a
  coroutine resumed after an ``await`` are not new stays);
* a call that returns without entering any other file (a codec such as ``wire.py``, a record's
  constructor, a pure decision such as ``classify_reply``, a getter) is **used in place**, as a library
  call would be: listed apart with the files that use it, not a stay;
* a **climb back up** is a stay in a file that is already on the call stack below the caller (a callee
  calling back into a caller's file);
* telemetry (``sidecar/telemetry/``) observes and is counted apart.

Modules compiled with mypyc make no Python frames, so the profiler cannot see them: the figures in
docs/ARCHITECTURE.md are from a pure Python build (``SIDECAR_NATIVE=0 make install``); compiled, the walk
looks shorter (the tool says so).

``--all`` prints every stay in order; ``--check`` exits 1 when a file is entered more than twice or a
stay climbs back up (``tests/integration/mongo/test_walk.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dis
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import bson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sidecar import native  # noqa: E402
from sidecar.adapters.mongo import wire  # noqa: E402
from sidecar.app import App  # noqa: E402
from sidecar.config import load_dict  # noqa: E402
from sidecar.testing.mongo.server import MongoTestServer  # noqa: E402

PKG = str(ROOT / "sidecar") + os.sep
SKIP = (PKG + "testing" + os.sep,)
OBSERVER = PKG + "telemetry" + os.sep


def short(path: str) -> str:
    return path[len(PKG) :] if path.startswith(PKG) else path


def ours(path: str) -> bool:
    return path.startswith(PKG) and not path.startswith(SKIP)


_RESUME: dict[Any, int] = {}


def _first_resume(code: Any) -> int:
    at = _RESUME.get(code)
    if at is None:
        at = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
        _RESUME[code] = at
    return at


class Walk:
    def __init__(self) -> None:
        # (file, function, caller file, climb, frame id, caller frame ids on the stack)
        self.calls: list[tuple[str, str, str | None, bool, int, frozenset[int]]] = []
        self.frames: list[FrameType] = []  # kept alive, so that an id is never reused while tracing

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not ours(path):
            return
        if frame.f_lasti > _first_resume(frame.f_code):  # a coroutine resumed: not a new call
            return
        self.frames.append(frame)
        caller = frame.f_back
        while caller is not None and not ours(caller.f_code.co_filename):
            caller = caller.f_back
        cfile = caller.f_code.co_filename if caller is not None else None
        stack: set[str] = set()
        above: set[int] = set()
        up = caller
        while up is not None:
            if ours(up.f_code.co_filename):
                above.add(id(up))
                if up is not caller:
                    stack.add(up.f_code.co_filename)
            up = up.f_back
        self.calls.append(
            (path, frame.f_code.co_name, cfile, path in stack and path != cfile, id(frame), frozenset(above))
        )

    def report(self, title: str, show_all: bool) -> bool:
        """Print the walk; whether it keeps the rule (no file entered more than twice, no climb)."""
        crossing = [c for c in self.calls if c[0] != c[2]]
        # a call under which no other file was entered is used in place
        entered_under: set[int] = set()
        for c in crossing:
            entered_under |= c[5]
        inplace = [c for c in crossing if c[4] not in entered_under]
        walk = [c[:4] for c in crossing if c[4] in entered_under and not c[0].startswith(OBSERVER)]
        per_file = collections.Counter(p for p, *_ in walk)
        climbs = [c for c in walk if c[3]]
        print(f"== {title}: {len(walk)} stays in {len(per_file)} files, {len(climbs)} climbs back up")
        if show_all:
            for path, fn, caller, climb in walk:
                mark = "  CLIMB" if climb else ""
                print(f"   {short(path):34} {fn:28} <- {short(caller) if caller else '(loop)'}{mark}")
        over = {short(p): n for p, n in per_file.items() if n > 2}
        print("   entered per file:", ", ".join(f"{short(p)} {n}" for p, n in per_file.items()))
        print("   files entered more than twice:", over or "none")
        for path, fn, caller, _ in climbs:
            print(f"   climb: {short(caller) if caller else '?'} -> {short(path)}:{fn}")
        kept = not over and not climbs
        used: dict[str, set[str]] = collections.defaultdict(set)
        for path, _fn, caller, *_ in inplace:
            if caller is not None and not path.startswith(OBSERVER):
                used[short(path)].add(short(caller))
        print("   used in place:", "; ".join(f"{t} (by {', '.join(sorted(b))})" for t, b in used.items()))
        return kept


def _op_msg(doc: dict[str, Any]) -> bytes:
    return wire.encode_body_msg(wire.next_request_id(), 0, bson.encode(doc))


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, msg: bytes) -> dict:
    writer.write(msg)
    head = await reader.readexactly(16)
    length = int.from_bytes(head[:4], "little")
    payload = await reader.readexactly(length - 16)
    return bson.decode(wire.parse_msg(payload, wire.parse_header(head, 1 << 30)).body)


def _server_thread() -> tuple[str, threading.Event]:
    ready: list[str] = []
    started, stop = threading.Event(), threading.Event()

    def run() -> None:
        async def main() -> None:
            server = MongoTestServer("mongos")
            await server.start()
            ready.append(server.endpoint)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await server.stop()

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    started.wait(10)
    return ready[0], stop


async def trace(case: str, endpoint: str, show_all: bool) -> bool:
    listener: dict[str, Any] = {"name": "m", "protocol": "mongodb", "listen": "127.0.0.1:0", "upstream": "db"}
    if case == "refused":
        listener["admission"] = "door"
    cfg: dict[str, Any] = {
        "admin": {"listen": None},
        "upstreams": {"db": {"endpoints": [endpoint]}},
        "listeners": [listener],
        "admission": {"door": {"requests": {"rate": 0.001, "burst": "1000s"}}},
    }
    async with App(load_dict(cfg, {})) as app:
        host, port = app.address("m")
        reader, writer = await asyncio.open_connection(host, port)
        await _roundtrip(reader, writer, _op_msg({"hello": 1, "$db": "admin"}))
        find = _op_msg({"find": "items", "filter": {}, "$db": "walk"})
        if case == "refused":  # spend the door's one token first
            await _roundtrip(reader, writer, find)
        msg = _op_msg({"hello": 1, "$db": "admin"}) if case == "hello" else find
        await _roundtrip(reader, writer, find if case != "hello" else msg)  # warm: pools, imports
        walk = Walk()
        sys.setprofile(walk.profile)
        try:
            reply = await _roundtrip(reader, writer, msg)
        finally:
            sys.setprofile(None)
        writer.close()
    return walk.report(f"{case} (reply ok={reply.get('ok')}, code={reply.get('code')})", show_all)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=("find", "refused", "hello"), action="append")
    p.add_argument("--all", action="store_true", help="print every stay in order")
    p.add_argument("--check", action="store_true", help="exit 1 unless every walk keeps the rule")
    args = p.parse_args()
    if native.compiled():
        print("(compiled modules are invisible to the profiler: their stays are missing below)")
    endpoint, stop = _server_thread()
    try:
        kept = [
            asyncio.run(trace(case, endpoint, args.all)) for case in args.case or ["find", "refused", "hello"]
        ]
    finally:
        stop.set()
    if args.check and not all(kept):
        sys.exit(1)


if __name__ == "__main__":
    main()
