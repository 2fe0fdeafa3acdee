"""A command's walk through the sidecar keeps the layout's rule (docs/ARCHITECTURE.md): followed from its
first byte, no file entered more than twice and no climb back up, for a forwarded command, a refused one and
the sidecar's own hello (``tools/walk.py`` traces a real one)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_command_enters_no_file_more_than_twice_and_never_climbs_back_up() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "walk.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "== find (reply ok=1.0" in run.stdout and "== refused (reply ok=0.0, code=462)" in run.stdout
