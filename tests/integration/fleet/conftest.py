"""Fleet tests: real redis-server processes (never a fake), sidecars as in-process Apps on one event loop,
real aiohttp clients, a real fault-injecting upstream (sidecar/testing/http_upstream.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.testing.redis_server import RedisServer, binary


@pytest.fixture(scope="session")
def redis_binary() -> str:
    try:
        return binary()
    except RuntimeError as e:  # not a skip: make test must have one (tools/ensure-redis.sh)
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def redis_session(redis_binary: str) -> Iterator[RedisServer]:
    """One throwaway server per session for tests that only need Redis to answer (each uses its own prefix)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_own(redis_binary: str) -> Iterator[RedisServer]:
    """A server of the test's own, to pause, kill and restart."""
    server = RedisServer().start()
    yield server
    server.kill()
