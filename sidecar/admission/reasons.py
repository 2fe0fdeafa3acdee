"""What admission counts, which limiter refuses and why: names shared by the limiters, the metrics and the spans.

``Limiter`` values are the ``limiter`` label of the metrics and of a refused request's span.
``Count`` values are the stems of the metrics (``sidecar_admission_<value>_total``), after the seed's
``serverStatus`` fields (attemptedAdmissions, successfulAdmissions, ...). ``Rejection`` values are the
``reason`` label of ``sidecar_admission_rejected_total`` and of a rejected request's span.
"""

from __future__ import annotations

from enum import StrEnum


class Limiter(StrEnum):
    REQUESTS = "requests"  # a listener's request rate (the seed's IngressRequestRateLimiter)
    CONNECTIONS = "connections"  # a listener's new connections (the seed's SessionEstablishmentRateLimiter)
    CONCURRENCY = "concurrency"  # an endpoint's tickets (the seed's execution control)


class Count(StrEnum):
    ATTEMPTED = "attempted"  # asked for admission (exemptions excluded)
    SUCCESSFUL = "successful"  # admitted, at once or after queueing
    REJECTED = "rejected"  # refused (see Rejection)
    EXEMPTED = "exempted"  # never limited (exempt address or operation)
    ADDED_TO_QUEUE = "added_to_queue"
    REMOVED_FROM_QUEUE = "removed_from_queue"  # left the queue, admitted or not
    INTERRUPTED_IN_QUEUE = "interrupted_in_queue"  # the client went away while queued


class Rejection(StrEnum):
    RATE_EXCEEDED = "rate-exceeded"  # no token now, and this limiter never queues (max_queue 0, try_acquire)
    QUEUE_FULL = "queue-full"  # waiting was needed and max_queue waiters already wait
    MAX_WAIT = "max-wait"  # the wait would exceed (or did reach) max_wait
    DEADLINE = "deadline"  # the wait would end at or past the request's own deadline
