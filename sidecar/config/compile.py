"""Turn validated configuration into the engine's immutable policy objects."""

from __future__ import annotations

from ..policy.outcome import OutcomeClass
from ..policy.spec import BackoffSpec, HedgingSpec, RetryPolicy, ThrottleKind, ThrottleSpec
from .schema import GrpcThrottleConfig, MongoThrottleConfig, PolicyConfig


def throttle_spec(cfg: GrpcThrottleConfig | MongoThrottleConfig | None) -> ThrottleSpec | None:
    if cfg is None:
        return None
    if isinstance(cfg, GrpcThrottleConfig):
        return ThrottleSpec(ThrottleKind.GRPC, max_tokens=cfg.max_tokens, token_ratio=cfg.token_ratio)
    return ThrottleSpec(
        ThrottleKind.MONGODB, capacity=cfg.capacity, retry_cost=cfg.retry_cost, return_rate=cfg.return_rate
    )


def retry_policy(name: str, cfg: PolicyConfig) -> RetryPolicy:
    retry_on = frozenset(cfg.retry_on)
    hedging = None
    if cfg.hedging is not None:
        non_fatal = frozenset(cfg.hedging.non_fatal) if cfg.hedging.non_fatal is not None else retry_on
        hedging = HedgingSpec(cfg.hedging.max_attempts, cfg.hedging.delay, non_fatal)
    b = cfg.backoff
    return RetryPolicy(
        name=name,
        max_attempts=cfg.max_attempts,
        retry_on=retry_on,
        backoff=BackoffSpec(b.initial, b.max, b.multiplier, b.jitter),
        backoff_on=frozenset(cfg.backoff_on),
        per_try_timeout=cfg.per_try_timeout,
        pushback=cfg.pushback,
        throttle=throttle_spec(cfg.throttle),
        deadline=cfg.deadline.default,
        hedging=hedging,
        transparent_retry=cfg.transparent_retry,
        deprioritize_overloaded=cfg.deprioritize_overloaded,
    )


__all__ = ["OutcomeClass", "retry_policy", "throttle_spec"]
