"""The thin driver of a polled record (``upstream/poller.py``): it looks at once, hands every result over,
waits what the schedule says, and survives a lookup that raises; and /etc/hosts as the resolver reads it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from sidecar.upstream.poller import Poller
from sidecar.upstream.resolver import HostsFile


async def test_a_poller_looks_at_once_then_on_schedule_and_survives_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = iter([ValueError("a bug"), "first", "second"])
    seen: list[str] = []
    waits: list[str] = []
    enough = asyncio.Event()

    async def lookup() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def after(result: str) -> float:
        waits.append(result)
        return 0.0

    def on_result(result: str) -> None:
        seen.append(result)
        if len(seen) == 2:
            enough.set()

    poller = Poller("test record", lookup, after, on_result, retry=0.0)
    with caplog.at_level(logging.ERROR, logger="sidecar.dns"):
        poller.start()
        poller.start()  # once is enough
        await poller.first()
        await enough.wait()
        await poller.stop()
    assert seen == ["first", "second"] and waits == ["first", "second"]
    assert not poller.running and poller.results == 2
    assert "test record: the lookup failed unexpectedly" in caplog.text


def test_the_hosts_file_lists_names_and_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# comment\n127.0.0.1 localhost Localhost.Localdomain. # trailing\n::1 ip6-localhost\n\n")
    hosts = HostsFile(str(path))
    assert hosts.lists("localhost") and hosts.lists("LOCALHOST.localdomain") and hosts.lists("ip6-localhost.")
    assert not hosts.lists("comment") and not hosts.lists("trailing") and not hosts.lists("127.0.0.1")
    path.write_text("10.0.0.1 orders.internal\n")
    assert hosts.lists("orders.internal") and not hosts.lists("localhost")
    path.unlink()
    assert not hosts.lists("orders.internal")  # no file: no name from it
