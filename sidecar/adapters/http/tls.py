"""TLS origination for an HTTP upstream (issue 22): the client context its connections are made with, the
name each endpoint is verified as, and the TLS sessions kept for resumption.

An upstream is reached over TLS when its endpoints are written ``https://`` or it has a ``tls`` block:

- verification on by default: the chain against ``tls.ca_file`` (else the system's trust store) and the
  name: ``tls.server_name``, else the name the endpoint was written with, even when discovery resolved it to
  an address (``orders.prod:443`` resolved to ``10.1.2.3:443`` is verified as ``orders.prod``, and that is
  the SNI sent); an IP literal is verified against the certificate's IP addresses;
- ``cert_file`` and ``key_file``: the client certificate (mTLS); ``min_version``: ``1.2`` or ``1.3``;
  ``insecure_skip_verify``: encrypted but not verified, said as a warning when the listener starts;
- ALPN offers ``http/1.1`` (the sidecar speaks HTTP/1.1 upstream);
- resumption: the last session a server gave is offered on the next connection to the same name, so a pool
  that grows or replaces a connection skips the full handshake where the server allows it.

The handshake is part of connecting (``Pool.connect``, within ``connect_timeout``). How a failed one ends is
``classify.connect_failed``'s to say: a peer that went away or reset is a ``connect-failure``; a certificate
that does not verify (or a handshake the server refuses) is a configuration problem, answered 502 at once.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Final

from ...config import ConfigError
from ...config.schema import TlsConfig
from ...upstream.target import split_host_port

log: Final = logging.getLogger("sidecar.http")

_VERSIONS: Final = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
#: How many server names' sessions an upstream keeps (one per name it reaches: a handful).
MAX_SESSIONS: Final = 256


class SessionContext(ssl.SSLContext):
    """A client context that offers, on each new connection, the session the same server name gave last.
    asyncio and uvloop both make a connection's TLS object with ``wrap_bio(..., server_hostname=...)``:
    the session is passed there (the standard library's own way to resume, ``SSLObject.session``)."""

    sessions: dict[str, ssl.SSLSession]

    def wrap_bio(
        self,
        incoming: Any,
        outgoing: Any,
        server_side: bool = False,
        server_hostname: Any = None,
        session: Any = None,
    ) -> Any:  # type: ignore[override]  # noqa: E501
        if session is None and server_hostname is not None:
            session = self.sessions.get(server_hostname)
        return super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)

    def keep(self, server_hostname: str, ssl_object: Any) -> None:
        """Keep the session ``ssl_object`` holds now (after an exchange: TLS 1.3 tickets come after the
        handshake) for the next connection to ``server_hostname``."""
        session = ssl_object.session if ssl_object is not None else None
        if session is None or not (session.has_ticket or session.id):
            return
        if server_hostname not in self.sessions and len(self.sessions) >= MAX_SESSIONS:
            self.sessions.pop(next(iter(self.sessions)))
        self.sessions[server_hostname] = session


class Origin:
    """TLS for one upstream's connections: the context (built once, when the listener starts) and the name
    each endpoint is verified as."""

    __slots__ = ("upstream", "context", "server_name", "verify")

    def __init__(self, upstream: str, tls: TlsConfig | None) -> None:
        self.upstream = upstream
        cfg = tls if tls is not None else TlsConfig()
        self.context = _context(upstream, cfg)
        self.server_name = cfg.server_name
        self.verify = not cfg.insecure_skip_verify
        if not self.verify:
            log.warning(
                "upstreams.%s.tls.insecure_skip_verify: its connections are encrypted but the server is NOT "
                "verified (anyone on the path can pose as it)",
                upstream,
            )

    def name_for(self, endpoint_name: str) -> str:
        """The name to send (SNI) and verify for an endpoint found under ``endpoint_name`` (``host:port``)."""
        if self.server_name:
            return self.server_name
        try:
            return split_host_port(endpoint_name)[0]
        except ValueError:
            return endpoint_name


def _context(upstream: str, cfg: TlsConfig) -> SessionContext:
    base = f"upstreams.{upstream}.tls"
    ctx = SessionContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
    ctx.sessions = {}
    try:
        if cfg.ca_file:
            ctx.load_verify_locations(cafile=cfg.ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError([(f"{base}.ca_file", f"cannot load {cfg.ca_file!r}: {_why(e)}")]) from None
    if cfg.key_file and not cfg.cert_file:
        raise ConfigError([(f"{base}.key_file", "a client key needs its certificate (cert_file)")])
    if cfg.cert_file:
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        except (OSError, ssl.SSLError) as e:
            files = cfg.cert_file + (f" and {cfg.key_file}" if cfg.key_file else "")
            raise ConfigError([(f"{base}.cert_file", f"cannot load {files}: {_why(e)}")]) from None
    if cfg.min_version is not None:
        ctx.minimum_version = _VERSIONS[cfg.min_version]
    if cfg.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)
