"""Bounded, reproducible fuzzing of the sidecar's three wire formats through a running ``sidecar run``.

``inputs.py`` makes input number ``i`` of a format from ``random.Random(f"{seed}:{format}:{i}")`` alone, so any
input is rebuilt from its seed and index; ``run.py`` starts the upstreams and the sidecar, sends the inputs
on connections of their own while a good client on another connection keeps checking that the sidecar serves,
and reports what went wrong with the indices to replay. ``tests/fuzz/`` runs a few thousand inputs per
format; ``bench/fuzz.py`` runs 100,000.
"""
