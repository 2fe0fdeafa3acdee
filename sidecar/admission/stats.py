"""The counters one limiter keeps (the seed's ``serverStatus`` section), read by the metrics."""

from __future__ import annotations

from .reasons import Count, Rejection


class AdmissionStats:
    """Monotonic counters; ``rejected`` is also split by reason."""

    __slots__ = (
        "attempted",
        "successful",
        "rejected",
        "exempted",
        "added_to_queue",
        "removed_from_queue",
        "interrupted_in_queue",
        "rejected_by",
    )

    def __init__(self) -> None:
        self.attempted = 0
        self.successful = 0
        self.rejected = 0
        self.exempted = 0
        self.added_to_queue = 0
        self.removed_from_queue = 0
        self.interrupted_in_queue = 0
        self.rejected_by: dict[Rejection, int] = {r: 0 for r in Rejection}

    def reject(self, reason: Rejection) -> None:
        self.rejected += 1
        self.rejected_by[reason] += 1

    def counts(self) -> dict[Count, int]:
        return {
            Count.ATTEMPTED: self.attempted,
            Count.SUCCESSFUL: self.successful,
            Count.REJECTED: self.rejected,
            Count.EXEMPTED: self.exempted,
            Count.ADDED_TO_QUEUE: self.added_to_queue,
            Count.REMOVED_FROM_QUEUE: self.removed_from_queue,
            Count.INTERRUPTED_IN_QUEUE: self.interrupted_in_queue,
        }

    def __repr__(self) -> str:
        inner = ", ".join(f"{k.value}={v}" for k, v in self.counts().items())
        return f"AdmissionStats({inner})"
