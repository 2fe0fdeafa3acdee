"""The ``sidecar`` command's entry point: ``sidecar run`` straight to ``run_command.py``, every other command
through the CLI framework (``cli.py``), which ``sidecar run`` never imports (see ``run_command.py``)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    # gRPC's C core logs connection churn (GOAWAY at shutdown) at INFO on stderr; keep its errors only,
    # unless the user asked for more.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if sys.argv[1:2] == ["run"]:
        from .run_command import main as run

        sys.exit(run(sys.argv[2:]))
    from .cli import app

    app()
