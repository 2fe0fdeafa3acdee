"""tools/native.py and sidecar/native.py: what is compiled, and when the build falls back to pure Python."""

import runpy
from pathlib import Path

from sidecar import native

ROOT = Path(__file__).resolve().parents[2]


def build_tool() -> dict:
    return runpy.run_path(str(ROOT / "tools" / "native.py"))


def test_without_a_c_compiler_the_build_says_so_and_falls_back(monkeypatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    why = build_tool()["missing_toolchain"]()
    assert why is not None and why.startswith("no C compiler (/nonexistent/cc)")


def test_every_listed_source_exists_and_none_is_a_package_init() -> None:
    for src in native.SOURCES:
        assert (ROOT / src).is_file(), src
        assert not src.endswith("__init__.py"), src  # a compiled package __init__ broke submodule imports


def test_the_build_targets_are_one_compiled_module_per_source_and_the_group_library() -> None:
    targets = build_tool()["targets"]()
    assert len(targets) == len(native.SOURCES) + 1
    assert targets[0].parent == ROOT / "sidecar"  # inside the package: an editable install finds it
