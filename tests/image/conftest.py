"""The built image, run with podman (``make image-test`` builds it and sets SIDECAR_IMAGE and the podman
configuration; see deploy/ci/podman.sh)."""

from __future__ import annotations

import os

import pytest

IMAGE = os.environ.get("SIDECAR_IMAGE", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IMAGE:
        return
    reason = "image tests need a built image and podman: run `make image-test` (.ci/run does); SIDECAR_IMAGE is not set"
    for item in items:
        if "tests/image/" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "tests/image/" in r.nodeid]
    if skipped and not IMAGE:
        terminalreporter.write_line(
            f"NOTE: {len(skipped)} image test(s) skipped: the image is tested by `make image-test` (.ci/run runs it)",
            yellow=True,
            bold=True,
        )
