"""A MongoDB upstream written as a connection string (``upstreams.<name>.uri``), read by pymongo's own URI
parser (the Connection String spec), never by hand.

``mongodb://user:pw@h1:27017,h2/?replicaSet=rs0&tls=true&authSource=admin&compressors=zstd`` gives the
members, the replica set, TLS, the sidecar's own login upstream and the compressors it offers upstream, as
the explicit keys (``endpoints``, ``replica_set``, ``tls``, ``auth``, ``compressors``, ``connect_timeout``,
``max_connections``) would; a key given both ways is an error (``loader.py``). ``mongodb+srv://name`` is a
name whose SRV record lists the members and whose TXT record may add ``authSource``, ``replicaSet`` and
``loadBalanced`` (the Initial DNS Seedlist Discovery spec): the sidecar resolves it with its own resolver
(``resolver:``) when it starts, and polls it (``adapters/mongo/seeds.py``); here only the name is kept.
TLS is on by default for ``mongodb+srv://``, as for a driver.

Options are the sidecar's only where they mean something to it; the app's own driver settings (``w``,
``retryWrites``, ``readPreference``, ...) do nothing in the sidecar's upstream URI, and are errors that say so
rather than being ignored.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

from pymongo.errors import ConfigurationError, InvalidURI
from pymongo.uri_parser import parse_uri, split_options

SRV_SCHEME = "mongodb+srv://"
SCHEME = "mongodb://"
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-1")

#: pymongo's (normalised, lower-case) option names the sidecar honours.
HONOURED = frozenset(
    {
        "replicaset",
        "tls",
        "ssl",
        "tlscafile",
        "tlscertificatekeyfile",
        "tlsallowinvalidcertificates",
        "tlsinsecure",
        "authsource",
        "authmechanism",
        "compressors",
        "zlibcompressionlevel",
        "loadbalanced",
        "directconnection",
        "connecttimeoutms",
        "maxpoolsize",
        "srvservicename",
        "srvmaxhosts",
        "appname",
    }
)
#: Options that are some other party's: why each does nothing here.
_WHY = {
    "tlsallowinvalidhostnames": "not supported: give tls.server_name, or tlsInsecure=true to skip every check",
    "tlscertificatekeyfilepassword": "not supported: give an unencrypted key file",
}
_APP_OWN = (
    "it is the app driver's own setting: keep it in the app's URI (the sidecar forwards each command as the "
    "app sent it, under its retry policy)"
)


@dataclass(frozen=True)
class MongoUri:
    """What a connection string says, in the sidecar's terms."""

    hosts: tuple[str, ...]  # host:port members (empty for mongodb+srv://)
    srv: str | None  # the name under mongodb+srv://
    srv_service: str  # SRV service name: _<srv_service>._tcp.<srv>
    srv_max_hosts: int  # 0: every member the record lists
    username: str | None
    password: str | None
    source: str  # the auth database: authSource, else the URI's database, else admin
    mechanism: str
    replica_set: str | None
    tls: bool
    tls_ca_file: str | None
    tls_cert_key_file: str | None
    tls_insecure: bool
    compressors: tuple[str, ...]
    zlib_level: int
    load_balanced: bool
    direct_connection: bool
    connect_timeout: float | None
    max_pool_size: int | None
    app_name: str | None
    given: frozenset[str]  # the options written (lower-case), to tell what the URI sets

    def sets(self, option: str) -> bool:
        return option.lower() in self.given


def parse(uri: str) -> MongoUri:
    """Read ``uri``; ``ValueError`` saying what is wrong (never quoting the password)."""
    if not isinstance(uri, str) or not uri.startswith((SCHEME, SRV_SCHEME)):
        raise ValueError("a MongoDB connection string begins with mongodb:// or mongodb+srv://")
    srv = uri.startswith(SRV_SCHEME)
    rest = uri[len(SRV_SCHEME) if srv else len(SCHEME) :]
    host_part, _, query = rest.partition("?")
    if "/" in host_part:
        host_part = host_part.partition("/")[0]
    fqdn = host_part.rpartition("@")[2]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # pymongo warns and drops an unusable compressor: an error here
            given = split_options(query, validate=False, warn=False, normalize=False) if query else {}
            srv_opts = {k.lower(): v for k, v in given.items() if k.lower().startswith("srv")}
            if srv:
                if "," in fqdn or ":" in fqdn.rsplit("]", 1)[-1]:
                    raise ValueError("a mongodb+srv:// URI names one host, without a port")
                if str(given.get("directConnection", "")).lower() == "true":
                    raise ValueError("directConnection=true cannot be used with mongodb+srv://")
                # Validate everything else with the driver's parser, as the plain URI it becomes.
                kept = "&".join(p for p in query.split("&") if p and not p.lower().startswith("srv"))
                plain = SCHEME + rest.partition("?")[0] + ("?" + kept if kept else "")
                parsed = parse_uri(plain, validate=True, warn=False)
            else:
                parsed = parse_uri(uri, validate=True, warn=False)
    except (InvalidURI, ConfigurationError, ValueError, TypeError, OSError, UserWarning) as e:
        raise ValueError(_clean(str(e), parsed_password(uri))) from None
    options: dict[str, Any] = parsed["options"]
    lower = {k.lower() for k in given}
    for name in sorted(lower - HONOURED):
        raise ValueError(
            f"option {name!r} does nothing in the sidecar's upstream URI: {_WHY.get(name, _APP_OWN)}"
        )
    if srv_opts and not srv:
        raise ValueError("srvServiceName and srvMaxHosts are only for mongodb+srv:// URIs")
    mechanism = options.get("authMechanism") or "SCRAM-SHA-256"
    if mechanism not in MECHANISMS:
        raise ValueError(f"authMechanism {mechanism}: the sidecar logs in with {' or '.join(MECHANISMS)}")
    direct = bool(options.get("directConnection"))
    if direct and options.get("replicaSet"):
        raise ValueError(
            "directConnection=true talks to one server as it is: drop replicaSet, or directConnection"
        )
    if options.get("loadBalanced"):
        raise ValueError(
            "loadBalanced=true is not supported yet: list the routers (mongodb://h1,h2/) or give their SRV name"
        )
    pool = options.get("maxPoolSize")
    if pool == 0:
        raise ValueError(
            "maxPoolSize=0 (no limit): give the most connections per member the sidecar may open"
        )
    timeout = options.get("connectTimeoutMS")
    tls = bool(options.get("tls", options.get("ssl", srv)))
    return MongoUri(
        hosts=() if srv else tuple(_join(h, p) for h, p in parsed["nodelist"]),
        srv=fqdn if srv else None,
        srv_service=str(srv_opts.get("srvservicename") or "mongodb"),
        srv_max_hosts=int(srv_opts.get("srvmaxhosts") or 0),
        username=parsed["username"],
        password=parsed["password"],
        source=options.get("authSource") or parsed["database"] or "admin",
        mechanism=mechanism,
        replica_set=options.get("replicaSet"),
        tls=tls,
        tls_ca_file=options.get("tlsCAFile"),
        tls_cert_key_file=options.get("tlsCertificateKeyFile"),
        tls_insecure=bool(options.get("tlsInsecure") or options.get("tlsAllowInvalidCertificates")),
        compressors=tuple(options.get("compressors") or ()),
        zlib_level=int(options.get("zlibCompressionLevel", -1)),
        load_balanced=False,
        direct_connection=direct,
        connect_timeout=float(timeout) if timeout else None,
        max_pool_size=int(pool) if pool else None,
        app_name=options.get("appname") or options.get("appName"),
        given=frozenset(lower | ({"tls"} if srv and "ssl" not in lower else set())),
    )


def txt_options(text: str) -> dict[str, Any]:
    """A mongodb+srv:// name's TXT record (``authSource=admin&replicaSet=rs0``): only ``authSource``,
    ``replicaSet`` and ``loadBalanced`` may be given there (the spec); ``ValueError`` otherwise."""
    try:
        opts = split_options(text, validate=True, warn=False, normalize=True)
    except (InvalidURI, ConfigurationError, ValueError, TypeError) as e:
        raise ValueError(f"TXT record {text!r}: {e}") from None
    out: dict[str, Any] = {}
    for key, value in opts.items():
        low = key.lower()
        if low not in ("authsource", "replicaset", "loadbalanced"):
            raise ValueError(
                f"TXT record {text!r}: only authSource, replicaSet and loadBalanced may be given there"
            )
        if low == "loadbalanced" and value:
            raise ValueError(f"TXT record {text!r}: loadBalanced=true is not supported yet")
        out[low] = value
    return out


def parsed_password(uri: str) -> str | None:
    rest = uri.split("://", 1)[-1].partition("/")[0].partition("?")[0]
    if "@" not in rest:
        return None
    userinfo = rest.rpartition("@")[0]
    return userinfo.partition(":")[2] or None


def _clean(message: str, password: str | None) -> str:
    if password:
        message = message.replace(password, "<redacted>").replace(quote_plus(password), "<redacted>")
    return message


def _join(host: str, port: int | None) -> str:
    port = 27017 if port is None else port
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
