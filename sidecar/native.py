"""Which modules are compiled with mypyc, and whether this process runs them compiled.

The request hot path (the policy engine, the runtime that drives it, telemetry counters, the HTTP adapter)
is compiled to C with mypyc by ``make install`` (``tools/native.py``): the same source, run about a third
faster. Everything works without it (``SIDECAR_NATIVE=0``, or no C compiler): a module that was not
compiled is imported as plain Python.

Writing code in these modules (the tests run them compiled under ``make test``):

- annotations are checked at run time: a value that contradicts its annotation raises ``TypeError``. Read a
  third-party value whose stubs are wrong through ``Any`` (uvloop's ``Server.sockets`` is a list, an
  ``httptools`` URL's port may be ``None``);
- mypy keeps an attribute narrowed across method calls (``if self.x is None: return`` ... call ...
  ``if self.x is not None`` is "unreachable" to it, and compiled code believes it): carry such facts in a
  return value;
- a dataclass or ``NamedTuple`` keeps an interpreted constructor: for objects made per request use a plain
  class with ``__slots__``, or ``policy.record.Record``;
- a compiled class cannot be subclassed by interpreted code (tests wrap one instead), unless it is marked
  ``@mypyc_attr(allow_interpreted_subclasses=True)``: the interfaces adapters and tests implement
  (``runtime.CallbackAttempter``, ``CallObserver``, ``CallOwner``, ``policy.EndpointPicker``, the HTTP
  client's ``Exchange``) are such base classes, not Protocols, because a call through a Protocol-typed
  attribute is a generic method lookup while a call through a native base class is direct;
- what the code reads on every request should not be a lookup: a module-level name is a dictionary
  lookup unless it is ``Final`` (then a C static); ``Enum.MEMBER``, ``module.function`` and
  ``dict.pop`` are attribute or method lookups each time; ``isinstance`` narrows a union so its fields are
  read from the struct, where ``type(x) is C`` leaves it ``Any``. A ``Final`` used as a default argument
  is left unset by mypyc 2.4 (``NameError`` at run time): ``telemetry.metrics.LATENCY_BUCKETS`` stays
  plain;
- **enum members, the one convention** (``tests/unit/test_enum_aliases.py`` checks it): a compiled module
  whose code reads enum members on every request's path aliases them to ``Final`` names under its
  imports (``_DEADLINE: Final = Reason.DEADLINE``) and then reads *every* member of that enum through an
  alias, never ``Reason.X`` in one line and ``_X`` in the next (``policy/engine.py``,
  ``telemetry/observer.py``, ``upstream/outlier.py``, ``adapters/http/request.py``). Modules that read
  members only off that path (errors, config, the sidecar's own answers), and every interpreted module,
  read ``Enum.MEMBER`` and define no aliases. A state machine on the hot path keeps its state as an int
  compared with ``Final`` int literals, named by an ``IntEnum`` (``adapters/http/connection.State``,
  ``upstream.State``): an identity check against an alias still reads a module static;
- measure a change with ``bench/http_instructions.py`` (callgrind, instructions per request: exact to the
  per cent) before ``bench/http_overhead.py`` (time: noisy on a shared machine).

This file is read by ``setup.py`` without importing the package: keep it free of imports.
"""

#: Compiled as one group (calls between them are direct C calls). Paths from the repository root. No package
#: ``__init__``: with ``sidecar/policy/__init__`` compiled, ``sidecar run`` failed to import its submodules.
SOURCES = (
    "sidecar/policy/backoff.py",
    "sidecar/policy/commands.py",
    "sidecar/policy/deadline.py",
    "sidecar/policy/engine.py",
    "sidecar/policy/events.py",
    "sidecar/policy/outcome.py",
    "sidecar/policy/reasons.py",
    "sidecar/policy/record.py",
    "sidecar/policy/spec.py",
    "sidecar/policy/throttle.py",
    "sidecar/upstream/balancer.py",
    "sidecar/upstream/outlier.py",
    "sidecar/admission/bucket.py",
    "sidecar/gates/door.py",
    "sidecar/admit.py",
    "sidecar/runtime.py",
    "sidecar/timers.py",
    "sidecar/services.py",
    "sidecar/telemetry/metrics.py",
    "sidecar/telemetry/observer.py",
    "sidecar/telemetry/tap.py",
    "sidecar/adapters/connections.py",
    "sidecar/adapters/replay.py",
    "sidecar/adapters/http/answer.py",
    "sidecar/adapters/http/attempt.py",
    "sidecar/adapters/http/classify.py",
    "sidecar/adapters/http/connection.py",
    "sidecar/adapters/http/headers.py",
    "sidecar/adapters/http/plan.py",
    "sidecar/adapters/http/pushback.py",
    "sidecar/adapters/http/replay.py",
    "sidecar/adapters/http/request.py",
    "sidecar/adapters/http/routing.py",
    "sidecar/adapters/http/server.py",
    "sidecar/adapters/http/upstream.py",
)

#: The group's shared library, a module inside the package (so an editable install finds it).
GROUP = "sidecar.native"


def compiled() -> bool:
    """Does this process run the compiled hot path?"""
    from importlib.machinery import EXTENSION_SUFFIXES

    from .policy import engine

    return (engine.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))


def stale() -> list[str]:
    """Sources edited after they were compiled: their compiled module, not the source, is what runs."""
    import os
    from importlib.machinery import EXTENSION_SUFFIXES

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for src in SOURCES:
        path = os.path.join(root, src)
        so = path[:-3] + EXTENSION_SUFFIXES[0]
        if os.path.exists(so) and os.path.getmtime(path) > os.path.getmtime(so):
            out.append(src)
    return out
