"""Budgets shared by every sidecar of a fleet through Redis, never on a request's path (docs/fleet.md).

``member.py``: pure accounting (reports, grants, the fall back to a local share); ``script.py``: the one
atomic Redis script; ``link.py``: the background task that settles every ``fleet.lease``.
"""

from .member import FleetMember, PoolSpec, Report, RetryBudgetShare, Share, keys
from .script import SETTLE

__all__ = ["SETTLE", "FleetMember", "PoolSpec", "Report", "RetryBudgetShare", "Share", "keys"]
