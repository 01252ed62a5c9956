"""The ``kubeplane`` command."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from kubeplane import __version__


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _run(main_coro_factory) -> None:
    """Runs until SIGINT/SIGTERM, then shuts down cleanly."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover
                pass
        await main_coro_factory(stop)

    try:
        asyncio.run(runner())
    except KeyboardInterrupt:  # pragma: no cover
        pass


_server_options = [
    click.option("--data-dir", default="data", show_default=True, help="Directory for the SQLite database."),
    click.option("--listen", default="127.0.0.1:6443", show_default=True,
                 help="HOST:PORT to serve on; port 0 picks a free port. Loopback by default."),
    click.option("--kubeconfig", "kubeconfig", default=None,
                 help="Write a kubeconfig for this server here once it is ready."),
    click.option("--storage", type=click.Choice(["sqlite", "memory"]), default="sqlite", show_default=True),
    click.option("--history-revisions", type=click.IntRange(min=1), default=10_000, show_default=True,
                 help="Revisions of history kept for watches and consistent lists (older ones answer 410 Gone)."),
    click.option("-v", "--verbose", is_flag=True, help="Debug logging."),
]


def server_options(f):
    for opt in reversed(_server_options):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubeplane")
def main() -> None:
    """kubeplane: a Kubernetes control plane in Python."""


@main.command()
@server_options
def apiserver(data_dir: str, listen: str, kubeconfig: str | None, storage: str, history_revisions: int,
              verbose: bool) -> None:
    """Run the API server alone."""
    from kubeplane.apiserver.app import APIServer, APIServerConfig, parse_listen

    _setup_logging(verbose)
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    server = APIServer(APIServerConfig(data_dir=data_dir, listen=listen, storage=storage, kubeconfig=kubeconfig,
                                         history_revisions=history_revisions))

    async def go(stop: asyncio.Event) -> None:
        await server.start()
        click.echo(f"kubeplane API server ready at {server.url}", err=True)
        try:
            await stop.wait()
        finally:
            await server.stop()

    _run(go)


@main.command()
@server_options
def up(data_dir: str, listen: str, kubeconfig: str | None, storage: str, history_revisions: int,
              verbose: bool) -> None:
    """Run a whole cluster in one process: API server and control plane."""
    from kubeplane.apiserver.app import APIServer, APIServerConfig, parse_listen

    _setup_logging(verbose)
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    if kubeconfig is None:
        import os

        os.makedirs(data_dir, exist_ok=True)
        kubeconfig = os.path.join(data_dir, "kubeconfig")
    server = APIServer(APIServerConfig(data_dir=data_dir, listen=listen, storage=storage, kubeconfig=kubeconfig,
                                         history_revisions=history_revisions))

    async def go(stop: asyncio.Event) -> None:
        await server.start()
        click.echo(f"kubeplane is up: API server at {server.url}", err=True)
        click.echo(f"  kubectl --kubeconfig {kubeconfig} get nodes", err=True)
        try:
            await stop.wait()
        finally:
            await server.stop()

    _run(go)


@main.group()
def bench() -> None:
    """Benchmarks (run on demand)."""


@bench.command("api")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Repetitions per measurement; medians are reported.")
def bench_api(as_json: bool, runs: int) -> None:
    """API machinery: creates/s, list latency, watch latency, memory."""
    import json as _json

    from kubeplane.bench.api import run

    def progress(msg: str) -> None:
        if not as_json:
            click.echo(msg, err=True)

    result = run(runs=runs, progress=progress)
    if as_json:
        click.echo(_json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kubeplane bench api (medians)")
    table.add_column("measurement")
    table.add_column("value", justify="right")
    for k, v in result.items():
        table.add_row(k, str(v))
    Console().print(table)


if __name__ == "__main__":  # pragma: no cover
    main()
