"""Bounded fuzzing of the three wire formats through a running ``sidecar run`` (sidecar/testing/fuzz):
mutated real HTTP/1.1 requests, HTTP/2 frames after a valid preface for gRPC, and MongoDB OP_MSG/OP_QUERY/
OP_COMPRESSED messages with broken headers, lengths, sections and BSON. The sidecar must live, a good
client on another connection must never fail, and its log must show no traceback.

Seeded and reproducible: a failure names the seed and the input indices; ``FUZZ_SEED``/``FUZZ_COUNT`` change
them, and ``sidecar.testing.fuzz.inputs.<format>(seed, index)`` rebuilds one input. ``bench/fuzz.py`` runs
100,000 per format.
"""

from __future__ import annotations

import os

import pytest

from sidecar.testing.fuzz.inputs import FORMATS
from sidecar.testing.fuzz.run import fuzz_format, running

SEED = int(os.environ.get("FUZZ_SEED", "16"))
COUNT = int(os.environ.get("FUZZ_COUNT", "5000"))


@pytest.mark.parametrize("fmt", FORMATS)
async def test_no_input_hurts_the_sidecar(fmt: str) -> None:
    async with running([fmt]) as (sidecar, clients):
        report = await fuzz_format(sidecar, clients, fmt, COUNT, SEED)
    assert not report.failures, "\n".join(report.failures)
    assert report.sent == COUNT
    # the good client was asked throughout and answered (but in the grpcio defect's window: run.py)
    assert report.good + report.grpcio_defect >= COUNT // 100 and report.good > report.grpcio_defect
