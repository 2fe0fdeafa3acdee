"""The live engine end to end: the processes start, the outage is a real SIGSTOP, the records add up, and
nothing is left running. Assertions are about counts, never durations."""

from __future__ import annotations

import os

from sidecar.simulate.live import engine

from .conftest import compressed


def children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ", 1)[1].split()[1] == me:
                        out.add(int(pid))
            except (OSError, IndexError):
                pass
    return out


def test_fixed_interval_clients_against_a_stopped_server() -> None:
    sc = compressed(outage={"start": "4s", "duration": "2s", "mode": "stop"})
    before = children()
    rec = engine.run(sc, "fixed")
    assert children() == before  # every process was ended
    s = rec.seconds
    offered = sum(x.offered for x in s)
    assert 600 < offered < 1400
    assert offered == sum(x.ok + x.failed for x in s) + rec.unfinished
    assert s[5].ok == 0  # stopped: nothing answers
    assert s[5].timeouts + s[6].timeouts > 0  # the clients gave up on the attempts it held
    assert sum(x.ok for x in s[7:]) > 100  # answers again after SIGCONT
    assert all(x.inflight >= 0 for x in s)
    # before the outage, 5% of answers are 503 and each is retried: ~1.05 attempts per request
    before_outage = sum(x.attempts for x in s[1:4]) / sum(x.offered for x in s[1:4])
    assert 1.0 < before_outage < 1.15


def test_the_sidecar_with_tickets_against_a_stopped_server() -> None:
    """``sidecar+tickets``: the real sidecar process with ``sidecar.tickets`` as its upstream's concurrency
    block (15 read tickets, no queue). An abandoned attempt keeps its ticket, so the stopped server's backlog
    gets a few dozen requests, not every one offered while it is stopped (about 200)."""
    sc = compressed(
        outage={"start": "4s", "duration": "2s", "mode": "stop"},
        server={"error_rate": 0.0},
        sidecar={"tickets": {"mode": "fixed", "initial": 30, "max_queue": 0, "max_wait": "0s"}},
    )
    before = children()
    rec = engine.run(sc, "sidecar+tickets")
    assert children() == before
    s = rec.seconds
    offered = sum(x.offered for x in s)
    assert offered == sum(x.ok + x.failed for x in s) + rec.unfinished
    assert s[5].ok == 0 and s[4].errors + s[5].errors > 50  # refused at once while the tickets are held
    assert max(x.inflight for x in s) < 60  # what the stopped server held when it resumed
    assert sum(x.ok for x in s[7:]) > 100  # answers again after SIGCONT
