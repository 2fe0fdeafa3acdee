"""Load and validate a configuration file, once, reporting every error with the path of its key.

YAML -> ``${ENV}`` expansion -> presets and ``extends`` spelled out -> schema (pydantic) -> cross-references.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..upstream import target
from . import applies, grpc_service_config
from .env import Expansions, expand, join
from .presets import PRESETS, resolve_policies
from .redact import Redactor, secret_key_values
from .schema import PROTOCOL_PRESETS, Config, DnsConfig, UpstreamConfig
from .units import split_host_port

ErrorList = list[tuple[str, str]]

#: Why a gRPC listener cannot have a connection rate limit (docs/admission.md, "gRPC and connections").
GRPC_CONNECTIONS = (
    "admission profile {name!r} limits connections, which a grpc listener cannot do: grpc.aio accepts "
    "connections itself and offers no public way to hold or refuse one before its HTTP/2 handshake; "
    "give this listener a profile without `connections` (its request rate is limited per call)"
)


class ConfigError(Exception):
    """Every problem found in a configuration, each as ``(path, message)``."""

    def __init__(self, errors: ErrorList, source: str = "") -> None:
        self.errors = errors
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.source}: " if self.source else ""
        lines = [f"{head}{len(self.errors)} error{'s' if len(self.errors) != 1 else ''} in the configuration"]
        for path, msg in self.errors:
            lines.append(f"  {path}: {msg}" if path else f"  {msg}")
        return "\n".join(lines)


def load_file(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([("", f"cannot read {str(p)!r}: {e.strerror or e}")], str(p)) from None
    except UnicodeDecodeError as e:
        raise ConfigError([("", f"{str(p)!r} is not UTF-8 text: {e.reason}")], str(p)) from None
    return load_text(text, environ, source=str(p))


def load_text(text: str, environ: Mapping[str, str] | None = None, source: str = "") -> Config:
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([("", f"not valid YAML: {where}{problem}")], source) from None
    if tree is None:
        tree = {}
    return load_dict(tree, environ, source)


def load_dict(tree: Any, environ: Mapping[str, str] | None = None, source: str = "") -> Config:
    if not isinstance(tree, dict):
        raise ConfigError(
            [("", "the top level must be a mapping (admin:, policies:, upstreams:, ...)")], source
        )
    errors: ErrorList = []
    expansions = Expansions()
    tree = expand(tree, os.environ if environ is None else environ, "", errors, expansions)
    misplaced_keys = applies.misplaced(tree)  # read as written: presets' values are not the user's
    raw_policies = tree.get("policies") or {}
    user_policies = sorted(raw_policies) if isinstance(raw_policies, dict) else []
    if isinstance(raw_policies, dict):
        tree = {**tree, "policies": resolve_policies(raw_policies, _wanted_policies(tree), errors)}
        # gRPC service configs become named policies and method_policies entries (path-named errors).
        tree = grpc_service_config.expand(tree, errors, PROTOCOL_PRESETS["grpc"])
    env_paths = tuple(path for path, _ in errors)
    try:
        config = Config.model_validate(tree)
    except ValidationError as e:
        # A value emptied by a missing variable would fail again: report the variable only.
        errors.extend(err for err in _pydantic_errors(e) if not err[0].startswith(env_paths or ("\0",)))
        config = None
    errors.extend(_references(tree, user_policies))
    errors.extend(_endpoint_rules(tree))
    errors.extend(_uri_rules(tree))
    errors.extend(misplaced_keys)
    if config is not None:
        errors.extend(_buffer_bounds(config))
        errors.extend(_app_auth_rules(config))
    if errors:
        # A message may quote a value (``'x' is not a duration``): never a secret one.
        redactor = Redactor(expansions, secret_key_values(tree))
        raise ConfigError([(path, redactor.text(msg)) for path, msg in _unique(errors)], source)
    assert config is not None
    config = _with_default_policies(config)
    config = _with_dns_defaults(config)
    config._expansions = expansions
    return config


def _with_default_policies(config: Config) -> Config:
    """A listener without ``policy`` uses its protocol's preset: say so in the effective config."""
    listeners = [
        lst if lst.policy is not None else lst.model_copy(update={"policy": PROTOCOL_PRESETS[lst.protocol]})
        for lst in config.listeners
    ]
    return config.model_copy(update={"listeners": listeners})


def _with_dns_defaults(config: Config) -> Config:
    """An upstream whose names are resolved and polled shows its ``dns`` settings, defaults spelled out."""
    found = config.discovered_upstreams()
    upstreams = {
        name: uc.model_copy(update={"dns": DnsConfig()})
        if name in found and uc.dns is None and _has_names(uc)
        else uc
        for name, uc in config.upstreams.items()
    }
    return config.model_copy(update={"upstreams": upstreams})


def _has_names(uc: UpstreamConfig) -> bool:
    return any(not target.parse(e).static for e in uc.endpoints)


def _endpoint_rules(tree: dict[str, Any]) -> ErrorList:
    """What endpoint forms and ``dns`` settings mean where they are written (read from the tree, so that
    they are reported with every other error): ``dns`` on an upstream with nothing to resolve is an error,
    and a MongoDB upstream's members stay ``host:port`` (a driver's connection resolves them, as before).
    (``dns`` on a MongoDB upstream at all: ``applies.py``.)"""
    errors: ErrorList = []
    upstreams = tree.get("upstreams") if isinstance(tree.get("upstreams"), dict) else {}
    mongo: set[Any] = set()
    grpc: set[Any] = set()
    other: set[Any] = set()
    for lst in _listeners(tree):
        if lst.get("protocol") == "mongodb":
            mongo.add(lst.get("upstream"))
        else:
            used = {lst.get("upstream"), *(r.get("upstream") for r in _dicts(lst.get("routes")))}
            other.update(used)
            if lst.get("protocol") == "grpc":
                grpc.update(used)
    for name, up in upstreams.items():
        if not isinstance(up, dict):
            continue
        base = join("upstreams", name)
        targets = []
        raw = up.get("endpoints")
        for i, text in enumerate(raw if isinstance(raw, list) else []):
            try:
                targets.append((i, text, target.parse(text)))
            except ValueError:
                continue  # the schema names it
        has_dns = up.get("dns") is not None
        errors.extend(_url_endpoint_rules(base, up, targets, name in grpc, name in mongo))
        if name in mongo and name not in other:
            for i, text, t in targets:
                if t.scheme:
                    errors.append(
                        (
                            f"{base}.endpoints[{i}]",
                            f"{text!r}: a MongoDB upstream's members are written host:port "
                            "(resolved by each connection, as by a driver)",
                        )
                    )
        elif has_dns and targets and all(t.static for _, _, t in targets):
            errors.append(
                (
                    f"{base}.dns",
                    "no endpoint of this upstream is a name (all are IP addresses): nothing to resolve",
                )
            )
    return errors


#: An upstream key and the URI options that set it too (``None``: the URI always does).
_URI_KEYS: dict[str, tuple[str, ...] | None] = {
    "endpoints": None,
    "replica_set": ("replicaSet",),
    "tls": ("tls", "ssl", "tlsCAFile", "tlsCertificateKeyFile", "tlsInsecure", "tlsAllowInvalidCertificates"),
    "auth": ("authSource", "authMechanism"),
    "compressors": ("compressors",),
    "connect_timeout": ("connectTimeoutMS",),
    "max_connections": ("maxPoolSize",),
}


def _uri_rules(tree: dict[str, Any]) -> ErrorList:
    """A key given both in an upstream's ``uri`` and explicitly is an error (which one would win is
    nobody's guess)."""
    errors: ErrorList = []
    upstreams = tree.get("upstreams") if isinstance(tree.get("upstreams"), dict) else {}
    for name, up in upstreams.items():
        if not isinstance(up, dict) or not isinstance(up.get("uri"), str):
            continue
        from .mongo_uri import parse  # pymongo's parser: loaded only for a config with a uri (issue 27)

        try:
            u = parse(up["uri"])
        except ValueError:
            continue  # the schema names it
        for key, options in _URI_KEYS.items():
            if up.get(key) is None:
                continue
            if options is None:
                by = f"the {'SRV name' if u.srv else 'hosts'} it names"
            else:
                written = [o for o in options if u.sets(o)]
                if key == "auth" and u.username is not None:
                    written.insert(0, "credentials")
                if not written:
                    continue
                by = ", ".join(written)
            errors.append(
                (join(join("upstreams", name), key), f"also given by uri ({by}): give it in one place")
            )
    return errors


def _url_endpoint_rules(
    base: str, up: dict[str, Any], targets: list[tuple[int, Any, target.Target]], grpc: bool, mongo: bool
) -> ErrorList:
    """URL endpoints (``https://host[:port]``, ``http://host[:port]``) are an HTTP upstream's and say
    whether it is reached over TLS: all of one upstream's endpoints use one scheme (a URL's, or none), and
    ``http://`` endpoints have no ``tls`` block. (A MongoDB upstream's members: ``_endpoint_rules``.)"""
    urls = [(i, text, t) for i, text, t in targets if t.scheme in target.URL_SCHEMES]
    if not urls:
        return []
    errors: ErrorList = []
    if grpc:
        i, text, _ = urls[0]
        errors.append(
            (
                f"{base}.endpoints[{i}]",
                f"{text!r}: a URL is an HTTP upstream's endpoint; a gRPC upstream's are host:port or "
                "dns:///name:port (over TLS with a tls block)",
            )
        )
    schemes = {t.scheme for _, _, t in targets}
    if len(schemes) > 1:
        first = urls[0][2].scheme
        for i, text, t in targets:
            if t.scheme != first:
                errors.append(
                    (
                        f"{base}.endpoints[{i}]",
                        f"{text!r}: every endpoint of an upstream is written with one scheme ({first}://, "
                        f"as {urls[0][1]!r}): TLS or not is the upstream's",
                    )
                )
    elif schemes == {"http"} and up.get("tls") is not None and not mongo:
        errors.append(
            (
                f"{base}.tls",
                "its endpoints are http:// (plain text): write them https:// to reach them over TLS",
            )
        )
    return errors


# -- helpers ----------------------------------------------------------------------------------------
def _wanted_policies(tree: dict[str, Any]) -> set[str]:
    """Policy names that listeners and routes use, with each protocol's preset as the default."""
    wanted: set[str] = set()
    for lst in _listeners(tree):
        name = lst.get("policy")
        if name is None:
            name = PROTOCOL_PRESETS.get(lst.get("protocol"))  # type: ignore[arg-type]
        if isinstance(name, str):
            wanted.add(name)
        for route in _dicts(lst.get("routes")):
            if isinstance(route.get("policy"), str):
                wanted.add(route["policy"])
        mp = lst.get("method_policies")
        if isinstance(mp, dict):
            wanted.update(v for v in mp.values() if isinstance(v, str))
    return {w for w in wanted if w in PRESETS}


def _listeners(tree: dict[str, Any]) -> list[dict[str, Any]]:
    return _dicts(tree.get("listeners"))


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _buffer_bounds(config: Config) -> ErrorList:
    """A MongoDB message is held whole: one larger than every buffer together could never be read."""
    cap = config.limits.max_buffered_bytes
    return [
        (
            f"listeners[{i}].max_message_size",
            f"{lst.max_message_size} bytes is more than limits.max_buffered_bytes ({cap} bytes)",
        )
        for i, lst in enumerate(config.listeners)
        if lst.protocol == "mongodb" and lst.max_message_size > cap
    ]


def _app_auth_rules(config: Config) -> ErrorList:
    """``app_auth`` without ``users`` takes the upstream's own user: there must be one."""
    errors: ErrorList = []
    for i, lst in enumerate(config.listeners):
        if lst.protocol != "mongodb" or lst.app_auth is None or lst.app_auth.users is not None:
            continue
        up = config.upstreams.get(lst.upstream)
        if up is not None and up.auth is None:
            errors.append(
                (
                    f"listeners[{i}].app_auth.users",
                    f"not given, and upstream {lst.upstream!r} has no login of its own to take the user from "
                    "(credentials in its uri, or auth): list who may log in",
                )
            )
    return errors


def _references(tree: dict[str, Any], user_policies: list[str]) -> ErrorList:
    errors: ErrorList = []
    upstreams = tree.get("upstreams") if isinstance(tree.get("upstreams"), dict) else {}
    policies = tree.get("policies") if isinstance(tree.get("policies"), dict) else {}
    raw_listeners = tree.get("listeners") if isinstance(tree.get("listeners"), list) else []

    def check_upstream(path: str, name: Any) -> None:
        if isinstance(name, str) and name not in upstreams:
            known = ", ".join(sorted(upstreams)) or "none defined"
            errors.append((path, f"no upstream named {name!r} (upstreams: {known})"))

    def check_policy(path: str, name: Any) -> None:
        if isinstance(name, str) and name not in policies and name not in PRESETS:
            defined = ", ".join(user_policies) or "none"
            errors.append(
                (path, f"no policy named {name!r} (defined: {defined}; presets: {', '.join(PRESETS)})")
            )

    profiles = tree.get("admission") if isinstance(tree.get("admission"), dict) else {}

    def check_admission(path: str, lst: dict[str, Any]) -> None:
        name = lst.get("admission")
        if not isinstance(name, str):
            return
        profile = profiles.get(name)
        if profile is None:
            known = ", ".join(sorted(profiles)) or "none defined"
            errors.append((path, f"no admission profile named {name!r} (admission: {known})"))
        elif lst.get("protocol") == "grpc" and isinstance(profile, dict) and profile.get("connections"):
            errors.append((path, GRPC_CONNECTIONS.format(name=name)))

    names: dict[str, int] = {}
    addresses: dict[str, str] = {}
    for i, lst in enumerate(raw_listeners):
        if not isinstance(lst, dict):
            continue
        base = f"listeners[{i}]"
        check_upstream(f"{base}.upstream", lst.get("upstream"))
        check_policy(f"{base}.policy", lst.get("policy"))
        check_admission(f"{base}.admission", lst)
        for j, route in enumerate(_dicts(lst.get("routes"))):
            check_upstream(f"{base}.routes[{j}].upstream", route.get("upstream"))
            check_policy(f"{base}.routes[{j}].policy", route.get("policy"))
        mp = lst.get("method_policies")
        if isinstance(mp, dict):
            for key, pol in mp.items():
                check_policy(join(f"{base}.method_policies", key), pol)
        name = lst.get("name")
        if isinstance(name, str):
            if name in names:
                errors.append(
                    (f"{base}.name", f"duplicate listener name {name!r} (also listeners[{names[name]}])")
                )
            names.setdefault(name, i)
        listen = lst.get("listen")
        if isinstance(listen, str):
            other = _clash(listen, addresses)
            if other is not None:
                errors.append((f"{base}.listen", f"{listen} is already used by {other}"))
            addresses.setdefault(listen, base)
    if tree.get("fleet") is None:
        for name, profile in profiles.items():
            requests = profile.get("requests") if isinstance(profile, dict) else None
            if isinstance(requests, dict) and requests.get("scope") == "fleet":
                errors.append(
                    (
                        join(join("admission", name), "requests") + ".scope",
                        "scope fleet needs a `fleet:` block",
                    )
                )
        for name, up in upstreams.items():
            budget = up.get("retry_budget") if isinstance(up, dict) else None
            if isinstance(budget, dict) and budget.get("scope") == "fleet":
                errors.append(
                    (
                        join(join("upstreams", name), "retry_budget") + ".scope",
                        "scope fleet needs a `fleet:` block",
                    )
                )
    admin = tree.get("admin")
    if isinstance(admin, dict) and isinstance(admin.get("listen"), str):
        other = _clash(admin["listen"], addresses)
        if other is not None:
            errors.append(("admin.listen", f"{admin['listen']} is already used by {other}"))
    return errors


_ANY_HOST = {"", "0.0.0.0", "::", "[::]", "*"}


def _clash(listen: str, taken: dict[str, str]) -> str | None:
    """Who already listens where ``listen`` would: the same port on the same host, or on every host.
    Port 0 (any free port) never clashes; ``taken`` maps addresses to their owners' key paths."""
    try:
        host, port = split_host_port(listen)
    except ValueError:
        return None  # the schema names the bad address
    if not port:
        return None
    for address, owner in taken.items():
        try:
            other_host, other_port = split_host_port(address)
        except ValueError:
            continue
        if other_port == port and (host == other_host or host in _ANY_HOST or other_host in _ANY_HOST):
            return owner
    return None


_TAGS = {"http", "grpc", "mongodb"}


def _pydantic_errors(e: ValidationError) -> ErrorList:
    out: ErrorList = []
    for err in e.errors(include_url=False):
        loc = list(err["loc"])
        # Drop the discriminator tag pydantic inserts for tagged unions (listeners[0].http.upstream).
        cleaned: list[Any] = []
        for k, part in enumerate(loc):
            prev = loc[k - 1] if k else None
            if part in _TAGS and (prev == "throttle" or (isinstance(prev, int) and "listeners" in loc[:k])):
                continue
            if isinstance(part, str) and part.startswith("function-"):
                continue
            cleaned.append(part)
        path = ""
        for part in cleaned:
            path = join(path, part)
        out.append((path, _message(err)))
    return out


def _message(err: dict[str, Any]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return f"{ctx.get('discriminator', 'kind')} must be one of {ctx.get('expected_tags')}, not {ctx.get('tag')!r}"
    if kind == "union_tag_not_found":
        ctx = err.get("ctx", {})
        return f"required key {ctx.get('discriminator', 'kind')} is missing"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    elif msg.startswith("Assertion failed, "):
        msg = msg[len("Assertion failed, ") :]
    return msg


def _unique(errors: ErrorList) -> ErrorList:
    seen: set[tuple[str, str]] = set()
    out: ErrorList = []
    for e in errors:
        if e not in seen:
            seen.add(e)
            out.append(e)
    return out
