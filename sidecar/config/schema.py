"""The configuration file's shape (the user's contract: keep these names), validated by pydantic.

Every model forbids unknown keys, so a typo is an error that names its path. Cross-references (a
listener's upstream, a policy's name) are checked in ``loader.py``, which sees the whole file.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..policy.outcome import OutcomeClass
from ..policy.spec import Jitter
from ..upstream import target
from .redact import redact_userinfo
from .units import Duration, HostPort, OptionalDuration, Size

GRPC_CODES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)


def grpc_code_name(value: object) -> str:
    """A gRPC status code by name (any case) or number -> its canonical name."""
    if isinstance(value, bool):
        raise ValueError("expected a gRPC status code name or number")
    if isinstance(value, int):
        if 0 <= value < len(GRPC_CODES):
            return GRPC_CODES[value]
        raise ValueError(f"{value} is not a gRPC status code (0-16)")
    if isinstance(value, str):
        name = value.strip().upper()
        if name.isdigit():
            return grpc_code_name(int(name))
        if name in GRPC_CODES:
            return name
    raise ValueError(f"{value!r} is not a gRPC status code (e.g. UNAVAILABLE or 14)")


class Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


# -- policies ---------------------------------------------------------------------------------------
class BackoffConfig(Base):
    initial: Duration = 0.025
    max: Duration = 1.0
    multiplier: float = Field(2.0, ge=1.0)
    jitter: Jitter = Jitter.FULL

    @model_validator(mode="after")
    def _order(self) -> BackoffConfig:
        if self.initial > self.max:
            raise ValueError("backoff.initial must not exceed backoff.max")
        return self


class GrpcThrottleConfig(Base):
    kind: Literal["grpc"]
    max_tokens: float = Field(10.0, gt=0, le=1000)
    token_ratio: float = Field(0.1, gt=0)


class MongoThrottleConfig(Base):
    kind: Literal["mongodb"]
    capacity: float = Field(1000.0, gt=0)
    retry_cost: float = Field(1.0, gt=0)
    return_rate: float = Field(0.1, ge=0)


ThrottleConfig = Annotated[GrpcThrottleConfig | MongoThrottleConfig, Field(discriminator="kind")]


class DeadlineConfig(Base):
    default: OptionalDuration = 10.0
    header: str = "X-YaTaxi-Client-TimeoutMs"
    expired_status: int = Field(498, ge=100, le=599)


class HedgingConfig(Base):
    max_attempts: int = Field(3, ge=1, le=10)
    delay: Duration = 0.05
    non_fatal: list[OutcomeClass] | None = None  # default: the policy's retry_on

    @field_validator("non_fatal")
    @classmethod
    def _no_success(cls, v: list[OutcomeClass] | None) -> list[OutcomeClass] | None:
        if v and (OutcomeClass.SUCCESS in v or OutcomeClass.FATAL in v):
            raise ValueError("non_fatal cannot contain success or fatal")
        return v


class PolicyConfig(Base):
    """One named retry policy. The engine keys first, then the keys each protocol's classifier reads."""

    max_attempts: int = Field(3, ge=1, le=100)
    retry_on: list[OutcomeClass] = [
        OutcomeClass.CONNECT_FAILURE,
        OutcomeClass.RESET,
        OutcomeClass.UNAVAILABLE,
        OutcomeClass.OVERLOADED,
    ]
    backoff: BackoffConfig = BackoffConfig()
    backoff_on: list[OutcomeClass] = [
        OutcomeClass.CONNECT_FAILURE,
        OutcomeClass.RESET,
        OutcomeClass.UNAVAILABLE,
        OutcomeClass.OVERLOADED,
        OutcomeClass.TIMEOUT,
    ]
    per_try_timeout: OptionalDuration = 2.0
    pushback: bool = True
    throttle: ThrottleConfig | None = GrpcThrottleConfig(kind="grpc")
    deadline: DeadlineConfig = DeadlineConfig()
    hedging: HedgingConfig | None = None
    transparent_retry: bool = False
    deprioritize_overloaded: bool = True
    replay_buffer: Size | None = None  # None: the protocol's default (HTTP 1 MiB, gRPC 256 KiB)
    # HTTP classification
    retryable_status: list[Annotated[int, Field(ge=100, le=599)]] = [502, 503, 504]
    overload_status: list[Annotated[int, Field(ge=100, le=599)]] = [429, 503]
    pushback_header: str | None = None
    retry_non_idempotent: bool = False
    # gRPC classification
    retryable_codes: list[str] = ["UNAVAILABLE"]
    overload_codes: list[str] = ["RESOURCE_EXHAUSTED"]
    give_up_pushback: bool = True  # add grpc-retry-pushback-ms: -1 when the sidecar gives up
    # MongoDB
    final_error_labels: Literal["strip-retryable", "keep"] = "strip-retryable"

    @field_validator("retry_on")
    @classmethod
    def _retryable_classes(cls, v: list[OutcomeClass]) -> list[OutcomeClass]:
        if OutcomeClass.SUCCESS in v or OutcomeClass.FATAL in v:
            raise ValueError("retry_on cannot contain success or fatal")
        return v

    @field_validator("retryable_codes", "overload_codes", mode="before")
    @classmethod
    def _grpc_codes(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [grpc_code_name(x) for x in v]
        return v

    @field_validator("per_try_timeout")
    @classmethod
    def _positive_try(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("per_try_timeout must be positive (or none)")
        return v


# -- upstreams --------------------------------------------------------------------------------------
class TlsConfig(Base):
    """How the sidecar reaches an upstream over TLS. ``ca_file``: the CAs to verify it with (default: the
    system's trust store); ``cert_file`` and ``key_file``: the sidecar's client certificate (mTLS);
    ``server_name``: the name sent (SNI) and verified (default: the endpoint's name, even when resolved to an
    address); ``insecure_skip_verify``: encrypt without verifying (warned at start); ``min_version``: the
    oldest TLS version offered (HTTP upstreams)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False
    min_version: Literal["1.2", "1.3"] | None = None


class AuthConfig(Base):
    username: str
    password: str = Field(json_schema_extra={"secret": True})
    source: str = "admin"
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-1"] = "SCRAM-SHA-256"


class OutlierDetectionConfig(Base):
    """Eject endpoints that keep failing (``sidecar/upstream/outlier.py``). On by default, as linkerd's failure
    accrual is: a dead endpoint should not cost half the requests until someone notices."""

    enabled: bool = True
    consecutive_connect_failures: int = Field(3, ge=1)
    consecutive_errors: int = Field(5, ge=1)
    consecutive_timeouts: int = Field(5, ge=1)
    base_ejection_time: Duration = 5.0
    max_ejection_time: Duration = 60.0
    max_ejection_percent: float = Field(50.0, ge=0, le=100)

    @model_validator(mode="after")
    def _times(self) -> OutlierDetectionConfig:
        if self.base_ejection_time <= 0:
            raise ValueError("base_ejection_time must be positive")
        if self.base_ejection_time > self.max_ejection_time:
            raise ValueError("base_ejection_time must not exceed max_ejection_time")
        return self


class RetryBudgetConfig(Base):
    """Retries + hedges <= ``ratio`` x the client requests to the upstream over ``window``, plus a bucket
    refilled at ``min_per_second`` (capacity ``min_per_second``): for this sidecar (``local``) or the whole
    fleet sharing ``fleet.redis.key_prefix`` (``fleet``). Consulted on top of the policy's own throttle."""

    scope: Literal["local", "fleet"] = "local"
    ratio: float = Field(0.2, ge=0.0, le=100.0)
    min_per_second: float = Field(10.0, ge=0.0)
    window: Duration = 10.0

    @field_validator("window")
    @classmethod
    def _positive_window(cls, v: float) -> float:
        if not v > 0:
            raise ValueError("window must be positive")
        return v


_GRPC_METHOD = re.compile(r"^/[A-Za-z_][\w.]*/(\*|[A-Za-z_]\w*)$")


class ConcurrencyConfig(Base):
    """Execution control toward each endpoint of an upstream (issue 12; the seed's ticket pools): every
    attempt holds one read or write ticket while it is outstanding. ``initial``, ``min`` and ``max`` count
    tickets per endpoint, reads plus writes; ``probing`` moves them within [min, max] by the seed's
    throughput probing every ``interval``, ``fixed`` keeps ``initial``. ``abandoned_hold``: the most the
    ticket of an abandoned attempt (per-try timeout, lost hedge, client gone) stays held after its connection
    or stream was closed, for the upstream to let the request go: as long again as the attempt had been
    outstanding, at most this, and sooner when the upstream is seen to let it go (the endpoint answered an
    attempt sent after it, nothing of it was sent, or its answer came and was discarded); 0: back at once."""

    mode: Literal["probing", "fixed"] = "probing"
    initial: int = Field(32, ge=2)  # one read and one write ticket at least
    min: int = Field(4, ge=2)
    max: int = Field(256, ge=2)
    read_write_ratio: float = Field(0.5, ge=0.0, le=1.0)
    step: float = Field(0.1, gt=0.0, lt=1.0)
    ema_weight: float = Field(0.2, gt=0.0, le=1.0)
    interval: Duration = 0.1
    max_queue: int = Field(512, ge=0)
    max_wait: Duration = 1.0
    abandoned_hold: Duration = 2.0
    read_methods: list[str] = []

    @model_validator(mode="after")
    def _bounds(self) -> ConcurrencyConfig:
        if self.mode == "probing":
            if self.min > self.max:
                raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
            if not self.min <= self.initial <= self.max:
                raise ValueError(
                    f"initial ({self.initial}) must be within min and max ([{self.min}, {self.max}])"
                )
        if not self.interval > 0:
            raise ValueError("interval must be positive")
        return self

    @field_validator("read_methods")
    @classmethod
    def _methods(cls, v: list[str]) -> list[str]:
        for m in v:
            if not _GRPC_METHOD.match(m):
                raise ValueError(
                    f"{m!r} is not a gRPC method: write /package.Service/Method or /package.Service/*"
                )
        return v


def _endpoint(value: object) -> str:
    """An endpoint in one of its forms (``sidecar/upstream/target.py``), kept as written."""
    return target.parse(value).text


Endpoint = Annotated[str, BeforeValidator(_endpoint)]


class DnsConfig(Base):
    """How an upstream's names are resolved again (``sidecar/upstream/schedule.py``): every ``refresh``
    (Envoy's dns_refresh_rate), or when the answer's TTL ends (``respect_ttl``, within [1s, refresh]); after a
    failed resolution, ``failure_refresh``, doubling up to ``refresh``; each plus a random 0..``jitter``.
    ``family``: which addresses of a name are endpoints (``auto``: A and AAAA)."""

    refresh: Duration = 5.0
    respect_ttl: bool = False
    failure_refresh: Duration | None = None  # 1s, or refresh when that is shorter
    jitter: Duration = 1.0
    family: Literal["auto", "v4", "v6"] = "auto"

    @field_validator("refresh", "failure_refresh")
    @classmethod
    def _often(cls, v: float | None) -> float | None:
        if v is not None and not MIN_REFRESH <= v < float("inf"):
            raise ValueError(f"must be at least {MIN_REFRESH * 1000:g}ms and finite")
        return v

    @field_validator("jitter")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not v < float("inf"):
            raise ValueError("must be finite")
        return v

    @model_validator(mode="after")
    def _order(self) -> DnsConfig:
        if self.failure_refresh is None:
            object.__setattr__(self, "failure_refresh", min(1.0, self.refresh))  # frozen: set once, here
        elif self.failure_refresh > self.refresh:
            raise ValueError("failure_refresh must not exceed refresh")
        return self


#: The shortest refresh: a fleet of sidecars re-resolving more often than this only loads the DNS servers.
MIN_REFRESH = 0.1


Compressor = Literal["zstd", "snappy", "zlib"]


class UpstreamConfig(Base):
    endpoints: list[Endpoint] = []  # required unless a MongoDB upstream's uri names them
    dns: DnsConfig | None = None  # the loader fills in the defaults for an upstream with a name
    overload_cooldown: Duration = 5.0
    outlier_detection: OutlierDetectionConfig = OutlierDetectionConfig()
    connect_timeout: Duration = 2.0
    max_connections: int = Field(256, ge=1)  # per endpoint
    # MongoDB upstreams
    replica_set: str | None = None
    tls: TlsConfig | None = None
    auth: AuthConfig | None = None
    retry_budget: RetryBudgetConfig | None = None
    concurrency: ConcurrencyConfig | None = None  # None: no limit on attempts in flight
    # A MongoDB upstream as a connection string (config/mongo_uri.py): it fills in the keys above it sets
    uri: str | None = None
    compressors: list[Compressor] = []  # MongoDB: offered to the upstream, in this order of preference
    _uri: Any = PrivateAttr(None)

    @field_validator("uri")
    @classmethod
    def _uri_readable(cls, v: str | None) -> str | None:
        if v is not None:
            from .mongo_uri import parse

            parse(v)
        return v

    @model_validator(mode="after")
    def _from_uri(self) -> UpstreamConfig:
        if self.uri is None:
            if not self.endpoints:
                raise ValueError("give endpoints (or, for a MongoDB upstream, uri)")
            return self
        from .mongo_uri import parse

        u = parse(self.uri)
        self._uri = u
        given = self.model_fields_set  # a key also given explicitly is an error (loader.py); keep it here

        def fill(key: str, value: Any) -> None:
            if key not in given:
                object.__setattr__(self, key, value)  # frozen: set once, here

        fill("endpoints", list(u.hosts))
        if u.replica_set is not None:
            fill("replica_set", u.replica_set)
        if u.tls:
            fill(
                "tls",
                TlsConfig(
                    ca_file=u.tls_ca_file,
                    cert_file=u.tls_cert_key_file,
                    server_name=None,
                    insecure_skip_verify=u.tls_insecure,
                ),
            )
        if u.username is not None:
            fill(
                "auth",
                AuthConfig(
                    username=u.username, password=u.password or "", source=u.source, mechanism=u.mechanism
                ),
            )
        if u.compressors:
            fill("compressors", list(u.compressors))
        if u.connect_timeout is not None:
            fill("connect_timeout", u.connect_timeout)
        if u.max_pool_size is not None:
            fill("max_connections", u.max_pool_size)
        return self

    @property
    def mongo_uri(self) -> Any:
        """The parsed ``uri`` (a ``mongo_uri.MongoUri``), or ``None``."""
        return self._uri


# -- admission (issue 12: the door; sidecar/gates/door.py) ------------------------------------------------
def _cidr(value: object) -> str:
    """An address range (``10.0.0.0/8``, ``::1/128``; a bare address is one host), normalised."""
    import ipaddress

    if not isinstance(value, str):
        raise ValueError("expected an address range such as 10.0.0.0/8 or 127.0.0.1/32")
    try:
        return str(ipaddress.ip_network(value.strip(), strict=True))
    except ValueError as e:
        raise ValueError(f"{value!r} is not an address range ({e})") from None


Cidr = Annotated[str, BeforeValidator(_cidr)]


def _host_name(value: object) -> str:
    """A DNS name as a browser writes it in ``Host`` (``sidecar.orders.svc``), without port or scheme;
    lowercased."""
    import re

    if not isinstance(value, str) or not re.fullmatch(
        r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?",
        value,
    ):
        raise ValueError(f"{value!r} is not a host name (write the name alone: no port, no scheme, no path)")
    return value.lower().rstrip(".")


HostName = Annotated[str, BeforeValidator(_host_name)]


class RateLimitConfig(Base):
    """A token bucket: ``rate`` a second once ``burst`` seconds of it are spent (``admission.RateLimiter``)."""

    rate: float
    burst: Duration = 1.0

    @field_validator("rate", "burst")
    @classmethod
    def _positive_finite(cls, v: float, info: ValidationInfo) -> float:
        if not 0 < v < float("inf"):
            raise ValueError(f"{info.field_name} must be positive and finite")
        return v


class RequestLimitConfig(RateLimitConfig):
    """The seed's IngressRequestRateLimiter: a token bucket per listener, checked once a request's head is
    read. ``rate`` requests a second once ``burst`` seconds of it are spent; up to ``max_queue`` requests
    wait for a borrowed token, never longer than ``max_wait`` nor past their own deadline. ``scope: fleet``:
    ``rate`` and ``burst`` are the whole fleet's (every sidecar sharing ``fleet.redis.key_prefix``), each
    sidecar spending leases settled with Redis in the background (issue 15, ``sidecar/fleet``)."""

    max_queue: int = Field(0, ge=0)
    max_wait: OptionalDuration = 0.1
    exempt_cidrs: list[Cidr] = []
    scope: Literal["local", "fleet"] = "local"


class ConnectionLimitConfig(RateLimitConfig):
    """The seed's SessionEstablishmentRateLimiter: new connections a second, checked at accept. Over the
    rate a connection waits unread (up to ``max_queue`` of them), or is closed at once."""

    max_queue: int = Field(64, ge=0)
    bypass_cidrs: list[Cidr] = []


class AdmissionConfig(Base):
    """A named admission profile, used by listeners as ``admission: NAME``."""

    requests: RequestLimitConfig | None = None
    connections: ConnectionLimitConfig | None = None
    shadow: bool = False  # admit everything; count would-be rejections (label shadow="true")


# -- listeners --------------------------------------------------------------------------------------
class ListenerBase(Base):
    name: str = Field(min_length=1)
    listen: HostPort
    upstream: str
    policy: str | None = None  # None: the protocol's preset (http-default, grpc-a6, mongodb-backpressure)
    #: Connections held at once; more wait in the kernel's backlog (HTTP, MongoDB) or are closed (gRPC).
    max_connections: int = Field(4096, ge=1)
    admission: str | None = None  # a profile of the top-level ``admission:`` (None: everything admitted)


class RouteMatch(Base):
    path_prefix: str | None = None
    host: str | None = None

    @model_validator(mode="after")
    def _something(self) -> RouteMatch:
        if self.path_prefix is None and self.host is None:
            raise ValueError("a route match needs path_prefix and/or host")
        if self.path_prefix is not None and not self.path_prefix.startswith("/"):
            raise ValueError("path_prefix must start with '/'")
        return self


class RouteConfig(Base):
    match: RouteMatch
    upstream: str | None = None  # None: the listener's
    policy: str | None = None  # None: the listener's
    retry_non_idempotent: bool | None = None


class HttpListenerConfig(ListenerBase):
    protocol: Literal["http"]
    routes: list[RouteConfig] = []
    retry_non_idempotent: bool = False
    max_header_size: Size = 64 * 1024
    #: The whole request head (request line and headers) must arrive within this, from its first byte: else
    #: 408 and close (a client trickling a byte at a time cannot hold a connection; Envoy's
    #: request_headers_timeout, HAProxy's timeout http-request).
    header_timeout: Duration = 10.0
    idle_timeout: Duration = 60.0
    request_body_timeout: Duration = 60.0  # a request body from which nothing arrives this long: 408
    #: Paths never rate limited (health checks): exact, or a prefix when the entry ends with ``*``.
    exempt_paths: list[str] = []
    #: ``Upgrade`` protocols a request may switch to (forwarded with the upgrade; on 101 the connection becomes
    #: a tunnel). Others (``h2c``) are dropped: the request goes as a plain one.
    upgrades: list[Literal["websocket"]] = ["websocket"]
    #: A tunnel through which nothing passed either way for this long is closed.
    tunnel_idle_timeout: Duration = 3600.0

    @field_validator("exempt_paths")
    @classmethod
    def _paths(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p.startswith("/"):
                raise ValueError(f"{p!r}: an exempt path starts with '/'")
            if "*" in p[:-1]:
                raise ValueError(f"{p!r}: '*' may only end an exempt path (a prefix)")
        return v

    @field_validator("header_timeout", "tunnel_idle_timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError("must be positive")
        return v


class GrpcListenerConfig(ListenerBase):
    protocol: Literal["grpc"]
    method_policies: dict[str, str] = {}
    #: A deadline cap per method key, as a service config's ``timeout`` (filled from ``service_config``).
    method_timeouts: dict[str, Duration] = {}
    service_config: dict[str, Any] | str | None = None
    max_message_size: Size = 4 * 1024 * 1024
    #: A connection with no call for this long gets GOAWAY (grpcio's max_connection_idle; Envoy's default).
    idle_timeout: Duration = Field(3600.0, gt=0)
    #: Methods whose request is one message (unary and server-streaming ones), as method_policies keys:
    #: forwarded upstream in grpc's single-request form, which costs the sidecar less per call.
    unary_requests: list[str] = []


class AppUserConfig(Base):
    """One user who may log in to a MongoDB listener (``app_auth.users``); its commands go upstream over
    connections logged in as this same user (when the upstream has a login at all)."""

    username: str = Field(min_length=1)
    password: str = Field(json_schema_extra={"secret": True})
    source: str = Field("admin", min_length=1)


class AppAuthConfig(Base):
    """The app's own login, verified by the sidecar with SCRAM (``adapters/mongo/login.py``).
    ``users`` absent: the upstream's own user (its ``uri`` or ``auth``)."""

    users: list[AppUserConfig] | None = None
    allow_unauthenticated: bool = False  # a connection that never logs in acts as the upstream's identity

    @field_validator("users")
    @classmethod
    def _distinct(cls, v: list[AppUserConfig] | None) -> list[AppUserConfig] | None:
        seen: set[tuple[str, str]] = set()
        for u in v or ():
            if (u.source, u.username) in seen:
                raise ValueError(f"user {u.username!r} (source {u.source!r}) is listed twice")
            seen.add((u.source, u.username))
        return v


class ListenerTlsConfig(Base):
    """TLS on a listener: its certificate (``cert_file``, with ``key_file`` unless the key is in the same
    PEM); with ``ca_file``, every client must present a certificate that CA signed."""

    cert_file: str
    key_file: str | None = None
    ca_file: str | None = None

    @model_validator(mode="after")
    def _loadable(self) -> ListenerTlsConfig:
        import ssl

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"cannot load the certificate and key ({self.cert_file}): {e}") from None
        if self.ca_file is not None:
            try:
                ctx.load_verify_locations(self.ca_file)
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"cannot load ca_file {self.ca_file}: {e}") from None
        return self


class MongoListenerConfig(ListenerBase):
    protocol: Literal["mongodb"]
    max_message_size: Size = 48 * 1000 * 1000
    idle_timeout: Duration = Field(600.0, gt=0)  # no request and no partial message this long: closed
    message_timeout: Duration = Field(30.0, gt=0)  # a message begun must be complete this soon: closed
    app_auth: AppAuthConfig | None = None  # None: the app may not log in (code 18), as before
    tls: ListenerTlsConfig | None = None
    compressors: list[Compressor] = []  # offered to the app, in this order of preference


ListenerConfig = Annotated[
    HttpListenerConfig | GrpcListenerConfig | MongoListenerConfig, Field(discriminator="protocol")
]
PROTOCOL_PRESETS = {"http": "http-default", "grpc": "grpc-a6", "mongodb": "mongodb-backpressure"}


# -- top level --------------------------------------------------------------------------------------
def _nameserver(value: object) -> str:
    """A nameserver's ``address[:port]`` (port 53 when omitted), as ``address:port``."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a nameserver's IP address, with :port when not 53")
    v = value.strip()
    if target.is_ip(v):
        return target.join_host_port(v, 53)
    try:
        host, port = target.split_host_port(v)
    except ValueError:
        host, port = "", 0
    if not target.is_ip(host):
        raise ValueError(f"{v!r}: a nameserver is an IP address (with :port when not 53), not a name")
    if port == 0:
        raise ValueError(f"{v!r}: port 0 is not a nameserver's port")
    return target.join_host_port(host, port)


Nameserver = Annotated[str, BeforeValidator(_nameserver)]


class ResolverConfig(Base):
    """Where names are resolved (``sidecar/upstream/resolver.py``): ``nameservers`` (``None``: the system's,
    from /etc/resolv.conf with its search list), each asked in turn for up to ``timeout``. Names in
    /etc/hosts are answered from it first, as the system resolver does."""

    nameservers: list[Nameserver] | None = Field(None, min_length=1)
    timeout: Duration = 2.0

    @field_validator("timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not 0 < v < float("inf"):
            raise ValueError("timeout must be positive and finite")
        return v


class AdminConfig(Base):
    listen: HostPort | None = "127.0.0.1:9901"
    #: Who may use the console (the page at ``/``, ``/api/...``, ``sidecar tap`` and ``top``) besides loopback
    #: clients: address ranges. ``/metrics``, ``/config`` and the probes answer everyone, as before.
    console_allow: list[Cidr] = []
    #: The names the console may be reached by, besides IP addresses and ``localhost``: a browser's request
    #: under any other ``Host`` is refused (a page elsewhere whose name was made to resolve to this address,
    #: DNS rebinding, may not read the console).
    console_hosts: list[HostName] = []


class TracesConfig(Base):
    exporter: Literal["none", "console", "otlp"] = "none"
    endpoint: str | None = None
    protocol: Literal["grpc", "http"] = "grpc"
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)


class TelemetryConfig(Base):
    service_name: str = "retry-sidecar"
    traces: TracesConfig = TracesConfig()


class ShutdownConfig(Base):
    grace: Duration = 10.0


class LimitsConfig(Base):
    """Process-wide bounds (docs/hardening.md)."""

    #: Bytes every listener's buffers may hold together (MongoDB messages being read, ...): a connection
    #: that would pass it stops being read until room comes, and is closed if it stays stalled past its
    #: timeout.
    max_buffered_bytes: Size = Field(256 * 1024 * 1024, ge=1)


# -- fleet (budgets shared through Redis: sidecar/fleet) ---------------------------------------------
class FleetRedisConfig(Base):
    url: str = "redis://127.0.0.1:6379/0"  # redis:// or rediss:// (TLS); the password in the URL
    timeout: Duration = 0.005  # the most any Redis call may delay anything
    key_prefix: str = Field("retry-sidecar:", min_length=1)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as e:
            raise ValueError(f"not a Redis URL: {e}") from None
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"{redact_userinfo(v)!r} is not a redis:// or rediss:// URL")
        if not parts.hostname:
            raise ValueError(f"{redact_userinfo(v)!r} names no host")
        return v

    @field_validator("timeout")
    @classmethod
    def _positive_timeout(cls, v: float) -> float:
        if not 0 < v < float("inf"):
            raise ValueError("timeout must be positive and finite")
        return v


class FleetConfig(Base):
    redis: FleetRedisConfig = FleetRedisConfig()
    lease: Duration = 0.2  # how often a sidecar settles with Redis
    fallback_members: int = Field(1, ge=1)  # sidecars assumed alive when none has been seen

    @field_validator("lease")
    @classmethod
    def _positive_lease(cls, v: float) -> float:
        if not 0 < v < float("inf"):
            raise ValueError("lease must be positive and finite")
        return v


class Config(Base):
    admin: AdminConfig = AdminConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    limits: LimitsConfig = LimitsConfig()
    policies: dict[str, PolicyConfig] = {}
    admission: dict[str, AdmissionConfig] = {}
    resolver: ResolverConfig = ResolverConfig()
    upstreams: dict[str, UpstreamConfig] = {}
    listeners: list[ListenerConfig] = []
    #: What ``${VAR}`` expansion put in (``env.Expansions``), set by the loader: the effective configuration
    #: and the logs hide it (``redact.py``).
    _expansions: Any = PrivateAttr(default=None)

    @property
    def expansions(self) -> Any:
        return self._expansions

    fleet: FleetConfig | None = None

    def policy(self, name: str) -> PolicyConfig:
        return self.policies[name]

    def discovered_upstreams(self) -> set[str]:
        """Upstreams whose names are resolved to addresses, each address an endpoint (HTTP and gRPC, issue
        21): every one but those only MongoDB listeners use (a driver's connection resolves their members)."""
        mongo = {lc.upstream for lc in self.listeners if lc.protocol == "mongodb"}
        other: set[str] = set()
        for lc in self.listeners:
            if lc.protocol != "mongodb":
                other.add(lc.upstream)
                other.update(r.upstream for r in getattr(lc, "routes", ()) if r.upstream is not None)
        return {name for name in self.upstreams if name not in mongo or name in other}
