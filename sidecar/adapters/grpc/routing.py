"""Which policy a method gets (pure).

A listener's ``method_policies`` maps ``package.Service/Method``, ``package.Service`` or ``*`` to a policy
name; a service config adds its entries there at load. Resolution: the exact method, then its service,
then ``*``, then the listener's ``policy``. A service config's ``timeout`` is found the same way and caps the
call's deadline, and ``unary_requests`` (the same keys) says whether the method's request is one message.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

_CACHE_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class Route:
    name: str  # "package.Service/Method" (the span name)
    service: str
    method: str
    policy: str
    timeout_cap: float | None = None
    single_request: bool = False  # listed in ``unary_requests``: the request is one message
    #: its calls' span attributes (OpenTelemetry's RPC conventions), made once with the route; read only
    attributes: Mapping[str, str] = field(default_factory=dict)


def split_method(path: str) -> tuple[str, str]:
    """``/package.Service/Method`` -> ``("package.Service", "Method")``; odd paths keep what they have."""
    service, _, method = path.lstrip("/").partition("/")
    return service, method


class MethodRoutes:
    def __init__(
        self,
        method_policies: Mapping[str, str],
        fallback: str,
        timeouts: Mapping[str, float],
        unary_requests: Collection[str] = (),
    ) -> None:
        self.table = dict(method_policies)
        self.fallback = fallback
        self.timeouts = dict(timeouts)
        self.unary_requests = frozenset(unary_requests)
        self._cache: dict[str, Route] = {}

    def resolve(self, path: str) -> Route:
        route = self._cache.get(path)
        if route is None:
            if len(self._cache) >= _CACHE_LIMIT:  # clients choose method names: keep the cache bounded
                self._cache.clear()
            route = self._cache[path] = self._resolve(path)
        return route

    def _resolve(self, path: str) -> Route:
        service, method = split_method(path)
        keys = (f"{service}/{method}", service, "*")
        policy = next((self.table[k] for k in keys if k in self.table), self.fallback)
        cap = next((self.timeouts[k] for k in keys if k in self.timeouts), None)
        single = any(k in self.unary_requests for k in keys)
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        return Route(f"{service}/{method}", service, method, policy, cap, single, attributes)
