"""The ``sidecar`` command's entry point: ``sidecar run`` straight to ``run_command.py``, every other command
through the CLI framework (``cli.py``), which ``sidecar run`` never imports (see ``run_command.py``)."""

from __future__ import annotations

import os
import sys
import types


def main() -> None:
    # gRPC's C core logs connection churn (GOAWAY at shutdown) at INFO on stderr; keep its errors only,
    # unless the user asked for more.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    without_pydantic_plugins()
    if sys.argv[1:2] == ["run"]:
        from .run_command import main as run

        sys.exit(run(sys.argv[2:]))
    from .cli import app

    app()


def without_pydantic_plugins() -> None:
    """The sidecar's config schema is validated with no pydantic plugin: one installed beside it (an
    observability vendor's, say) has no business in the sidecar's config. pydantic's plugin loader
    (``pydantic.plugin._loader``) imports importlib.metadata to read the installed packages' entry points,
    and with it email, zipfile, csv, tempfile, bz2 and lzma: ~1.5 MB of RSS for the life of every pod
    (issue 27), also when plugins are turned off (``PYDANTIC_DISABLE_PLUGINS``). Its place is taken, before
    pydantic is imported, by a loader that finds none; pydantic builds every validator as it does without
    plugins (``tests/integration/test_footprint.py`` checks that importlib.metadata stays out)."""
    loader = types.ModuleType("pydantic.plugin._loader", "pydantic plugins: none (sidecar/entry.py)")
    loader.get_plugins = lambda: ()  # type: ignore[attr-defined]
    sys.modules.setdefault("pydantic.plugin._loader", loader)
