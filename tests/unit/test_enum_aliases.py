"""The enum-alias convention of sidecar/native.py: only compiled modules alias enum members to ``Final``
names, and a module that aliases members of an enum reads that enum's members only through aliases."""

from __future__ import annotations

import ast
from pathlib import Path

from sidecar import native

ROOT = Path(__file__).resolve().parents[2]


def _aliases_and_reads(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Enums aliased at module level (``_X: Final = Enum.MEMBER``), and ``Enum.MEMBER`` reads in code."""
    aliased: set[str] = set()
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.annotation, ast.Name)
            and node.annotation.id == "Final"
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.attr.isupper()
            and node.value.value.id[:1].isupper()
        ):
            aliased.add(node.value.value.id)
    read: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in aliased
                    and node.attr.isupper()
                ):
                    read.add(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return aliased, read


def test_aliases_only_in_compiled_modules_and_used_throughout() -> None:
    compiled = {ROOT / s for s in native.SOURCES}
    problems = []
    for path in sorted((ROOT / "sidecar").rglob("*.py")):
        aliased, read = _aliases_and_reads(ast.parse(path.read_text()))
        rel = path.relative_to(ROOT)
        if aliased and path not in compiled:
            problems.append(f"{rel}: aliases {sorted(aliased)} but is not compiled")
        if read:
            problems.append(f"{rel}: has aliases of {sorted(aliased)} but reads {sorted(read)} directly")
    assert problems == []
