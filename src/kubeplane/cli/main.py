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


def _node_options(f):
    opts = [
        click.option("--nodes", "node_count", type=click.IntRange(min=0), default=3, show_default=True,
                     help="Simulated nodes to register."),
        click.option("--node-cpu", default="4", show_default=True, help="CPU capacity of each simulated node."),
        click.option("--node-memory", default="32Gi", show_default=True, help="Memory of each simulated node."),
        click.option("--node-pods", type=click.IntRange(min=1), default=110, show_default=True,
                     help="Pod capacity of each simulated node."),
        click.option("--zones", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Spread simulated nodes over this many zones (topology.kubernetes.io/zone)."),
        click.option("--node-prefix", default="node", show_default=True, help="Simulated node names: PREFIX-<i>."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _node_agent(client, factory, node_count, node_cpu, node_memory, node_pods, zones, node_prefix):
    from kubeplane.controllers.nodeagent import NodeAgent, NodeSpec

    names = [f"{node_prefix}-{i}" for i in range(node_count)]
    spec = NodeSpec(cpu=node_cpu, memory=node_memory, pods=node_pods, zones=zones)
    return NodeAgent(client, names, spec, factory)


@main.command()
@server_options
@_node_options
@click.option("--scheduler-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="KubeSchedulerConfiguration file for the built-in scheduler.")
def up(data_dir: str, listen: str, kubeconfig: str | None, storage: str, history_revisions: int,
       verbose: bool, node_count: int, node_cpu: str, node_memory: str, node_pods: int, zones: int,
       node_prefix: str, scheduler_config: str | None) -> None:
    """Run a whole cluster in one process: API server, scheduler, controllers, simulated nodes."""
    import os

    from kubeplane.apiserver.app import APIServer, APIServerConfig, parse_listen
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.cluster import Components, ControllerOptions, build_controllers

    _setup_logging(verbose)
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    os.makedirs(data_dir, exist_ok=True)
    if kubeconfig is None:
        kubeconfig = os.path.join(data_dir, "kubeconfig")
    sched_kwargs = _scheduler_kwargs(scheduler_config)
    server = APIServer(APIServerConfig(data_dir=data_dir, listen=listen, storage=storage, kubeconfig=None,
                                       history_revisions=history_revisions))

    async def go(stop: asyncio.Event) -> None:
        from kubeplane.scheduler.scheduler import Scheduler

        await server.start()
        comps = Components()
        try:
            client = InProcessClient(server.registry, field_manager="kubeplane")
            factory = SharedInformerFactory(client)
            agent = _node_agent(client, factory, node_count, node_cpu, node_memory, node_pods, zones, node_prefix)
            for ctrl in build_controllers(client, factory, ControllerOptions()):
                await comps.start(ctrl)
            await comps.start(agent)
            scheduler = Scheduler(client, informer_factory=factory, **sched_kwargs)
            comps.run(scheduler.run(), "scheduler")
            comps.items.append(scheduler)
            # Written last: the kubeconfig appearing means the cluster is usable.
            from kubeplane.client.kubeconfig import write_kubeconfig

            write_kubeconfig(kubeconfig, server.url)
            click.echo(f"kubeplane is up: API server at {server.url}, {node_count} simulated node(s)", err=True)
            click.echo(f"  kubectl --kubeconfig {kubeconfig} get nodes", err=True)
            await stop.wait()
        finally:
            await comps.stop()
            await server.stop()

    _run(go)


def _scheduler_kwargs(path: str | None) -> dict:
    if path is None:
        return {}
    from kubeplane.scheduler.config import ConfigError, load_config

    try:
        cfg = load_config(path)
    except ConfigError as exc:
        raise click.ClickException(f"invalid scheduler configuration {path}: {exc}") from None
    return cfg.scheduler_kwargs()


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
