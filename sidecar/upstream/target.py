"""What an upstream endpoint is written as, parsed in one place, and the record of one address it stands for.

Pure. The forms (``upstreams.<name>.endpoints``)::

    10.1.2.3:8080   [2001:db8::1]:8080          an IP literal: one static endpoint, exactly as written
    orders.prod.svc.cluster.local:8080          a name: every address it resolves to (A, AAAA) is an endpoint
    dns:///orders.prod.svc.cluster.local:8080   gRPC's name syntax (``dns:[//]name:port``): the same thing
    srv:_http._tcp.search.prod.svc.cluster.local    an SRV name: every target:port it lists is an endpoint

A scheme is the part before ``:`` when it is one of :data:`SCHEMES` (``dns:8080`` is still the host ``dns``,
port 8080). URL endpoints (``http://``, ``https://``) are refused with a message saying so; a scheme is added
by giving :data:`SCHEMES` an entry.

:class:`Endpoint` is what the rest of the sidecar handles: one address (the balancer's, the pools' and the
metrics' key) with the name it was found under (for the logs, ``/config``, and a TLS name to verify) and
its upstream.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

#: The kinds of target: an IP literal, a name resolved to addresses, an SRV name.
STATIC: Final = "static"
NAME: Final = "dns"
SRV: Final = "srv"

_LABEL: Final = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


@dataclass(frozen=True, slots=True)
class Target:
    """One entry of ``endpoints``: ``text`` as written, its ``kind`` (:data:`STATIC`, :data:`NAME`,
    :data:`SRV`), the ``host`` (an IP address without brackets, a name in lower case without its final dot,
    or the SRV name), the ``port`` (0 for SRV: each record gives its own) and the ``scheme`` it was
    written with (``""``, ``dns``, ``srv``)."""

    text: str
    kind: str
    host: str
    port: int
    scheme: str = ""

    @property
    def static(self) -> bool:
        return self.kind == STATIC

    @property
    def name(self) -> str:
        """How the target is named in logs and ``/config``: ``host:port`` (the SRV name alone)."""
        return self.host if self.kind == SRV else join_host_port(self.host, self.port)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One address of an upstream: ``address`` (``10.1.2.3:8080``, ``[2001:db8::1]:8080``; for a name the
    system resolver answers from ``/etc/hosts``, that ``name:port`` itself), the ``name`` it was found
    under (``orders.prod.svc.cluster.local:8080``, an SRV record's ``target:port``; the address itself for
    an IP literal) and the ``upstream`` it serves."""

    address: str
    name: str
    upstream: str


def join_host_port(host: str, port: int) -> str:
    """``("10.1.2.3", 80)`` -> ``10.1.2.3:80``; an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> ``(host, port)`` (the host without brackets). Raises ``ValueError``."""
    v = value.strip()
    if v.startswith("["):
        end = v.find("]")
        if end < 0 or v[end + 1 : end + 2] != ":":
            raise ValueError(f"{value!r} is not [ipv6]:port")
        host, port_s = v[1:end], v[end + 2 :]
    else:
        host, sep, port_s = v.rpartition(":")
        if not sep:
            raise ValueError(f"{value!r} has no port: expected host:port")
        if ":" in host:
            raise ValueError(f"{value!r}: write IPv6 addresses as [addr]:port")
    if not port_s.isascii() or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"{value!r}: port must be a number from 0 to 65535")
    return host, int(port_s)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_name(name: str, text: str) -> str:
    """``name`` as a DNS name (lower case, no final dot); ``ValueError`` naming ``text`` if it is not one."""
    n = name.rstrip(".").lower() if name != "." else ""
    labels = n.split(".")
    if not n or len(n) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{text!r}: {name!r} is neither an IP address nor a DNS name")
    if labels[-1].isdigit():
        raise ValueError(f"{text!r}: {name!r} is not an IP address (nor a name: its last label is a number)")
    return n


def _host_port(rest: str, text: str) -> Target:
    host, port = split_host_port(rest)
    if not host:
        raise ValueError(f"{text!r} has no host: expected host:port")
    if is_ip(host):
        return Target(text, STATIC, host, port)
    if rest.lstrip().startswith("["):
        raise ValueError(f"{text!r}: brackets hold an IPv6 address, not a name")
    return Target(text, NAME, check_name(host, text), port)


def _dns(rest: str, text: str) -> Target:
    """gRPC's ``dns:[//authority/]host:port``."""
    if rest.startswith("//"):
        authority, slash, rest = rest[2:].partition("/")
        if not slash:
            raise ValueError(f"{text!r}: expected dns:///name:port")
        if authority:
            raise ValueError(
                f"{text!r}: a DNS server in the endpoint (dns://{authority}/) is not supported: "
                "set resolver.nameservers"
            )
    if not rest.startswith("[") and ":" not in rest:
        raise ValueError(f"{text!r} needs a port (gRPC's default 443 is not assumed): dns:///{rest}:PORT")
    return _host_port(rest, text)


def _srv(rest: str, text: str) -> Target:
    if rest.startswith("//"):
        raise ValueError(f"{text!r}: write srv:_service._proto.name (no //)")
    if ":" in rest:
        raise ValueError(f"{text!r}: an SRV name has no port (each of its records gives one)")
    return Target(text, SRV, check_name(rest, text), 0)


#: Schemes an endpoint may be written with, and their parsers (``dns:///name:port``, ``srv:name``).
SCHEMES: Final[dict[str, Callable[[str, str], Target]]] = {"dns": _dns, "srv": _srv}


def parse(value: object) -> Target:
    """An endpoint as written -> :class:`Target`. Raises ``ValueError`` with a message naming it."""
    if not isinstance(value, str):
        raise ValueError("expected an endpoint: host:port, dns:///name:port or srv:_service._proto.name")
    text = value.strip()
    if not text:
        raise ValueError("an endpoint cannot be empty")
    if "@" in text:  # not quoted: it may hold a credential
        raise ValueError("an endpoint is host:port, without user@ (credentials go in the upstream's auth)")
    scheme, sep, rest = text.partition(":")
    parser = SCHEMES.get(scheme.lower()) if sep else None
    if parser is not None and (rest.startswith("//") or not rest.isdigit()):
        return replace(parser(rest, text), scheme=scheme.lower())
    if sep and rest.startswith("//"):
        raise ValueError(
            f"{text!r}: {scheme}:// endpoints are not supported; write host:port, dns:///name:port "
            "or srv:_service._proto.name"
        )
    return _host_port(text, text)
