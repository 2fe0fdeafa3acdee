"""The one replay buffer both adapters keep requests in (sidecar/adapters/replay.py): positions, the
limit, sealing, trimming, and refusing to replay what was let go."""

from __future__ import annotations

import pytest

from sidecar.adapters.replay import ReplayBuffer


def test_keeps_pieces_by_position_until_trimmed() -> None:
    b = ReplayBuffer(limit=10)
    for p in (b"ab", b"cde", b"f"):
        b.add(p)
    assert (b.end, b.size, b.received, b.at(1)) == (3, 6, 6, b"cde") and b.whole and not b.over_limit()
    b.trim(2)
    assert b.pieces == [b"f"] and b.size == 1 and b.first == 2 and not b.whole
    with pytest.raises(RuntimeError, match="the stream was not kept"):
        b.check_whole("the stream")


def test_limit_seal_and_a_piece_sent_on_unkept() -> None:
    b = ReplayBuffer(limit=4)
    b.add(b"abcde")
    assert b.over_limit() and b.replayable  # the adapter decides when to seal
    assert b.seal() and not b.seal() and not b.replayable
    b.add(b"f", keep=False)  # passed on without being kept: nothing before it can be replayed either
    assert b.pieces == [] and b.size == 0 and b.end == 2 and b.received == 6 and not b.whole
    r = ReplayBuffer(limit=100)
    r.add(b"x" * 50)
    r.restrict(10)
    assert not r.replayable and r.limit == 10
