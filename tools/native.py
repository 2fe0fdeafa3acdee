"""Compile the hot path with mypyc, in place, or remove what was compiled (``make install`` runs ``build``).

    python tools/native.py build    # compile when a source changed since the last build
    python tools/native.py clean    # remove the compiled modules: pure Python again
    python tools/native.py status

The modules are listed in ``sidecar/native.py``. ``SIDECAR_NATIVE=0`` asks for pure Python: ``build`` then
removes compiled modules, so that none can shadow a newer source. Without a C compiler or the Python headers
the build says so and leaves pure Python; a build that fails otherwise (a type error mypyc will not compile)
fails loudly.
"""

from __future__ import annotations

import os
import runpy
import shlex
import shutil
import subprocess
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE = runpy.run_path(str(ROOT / "sidecar" / "native.py"))
SOURCES = [ROOT / s for s in NATIVE["SOURCES"]]
SUFFIX = EXTENSION_SUFFIXES[0]
LOG = ROOT / "build" / "native.log"


def targets() -> list[Path]:
    group = ROOT / (NATIVE["GROUP"].replace(".", "/") + "__mypyc" + SUFFIX)
    return [group] + [s.with_suffix(SUFFIX) for s in SOURCES]


def compiled_files() -> list[Path]:
    """Every compiled module in the package (also ones left by an older list)."""
    return list((ROOT / "sidecar").rglob(f"*{SUFFIX}"))


def up_to_date() -> bool:
    outs = targets()
    if not all(p.exists() for p in outs):
        return False
    newest_input = max(
        p.stat().st_mtime for p in [*SOURCES, ROOT / "sidecar" / "native.py", ROOT / "setup.py"]
    )
    return min(p.stat().st_mtime for p in outs) >= newest_input


def clean() -> None:
    for p in compiled_files():
        p.unlink()


def missing_toolchain() -> str | None:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()  # setuptools reads CC too
    if not cc or shutil.which(cc[0]) is None:
        return f"no C compiler ({shlex.join(cc) or 'cc'})"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.exists():
        return f"no Python headers ({header}; Debian: apt-get install python3-dev)"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install 'mypy==2.4.1')"
    return None


def build() -> int:
    if os.environ.get("SIDECAR_NATIVE", "1") == "0":
        clean()
        print("native: SIDECAR_NATIVE=0, running pure Python")
        return 0
    if up_to_date():
        print("native: compiled modules are up to date")
        return 0
    why = missing_toolchain()
    if why is not None:
        clean()
        print(f"native: {why}; running pure Python (slower, otherwise the same)")
        return 0
    print(f"native: compiling {len(SOURCES)} modules with mypyc (about a minute)...", flush=True)
    LOG.parent.mkdir(exist_ok=True)
    with LOG.open("w") as log:
        done = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace"],
            cwd=ROOT,
            env={**os.environ, "SIDECAR_NATIVE": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0:
        clean()
        tail = LOG.read_text().splitlines()[-20:]
        print("\n".join(tail), file=sys.stderr)
        print(f"native: the mypyc build failed (full log: {LOG.relative_to(ROOT)})", file=sys.stderr)
        return 1
    for p in targets():
        p.touch()  # setuptools keeps an unchanged module's old mtime
    print("native: compiled")
    return 0


def status() -> int:
    outs = targets()
    have = [p for p in outs if p.exists()]
    if not have:
        print("native: pure Python")
    elif len(have) < len(outs):
        print(f"native: partly compiled ({len(have)} of {len(outs)}): run `python tools/native.py build`")
    else:
        print("native: compiled" + ("" if up_to_date() else ", but older than a source: rebuild"))
    return 0


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else "status"
    if cmd == "build":
        return build()
    if cmd == "clean":
        clean()
        print("native: removed the compiled modules")
        return 0
    if cmd == "status":
        return status()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
