"""Everything a request needs from its target (upstream, policy, classification, deadline header, pools),
resolved once per target so the hot path only looks things up."""

from __future__ import annotations

from typing import Final

from ...admit import Way
from ...config.units import split_host_port
from ...policy import OutcomeClass
from ...services import CompiledPolicy, UpstreamRuntime
from ...telemetry.metrics import Meters
from .classify import HttpClassifier
from .upstream import EndpointPools, Pool

#: The policy's ``replay_buffer`` when it does not say (``None``).
DEFAULT_REPLAY_BUFFER: Final = 1024 * 1024


class Plan:
    __slots__ = (
        "upstream_name",
        "policy",
        "upstream",
        "classifier",
        "deadline_lname",
        "deadline_name",
        "deadline_prefix",
        "expired_status",
        "retry_non_idempotent",
        "connect_only",
        "replay_limit",
        "pools",
        "meters",
        "way",
        "tickets",
    )

    def __init__(
        self,
        policy: CompiledPolicy,
        upstream: UpstreamRuntime,
        retry_non_idempotent: bool | None,
        pools: EndpointPools,
        meters: Meters,
        way: Way,
    ) -> None:
        cfg = policy.config
        self.upstream_name = upstream.name
        self.policy = policy
        self.upstream = upstream
        self.classifier = HttpClassifier.from_policy(cfg)
        self.deadline_name = cfg.deadline.header.encode("latin-1")
        self.deadline_lname = self.deadline_name.lower()
        self.deadline_prefix = self.deadline_name + b": "
        self.expired_status = cfg.deadline.expired_status
        self.retry_non_idempotent = (
            cfg.retry_non_idempotent if retry_non_idempotent is None else retry_non_idempotent
        )
        self.connect_only = policy.engine.retry_on & {OutcomeClass.CONNECT_FAILURE}
        self.replay_limit = DEFAULT_REPLAY_BUFFER if cfg.replay_buffer is None else cfg.replay_buffer
        self.pools = pools.by_address
        self.meters = meters  # the (listener, upstream) pair's counters
        self.way = way  # the listener's way in to this upstream under this policy (``admit.py``)
        self.tickets = upstream.concurrency is not None  # its attempts take tickets (read or write)

    def pool(self, endpoint: str) -> Pool:
        pool = self.pools.get(endpoint)
        if pool is None:
            pool = self._new_pool(endpoint)
        return pool

    def _new_pool(self, endpoint: str) -> Pool:
        """The first attempt to ``endpoint`` (an address of the upstream's set). One that left the set since
        it was picked gets a closed pool, kept nowhere: its attempt fails to connect, and goes elsewhere."""
        host, port = split_host_port(endpoint)
        uc = self.upstream.config
        endpoints = self.upstream.endpoints
        pool = Pool(endpoint, host, port, uc.connect_timeout, uc.max_connections, endpoints.name_of(endpoint))
        if endpoints.active(endpoint):
            self.pools[endpoint] = pool
        else:
            pool.close()
        return pool
