"""The des engine is only worth its speed if it tells the truth: on the same compressed scenario, the
sidecar strategy's retry amplification in virtual time and with real processes agree.

Tolerance: 0.05 attempts per request. Over ~900 requests the amplification's own sampling noise is about
0.01 (5% of 503s retried at up to three attempts, binomial), and the budget's first moments of the outage
(how many retries get through before the tokens fall to half) differ by a few retries between engines.
"""

from __future__ import annotations

from sidecar.simulate import des
from sidecar.simulate.live import engine
from sidecar.simulate.summary import amplification

from .conftest import compressed

TOLERANCE = 0.05


def test_sidecar_amplification_agrees_between_des_and_live() -> None:
    sc = compressed(outage={"start": "4s", "duration": "4s", "mode": "error"})
    o = sc.outage
    assert o is not None
    live = engine.run(sc, "sidecar")
    virtual = des.run(sc, "sidecar")
    windows = {
        "before": (sc.warmup, o.start),
        "outage": (o.start, o.end),
        "after": (o.end, sc.duration),
        "all": (sc.warmup, sc.duration),
    }
    for name, (a, b) in windows.items():
        lv, dv = amplification(live, a, b), amplification(virtual, a, b)
        assert lv is not None and dv is not None
        print(f"{name}: live {lv:.3f} des {dv:.3f}")
        assert abs(lv - dv) <= TOLERANCE, f"{name}: live {lv:.3f} vs des {dv:.3f}"
    # the budget bit in both: during the outage the sidecar did not make its three attempts per request
    assert amplification(live, o.start + 1, o.end) < 1.1  # type: ignore[operator]
    # and the live sidecar answered every request: none left open, none lost
    offered = sum(s.offered for s in live.seconds)
    assert offered == sum(s.ok + s.failed for s in live.seconds) + live.unfinished
    assert live.unfinished_old == 0  # nothing waited longer than its timeout
