"""Every engine record declares its fields once: ``fields`` must list the constructor's parameters, in order.

A field added to ``__init__`` but not to ``fields`` would silently drop out of ``__eq__``, ``__hash__`` and
``__repr__`` (``record.py``); read from the source, so it holds for the compiled build too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sidecar

ROOT = Path(sidecar.__file__).parent


def records() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "Record" for b in node.bases
            ):
                found.append((f"{path.relative_to(ROOT)}:{node.name}", node))
    return found


def test_there_are_records_to_check() -> None:
    names = {name.split(":")[1] for name, _ in records()}
    assert {
        "SendAttempt",
        "CancelAttempt",
        "Wake",
        "Decision",
        "Finish",
        "AttemptEnded",
        "Committed",
    } <= names


def test_each_records_fields_are_its_constructors_parameters_in_order() -> None:
    for name, cls in records():
        declared = init = None
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "fields" for t in stmt.targets
            ):
                declared = tuple(ast.literal_eval(stmt.value))
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                init = tuple(a.arg for a in stmt.args.args[1:] + stmt.args.kwonlyargs)
                assigned = {
                    t.attr
                    for s in ast.walk(stmt)
                    if isinstance(s, ast.AnnAssign | ast.Assign)
                    for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                    if isinstance(t, ast.Attribute)
                }
        assert declared is not None and init is not None, f"{name}: no fields or no __init__"
        assert declared == init, f"{name}: fields {declared} but __init__ takes {init}"
        assert set(declared) == assigned, f"{name}: __init__ sets {sorted(assigned)}, fields are {declared}"
