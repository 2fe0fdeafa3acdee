"""Make the image's venv hold what the sidecar runs, and not what it never loads (the Dockerfile runs it in
the builder stage, with the venv's own Python: ``/opt/sidecar/bin/python tools/slim_venv.py /opt/sidecar``).

Removed: tests shipped inside packages, type stubs (``*.pyi``, ``py.typed`` stays), the C and Cython sources
of compiled extensions (``*.c``, ``*.h``, ``*.pyx``, ``*.pxd``, ``*.pxi``), the long descriptions in the
distributions' ``METADATA`` (their READMEs; the headers stay), and the bytecode (``.pyc``) of every module the
sidecar does not import. Which modules it imports is found by doing it: a sidecar with every part of
``sidecar/parts.py`` in use (the three protocols, traces over both OTLP transports and the console,
admission, a fleet-wide budget and rate, a MongoDB upstream as a connection string with a login, every
compressor) is built, started and stopped in this process, the ``check`` and ``version`` commands' modules
are imported, and what ``sys.modules`` then holds keeps its bytecode. A module outside that set (``sidecar
simulate``, pydantic's v1 layer, pygments' lexers, ...) still imports: from its source, compiled in memory
each time (the image's file system is read-only), which costs that command a moment at start. Debug symbols
are stripped by the Dockerfile (``strip``), not here. (aiohttp, for ``sidecar demo``'s HTTP part and the
live simulation, is not installed at all: it is the ``demo`` extra.)

Prints what it removed and the venv's size before and after.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

SOURCES = {".pyi", ".c", ".h", ".cpp", ".pyx", ".pxd", ".pxi"}
TEST_DIRS = {"tests", "test"}


def size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def every_part_config() -> dict:
    """A config using every part, on ports the kernel picks; nothing needs to answer at its upstreams."""
    return {
        "admin": {"listen": "127.0.0.1:0"},
        "telemetry": {"traces": {"exporter": "otlp", "endpoint": "http://127.0.0.1:1"}},
        "fleet": {"redis": {"url": "redis://127.0.0.1:1/0", "timeout": "50ms"}},
        "admission": {
            "door": {"requests": {"rate": 100, "scope": "fleet"}, "connections": {"rate": 100}},
            "calls": {"requests": {"rate": 100}},
        },
        "upstreams": {
            "web": {
                "endpoints": ["127.0.0.1:1"],
                "retry_budget": {"scope": "fleet", "ratio": 0.2},
                "concurrency": {"mode": "probing"},
            },
            "rpc": {"endpoints": ["localhost:1"]},  # a name: the resolver (dnspython) is loaded
            # a connection string (pymongo's URI parser) with a login and every compressor
            "db": {"uri": "mongodb://u:p@127.0.0.1:1/?compressors=snappy,zlib,zstd"},
        },
        "listeners": [
            {
                "name": "web",
                "protocol": "http",
                "listen": "127.0.0.1:0",
                "upstream": "web",
                "admission": "door",
            },
            {
                "name": "rpc",
                "protocol": "grpc",
                "listen": "127.0.0.1:0",
                "upstream": "rpc",
                "admission": "calls",
            },
            {
                "name": "db",
                "protocol": "mongodb",
                "listen": "127.0.0.1:0",
                "upstream": "db",
                "admission": "door",
                "compressors": ["snappy", "zlib", "zstd"],
            },
        ],
    }


def import_what_the_sidecar_runs() -> None:
    import logging

    import uvloop

    logging.disable(logging.WARNING)  # its upstreams, Redis and trace collector are nowhere: nothing to say

    from sidecar import cli, entry, run_command  # noqa: F401 - the commands' own modules
    from sidecar.adapters.mongo.scram import ScramClient
    from sidecar.app import App, release_free_memory
    from sidecar.config import effective_yaml, load_dict
    from sidecar.telemetry import tracing

    config = load_dict(every_part_config(), {})
    effective_yaml(config)
    ScramClient("SCRAM-SHA-256", "u", "p")  # MongoDB authentication loads pymongo's SASLprep
    from sidecar.adapters.mongo import compression, seeds, wire  # noqa: F401 - seeds: mongodb+srv://

    message = wire.encode_msg(1, 0, 0, [(0, b"\x05\x00\x00\x00\x00")])
    for name in sorted(compression.ALL):  # each compressor's library: loaded with the first message it packs
        packed = compression.wrap(message, name)
        header = wire.parse_header(packed, 1 << 20)
        compression.unwrap(header, packed[wire.HEADER_SIZE :], 1 << 20, compression.ALL)

    async def start_and_stop() -> None:
        app = App(config)
        await app.start()
        await app.stop(0)

    uvloop.run(start_and_stop())
    release_free_memory()
    for protocol in ("grpc", "http"):
        tracing._otlp_exporter(protocol, "http://127.0.0.1:1").shutdown()
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: F401 - exporter: console


def main(venv: Path) -> int:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    if not site.is_relative_to(venv.resolve()):
        print(f"slim_venv: run it with the venv's own Python ({venv}/bin/python), not {sys.executable}")
        return 2
    before = size(venv)
    import_what_the_sidecar_runs()
    keep = {
        Path(m.__cached__).resolve() for m in list(sys.modules.values()) if getattr(m, "__cached__", None)
    }
    removed: dict[str, int] = {
        "tests": 0,
        "stubs and sources": 0,
        "bytecode never imported": 0,
        "long descriptions": 0,
    }
    for path in sorted(p for p in site.rglob("*") if p.is_dir() and p.name in TEST_DIRS):
        if path.exists() and (path.parent / "__init__.py").exists():  # a package's own tests
            removed["tests"] += size(path)
            _remove_tree(path)
    for path in [p for p in site.rglob("*") if p.is_file()]:
        if path.suffix in SOURCES:
            removed["stubs and sources"] += path.stat().st_size
            path.unlink()
        elif path.suffix == ".pyc" and path.resolve() not in keep:
            removed["bytecode never imported"] += path.stat().st_size
            path.unlink()
    for path in [p for p in site.rglob("__pycache__") if p.is_dir() and not any(p.iterdir())]:
        path.rmdir()
    for path in site.glob("*.dist-info/METADATA"):
        removed["long descriptions"] += _drop_long_description(path)
    after = size(venv)
    kept = sum(1 for p in keep if p.is_relative_to(site))
    print(
        f"slim_venv: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB; removed "
        + ", ".join(f"{what} {n / 1e6:.1f} MB" for what, n in removed.items())
        + f"; bytecode kept for the {kept} modules the sidecar imports"
    )
    return 0


def _drop_long_description(metadata: Path) -> int:
    """A distribution's ``METADATA`` without its long description (the project's README, the body after the
    headers' blank line): what ``importlib.metadata`` reads at run time (name, version, requirements) is in
    the headers; licences and entry points are files of their own, kept. Returns the bytes saved."""
    text = metadata.read_bytes()
    head, blank, body = text.partition(b"\n\n")
    if not blank or not body.strip():
        return 0
    metadata.write_bytes(head + b"\n")
    return len(text) - len(head) - 1


def _remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else sys.prefix)))
