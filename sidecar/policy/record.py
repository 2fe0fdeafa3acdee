"""Value records for what crosses the engine's boundary (commands, events).

A record's fields are set once, in ``__init__``, and declared ``Final``, so mypy rejects any later assignment:
immutable without the runtime cost of a frozen dataclass (about 1 us to build) or a ``NamedTuple`` (an
interpreted constructor, which compiled code cannot inline). Records compare equal field by field, hash the
same way and print as ``Name(field=value, ...)``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class Record:
    #: The field names, in the constructor's order.
    fields: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self.fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.fields)
        return f"{type(self).__name__}({inner})"
