"""The ``sidecar`` command: run, check, demo, simulate, tap, top, version."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from . import __version__
from .config import ConfigError, effective_yaml, load_file
from .run_command import HELP as RUN_HELP
from .run_command import run_loop as _run

app = typer.Typer(
    name="sidecar",
    help="retry-sidecar: one retry policy for MongoDB, HTTP and gRPC traffic.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(..., "-c", "--config", help="Configuration file (YAML).")


def _load(path: Path):  # noqa: ANN202
    try:
        return load_file(path)
    except ConfigError as e:
        typer.echo(e.render(), err=True)
        raise typer.Exit(2) from None


@app.command(
    help=RUN_HELP + " Options: sidecar run --help.",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def run(ctx: typer.Context) -> None:
    # ``sidecar run`` does not come here (entry.py sends it to run_command.py, its one definition, without
    # loading typer); a caller of this typer app does.
    from .run_command import main as run_main

    raise typer.Exit(run_main(ctx.args))


@app.command()
def check(config: Path = ConfigOption) -> None:
    """Validate a configuration and print it in full (presets spelled out, secrets redacted)."""
    cfg = _load(config)
    typer.echo(effective_yaml(cfg), nl=False)


@app.command()
def demo(
    only: list[str] = typer.Option(None, "--only", help="Run only these parts: http, grpc, mongodb."),
    duration: float = typer.Option(10.0, help="Seconds of load per part."),
    rate: float = typer.Option(200.0, help="Requests per second offered by the demo's clients."),
    admin: str = typer.Option(
        None,
        "--admin",
        help="Serve the console here (host:port; default 127.0.0.1:9901, or a free port if taken).",
    ),
) -> None:
    """Show the sidecar at work: built-in faulty upstreams, the sidecar in front, real client load; its
    console (the live page, sidecar tap, sidecar top) on the admin port while it runs."""
    from .demo import PARTS, PartUnavailable, load_part
    from .demo.runner import run_part

    names = only or list(PARTS)
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        typer.echo(
            f"sidecar demo: unknown part(s) {', '.join(unknown)} (parts: {', '.join(PARTS)})", err=True
        )
        raise typer.Exit(2)
    try:
        parts = [load_part(name) for name in names]
    except PartUnavailable as e:
        typer.echo(f"sidecar demo: {e}", err=True)
        raise typer.Exit(2) from None
    from .demo import console_address

    listen = _admin(admin) if admin is not None else console_address()
    host, _, port = listen.rpartition(":")
    typer.echo(
        f"The console: http://{host}:{port}/ (open it while the demo runs; each part's sidecar serves it in turn;"
        f" longer: sidecar demo --duration 60)\n  in a terminal: sidecar tap --admin {listen}   |   sidecar top"
        f" --admin {listen}"
    )

    async def all_parts() -> None:
        for part in parts:
            await run_part(part, duration, rate, admin=listen)

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        _run(all_parts(), True)
    except KeyboardInterrupt:
        typer.echo("\nstopped")


@app.command()
def simulate(
    scenario: str = typer.Option(
        ...,
        "--scenario",
        help="A shipped scenario (seed-crash, brownout, flaky, long-tail, full-outage) or a YAML file.",
    ),
    engine: str = typer.Option(
        "des", "--engine", help="live: real processes and sockets; des: virtual time."
    ),
    strategy: list[str] = typer.Option(
        None,
        "--strategy",
        help="fixed, backoff, sidecar (repeat, or comma-separated); default: the scenario's.",
    ),
    duration: float = typer.Option(
        None, "--duration", help="Seconds of scenario time (default: the scenario's)."
    ),
    plot: Path = typer.Option(None, "--plot", help="Write a PNG figure here."),
    as_json: bool = typer.Option(
        False, "--json", help="End with one line of JSON: the summary per strategy."
    ),
    set_: list[str] = typer.Option(
        None, "--set", help="Change a scenario key: --set clients.rate=200 (repeatable)."
    ),
    table: bool = typer.Option(True, help="Print the per-second table of each strategy."),
    sidecars: int = typer.Option(
        None, "--sidecars", help="Sidecar instances sharing the clients (sets sidecar.instances)."
    ),
) -> None:
    """Overload lab: many clients, a server with the seed's latency law, an outage; fixed-interval retries,
    exponential backoff and the sidecar compared (see docs/simulate.md)."""
    from .simulate.command import main as simulate_main

    if sidecars is not None:
        set_ = [*(set_ or []), f"sidecar.instances={sidecars}"]
    code = simulate_main(scenario, engine, strategy, duration, plot, as_json, set_, table)
    if code:
        raise typer.Exit(code)


AdminOption = typer.Option(
    "127.0.0.1:9901",
    "--admin",
    help="The sidecar's admin port, host:port (kubectl port-forward brings it here).",
)


def _admin(value: str) -> str:
    from .config.units import split_host_port

    try:
        split_host_port(value)
    except ValueError as e:
        typer.echo(f"--admin: {e}", err=True)
        raise typer.Exit(2) from None
    return value


@app.command()
def tap(
    admin: str = AdminOption,
    upstream: str = typer.Option(None, "--upstream", help="Only the requests to this upstream."),
    listener: str = typer.Option(None, "--listener", help="Only the requests of this listener."),
) -> None:
    """A line per request as the sidecar handles it: route, attempts with their endpoints, outcomes, decisions
    and waits, the result and the total time (the console's tap, read from the admin port)."""
    from .admin.console_terminal import tap as run_tap

    raise typer.Exit(run_tap(_admin(admin), upstream=upstream, listener=listener))


@app.command()
def top(
    admin: str = AdminOption,
    interval: float = typer.Option(1.0, help="Seconds between two screens."),
) -> None:
    """A table per upstream and endpoint, redrawn every second: requests/s, success, attempts per request,
    retries by cause, p50/p99, each endpoint's state, load, concurrency and recent outcomes."""
    from .admin.console_terminal import top as run_top

    raise typer.Exit(run_top(_admin(admin), interval=max(0.1, interval)))


@app.command()
def version() -> None:
    """Print the version, and whether the hot path runs compiled."""
    from . import native

    how = "hot path compiled with mypyc" if native.compiled() else "pure Python"
    typer.echo(f"retry-sidecar {__version__} ({how})")
