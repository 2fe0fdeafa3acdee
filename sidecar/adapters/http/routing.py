"""Which upstream and policy serve a request (pure): routes by path prefix and/or Host, the listener as
the fallback, and absolute-form requests (``GET http://orders:8080/x``, an app using ``HTTP_PROXY``) sent to
the upstream whose name or endpoint is the URL's host, or refused (the sidecar is not an open proxy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ...config.schema import HttpListenerConfig, RouteMatch, UpstreamConfig
from ...upstream.target import SRV
from ...upstream.target import parse as parse_endpoint

#: The names of this host's loopback interface: an endpoint on one is reached by any of them.
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes. ``retry_non_idempotent``: ``None`` when neither route nor listener says
    (the policy's key decides). ``route``: the index of the matching route, ``None`` for the listener."""

    upstream: str
    policy: str
    retry_non_idempotent: bool | None
    route: int | None = None


@dataclass(frozen=True, slots=True)
class _Route:
    prefix: str | None
    host: str | None  # lowercased; "*.example.com" matches any subdomain
    port: int | None
    target: Target

    def matches(self, host: str, port: int | None, path: str) -> bool:
        if self.prefix is not None and not path.startswith(self.prefix):
            return False
        if self.host is None:
            return True
        if self.port is not None and port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


_REG_NAME: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~%!$&'()*+,;=")
_IP_LITERAL: Final = _REG_NAME | {":"}


def valid_host(value: str) -> bool:
    """Is ``value`` a Host header's ``uri-host [":" port]`` (RFC 9110 7.2, RFC 3986 3.2.2)?"""
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or not all(c in _IP_LITERAL for c in value[1:end]):
            return False
        rest = value[end + 1 :]
    else:
        host, sep, port = value.rpartition(":")
        if not sep:
            host, port = value, ""
        if not all(c in _REG_NAME for c in host):
            return False
        rest = sep + port
    if not rest:
        return True
    port = rest[1:]
    return rest[0] == ":" and (port == "" or (port.isascii() and port.isdigit() and int(port) <= 65535))


def split_host(value: str) -> tuple[str, int | None]:
    """``"Orders:8080"`` -> ``("orders", 8080)``; ``"orders"`` -> ``("orders", None)``; ``[::1]:80`` too."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        host, rest = (v[1:end], v[end + 1 :]) if end > 0 else (v, "")
        port_s = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_s = v.rpartition(":")
        if not sep or ":" in host:  # no port, or a bare IPv6 address
            host, port_s = v, ""
    port = int(port_s) if port_s.isascii() and port_s.isdigit() and len(port_s) <= 5 else None
    return host.rstrip("."), port


def _match(m: RouteMatch) -> tuple[str | None, int | None]:
    if m.host is None:
        return None, None
    return split_host(m.host)


class Router:
    """Built once per listener from its config and the upstreams' endpoints. The targets it returns are a
    fixed set of instances (one per route, the fallback, one per upstream reached in absolute-form)."""

    def __init__(self, listener: HttpListenerConfig, upstreams: Mapping[str, UpstreamConfig]) -> None:
        assert listener.policy is not None  # the loader fills in the protocol's preset
        rni = True if listener.retry_non_idempotent else None
        self.fallback = Target(listener.upstream, listener.policy, rni)
        self.routes: list[_Route] = []
        for i, r in enumerate(listener.routes):
            host, port = _match(r.match)
            target = Target(
                r.upstream or listener.upstream,
                r.policy or listener.policy,
                r.retry_non_idempotent if r.retry_non_idempotent is not None else rni,
                i,
            )
            self.routes.append(_Route(r.match.path_prefix, host, port, target))
        self._proxied: dict[str, Target] = {}
        # absolute-form: an upstream is known by its name or by any of its endpoints as written (an SRV
        # name, which has no port, by none)
        self.by_name = {name.lower(): name for name in upstreams}
        self.by_endpoint: dict[tuple[str, int], str] = {}
        for name, uc in upstreams.items():
            for ep in uc.endpoints:
                t = parse_endpoint(ep)
                if t.kind == SRV:
                    continue
                h, p = t.host.lower(), t.port
                # a loopback endpoint is reached by any loopback name (``localhost:8080`` for ``127.0.0.1:8080``)
                for alias in LOOPBACK_NAMES if h in LOOPBACK_NAMES else (h,):
                    self.by_endpoint.setdefault((alias, p), name)

    def route(self, host_header: str | None, path: str) -> Target:
        """An origin-form request (``GET /x`` with ``Host``)."""
        if not self.routes:
            return self.fallback
        host, port = split_host(host_header) if host_header else ("", None)
        for r in self.routes:
            if r.matches(host, port, path):
                return r.target
        return self.fallback

    def proxy(self, host: str, port: int, path: str) -> Target | None:
        """An absolute-form request to ``host:port``: the upstream so named or so reached, else ``None``."""
        host = host.lower().strip("[]").rstrip(".")
        upstream = self.by_name.get(host) or self.by_endpoint.get((host, port))
        if upstream is None:
            return None
        for r in self.routes:
            if r.target.upstream == upstream and r.matches(host, port, path):
                return r.target
        if upstream == self.fallback.upstream:
            return self.fallback
        target = self._proxied.get(upstream)
        if target is None:  # one instance per upstream: callers may key caches on it
            target = self._proxied[upstream] = Target(
                upstream, self.fallback.policy, self.fallback.retry_non_idempotent
            )
        return target
