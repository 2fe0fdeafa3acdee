"""Session checks shared by every test."""

import pytest

from sidecar import native


def pytest_report_header(config: pytest.Config) -> str:
    return "sidecar hot path: " + ("compiled (mypyc)" if native.compiled() else "pure Python")


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = native.stale()
    if stale:
        raise pytest.UsageError(
            f"compiled modules are older than their source ({', '.join(stale)}): the tests would run the old "
            "code. Run `make install` to recompile, or `SIDECAR_NATIVE=0 make install` for pure Python."
        )
