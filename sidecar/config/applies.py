"""Where each setting applies: the one rule that no key is silently ignored.

An upstream's protocols are those of the listeners (and HTTP routes) that send to it; a policy's, those of
the listeners, routes and gRPC methods that name it (directly, or through a policy that ``extends`` it).

- A key written on an **upstream** must apply to every protocol that uses it: one upstream used by two
  protocols is an error unless every key it sets applies to both.
- A key written in a **policy** must apply to at least one protocol that uses it: a policy is retry
  behaviour shared by listeners of any protocol, each reading the keys of its own protocol, and a key that
  none of them reads is an error.

Two more of the same kind: the console's keys (``admin.console_allow``, ``console_hosts``) with the admin
port off (``admin.listen: null``), and a trace key the exporter does not read (``endpoint`` and
``protocol`` but with ``otlp``, ``sample_ratio`` with ``none``).

Only what the configuration writes counts (a preset's or a default's value is not "set"). Keys not listed
here apply to every protocol. A key that does not apply is a path-named error at ``sidecar check`` and at
start (and a reload), saying which listener uses the upstream or policy and why the key does nothing there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .env import join

HTTP, GRPC, MONGODB = "http", "grpc", "mongodb"

#: Upstream keys (``a.b``: a key inside a block) and the protocols they apply to, with why not elsewhere.
UPSTREAM: Mapping[str, tuple[frozenset[str], str]] = {
    "dns": (
        frozenset({HTTP, GRPC}),
        "a MongoDB upstream's members are resolved by each connection (as by a driver), not polled",
    ),
    "outlier_detection": (
        frozenset({HTTP, GRPC}),
        "a MongoDB upstream's members are taken out by its topology's monitoring, not by outlier detection",
    ),
    "max_connections": (
        frozenset({HTTP, MONGODB}),
        "a gRPC upstream is reached over one HTTP/2 channel per endpoint, whose streams grpcio multiplexes",
    ),
    "replica_set": (frozenset({MONGODB}), "only a MongoDB upstream has a replica set"),
    "uri": (
        frozenset({MONGODB}),
        "it is a MongoDB connection string (HTTP and gRPC upstreams list endpoints)",
    ),
    "compressors": (
        frozenset({MONGODB}),
        "it is MongoDB's wire compression (HTTP and gRPC bodies are passed on as the app encoded them)",
    ),
    "auth": (
        frozenset({MONGODB}),
        "only a MongoDB upstream is logged in to (HTTP and gRPC carry the app's own credentials)",
    ),
    "tls.insecure_skip_verify": (
        frozenset({HTTP, MONGODB}),
        "grpcio always verifies the server's certificate: give ca_file (and server_name) instead",
    ),
    "tls.min_version": (
        frozenset({HTTP}),
        "grpcio and the MongoDB adapter offer the TLS versions of their own defaults",
    ),
    "concurrency.read_methods": (
        frozenset({GRPC}),
        "it names gRPC methods (HTTP reads are GET/HEAD/OPTIONS; MongoDB reads are known by their command)",
    ),
}

#: Policy keys and the protocols whose adapters read them.
POLICY: Mapping[str, tuple[frozenset[str], str]] = {
    "retryable_status": (frozenset({HTTP}), "an HTTP status list"),
    "overload_status": (frozenset({HTTP}), "an HTTP status list"),
    "pushback_header": (frozenset({HTTP}), "an HTTP response header"),
    "retry_non_idempotent": (frozenset({HTTP}), "it names HTTP methods' idempotence"),
    "deadline.expired_status": (frozenset({HTTP}), "an HTTP status"),
    "deadline.header": (frozenset({HTTP, GRPC}), "MongoDB carries the deadline as maxTimeMS"),
    "replay_buffer": (frozenset({HTTP, GRPC}), "a MongoDB command is held whole (max_message_size)"),
    "retryable_codes": (frozenset({GRPC}), "a gRPC status list"),
    "overload_codes": (frozenset({GRPC}), "a gRPC status list"),
    "give_up_pushback": (frozenset({GRPC}), "a gRPC trailer"),
    "final_error_labels": (frozenset({MONGODB}), "MongoDB error labels"),
}


def misplaced(tree: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every upstream and policy key the configuration ``tree`` (as written, ``${...}`` expanded, before
    presets are spelled out) sets where it does nothing, as ``(path, message)``."""
    upstream_users, policy_users = _users(tree)
    errors: list[tuple[str, str]] = []
    upstreams = tree.get("upstreams")
    for name, up in upstreams.items() if isinstance(upstreams, dict) else ():
        users = upstream_users.get(name, {})
        if isinstance(up, dict) and users:
            errors.extend(_check(join("upstreams", name), up, users, UPSTREAM, every=True))
    policies = tree.get("policies")
    if isinstance(policies, dict):
        for name, users in _with_extended(policies, policy_users).items():
            pol = policies.get(name)
            if isinstance(pol, dict) and users:
                errors.extend(_check(join("policies", name), pol, users, POLICY, every=False))
    errors.extend(_admin(tree.get("admin")))
    telemetry = tree.get("telemetry")
    if isinstance(telemetry, dict):
        errors.extend(_traces(telemetry.get("traces")))
    return errors


#: Admin keys that are about the console, which is served on the admin port.
CONSOLE_KEYS = ("console_allow", "console_hosts")
#: Trace keys and the exporters they apply to, with why not elsewhere.
TRACES: Mapping[str, tuple[frozenset[str], str]] = {
    "endpoint": (frozenset({"otlp"}), "only the otlp exporter sends spans to an endpoint"),
    "protocol": (
        frozenset({"otlp"}),
        "it is the OTLP transport (grpc or http); only the otlp exporter has one",
    ),
    "sample_ratio": (frozenset({"otlp", "console"}), "with exporter none no span is made to sample"),
}


def _admin(admin: Any) -> Iterable[tuple[str, str]]:
    if isinstance(admin, dict) and "listen" in admin and admin["listen"] is None:
        for key in CONSOLE_KEYS:
            if key in admin:
                yield (
                    join("admin", key),
                    "does nothing while admin.listen is null: the console is served on the admin port, "
                    "which is off",
                )


def _traces(traces: Any) -> Iterable[tuple[str, str]]:
    if not isinstance(traces, dict):
        return
    exporter = traces.get("exporter", "none")
    for key, (exporters, why) in TRACES.items():
        if key in traces and isinstance(exporter, str) and exporter not in exporters:
            yield join("telemetry.traces", key), f"does nothing with exporter {exporter}: {why}"


def _check(
    base: str,
    block: Mapping[str, Any],
    users: Mapping[str, str],
    table: Mapping[str, tuple[frozenset[str], str]],
    every: bool,
) -> Iterable[tuple[str, str]]:
    """``users``: protocol -> the first place that uses the block with it (``listeners[2]``)."""
    for key, (applies, why) in table.items():
        head, _, sub = key.partition(".")
        value = block.get(head)
        if sub:
            value = value.get(sub) if isinstance(value, dict) else None
        if value is None:
            continue
        used = set(users)
        wrong = sorted(used - applies) if every else (sorted(used) if not used & applies else [])
        if wrong:
            where = " and ".join(f"{p} listeners ({users[p]})" for p in wrong)
            kind = "an upstream" if table is UPSTREAM else "a policy"
            yield (
                join(base, head) + (f".{sub}" if sub else ""),
                f"does nothing for {kind} used by {where}: {why}",
            )


def _users(tree: Mapping[str, Any]) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """Which protocols use each upstream and each policy, and where first."""
    upstreams: dict[str, dict[str, str]] = {}
    policies: dict[str, dict[str, str]] = {}

    def use(table: dict[str, dict[str, str]], name: Any, protocol: str, where: str) -> None:
        if isinstance(name, str):
            table.setdefault(name, {}).setdefault(protocol, where)

    listeners = tree.get("listeners")
    for i, lst in enumerate(listeners if isinstance(listeners, list) else []):
        if not isinstance(lst, dict) or lst.get("protocol") not in (HTTP, GRPC, MONGODB):
            continue
        protocol, where = lst["protocol"], f"listeners[{i}]"
        use(upstreams, lst.get("upstream"), protocol, where)
        use(policies, lst.get("policy"), protocol, where)
        routes = lst.get("routes")
        for j, route in enumerate(routes if isinstance(routes, list) else []):
            if isinstance(route, dict):
                use(upstreams, route.get("upstream"), protocol, f"{where}.routes[{j}]")
                use(policies, route.get("policy"), protocol, f"{where}.routes[{j}]")
        methods = lst.get("method_policies")
        for key, pol in methods.items() if isinstance(methods, dict) else ():
            use(policies, pol, protocol, join(f"{where}.method_policies", key))
    return upstreams, policies


def _with_extended(
    policies: Mapping[str, Any], users: Mapping[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    """A policy is used by its own users and by those of every policy that extends it (its keys are
    theirs too)."""
    out: dict[str, dict[str, str]] = {}
    for name in policies:
        seen: set[str] = set()
        current: Any = name
        while isinstance(current, str) and current in policies and current not in seen:
            seen.add(current)
            for protocol, where in users.get(name, {}).items():
                out.setdefault(current, {}).setdefault(protocol, where)
            pol = policies[current]
            current = pol.get("extends") if isinstance(pol, dict) else None
    return out
