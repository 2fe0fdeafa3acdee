"""Run a MongoDB test server: ``python -m sidecar.testing.mongo --port 27017 --role mongos``.

Prints ``listening on HOST:PORT`` once it accepts connections; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from .server import ROLES, MongoTestServer


async def _main(args: argparse.Namespace) -> None:
    server = MongoTestServer(
        args.role, host=args.host, port=args.port, set_name=args.set_name, record=args.record
    )
    for spec in args.user or ():
        name, _, password = spec.partition(":")
        server.add_user(name, password)
    await server.start()
    print(f"listening on {server.endpoint}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sidecar.testing.mongo", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=27017)
    p.add_argument("--role", choices=ROLES, default="mongos")
    p.add_argument("--set-name", default=None)
    p.add_argument("--no-uvloop", action="store_true")
    p.add_argument("--record", action="store_true", help="keep a log of every command (grows without bound)")
    p.add_argument(
        "--user", action="append", metavar="NAME:PASSWORD", help="a user who must log in (repeatable)"
    )
    args = p.parse_args()
    if not args.no_uvloop:
        try:
            import uvloop

            uvloop.run(_main(args))
            return
        except ImportError:
            pass
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
