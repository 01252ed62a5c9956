"""The ``kubeplane`` command."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from kubeplane import __version__, runtime


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
        runtime.run(runner())
    except KeyboardInterrupt:  # pragma: no cover
        pass


class _ByteSize(click.ParamType):
    """A byte count: an integer or a quantity such as ``256Mi``."""

    name = "bytes"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from kubeplane.api.quantity import int_value

        try:
            n = int_value(str(value))
        except (ValueError, TypeError, ArithmeticError):
            self.fail(f"{value!r} is not a byte count (e.g. 268435456 or 256Mi)", param, ctx)
        if n < 1:
            self.fail(f"{value!r} must be at least 1 byte", param, ctx)
        return n


class _Duration(click.ParamType):
    """A Go duration such as ``1h``, ``30m``, ``1h30m`` or ``90s``, in seconds."""

    name = "duration"
    _UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        import re

        text = str(value).strip()
        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
        if text == "0":
            return 0.0
        if not parts or "".join(n + u for n, u in parts) != text:
            self.fail(f"{value!r} is not a duration (e.g. 1h, 30m, 1h30m, 90s)", param, ctx)
        return sum(float(n) * self._UNITS[u] for n, u in parts)


_server_options = [
    click.option("--data-dir", default="data", show_default=True, help="Directory for the SQLite database."),
    click.option("--listen", default="127.0.0.1:6443", show_default=True,
                 help="HOST:PORT to serve on; port 0 picks a free port. Loopback by default."),
    click.option("--kubeconfig", "kubeconfig", default=None,
                 help="Write a kubeconfig for this server here once it is ready."),
    click.option("--storage", type=click.Choice(["sqlite", "memory"]), default="sqlite", show_default=True),
    click.option("--history-revisions", type=click.IntRange(min=1), default=10_000, show_default=True,
                 help="Revisions of history kept for watches and consistent lists (older ones answer 410 Gone)."),
    click.option("--history-bytes", type=_ByteSize(), default="256Mi", show_default=True,
                 help="Bytes of history (encoded object sizes) kept for watches and consistent lists."),
    click.option("--event-ttl", type=_Duration(), default="1h", show_default=True,
                 help="Events are deleted this long after their last write (0: never)."),
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
    from kubeplane.runtime import configure_gc

    configure_gc()


@main.command()
@server_options
def apiserver(data_dir: str, listen: str, kubeconfig: str | None, storage: str, history_revisions: int,
              history_bytes: int, event_ttl: float, verbose: bool) -> None:
    """Run the API server alone."""
    from kubeplane.apiserver.app import APIServer, APIServerConfig, parse_listen

    _setup_logging(verbose)
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    server = APIServer(APIServerConfig(data_dir=data_dir, listen=listen, storage=storage, kubeconfig=kubeconfig,
                                         history_revisions=history_revisions, history_bytes=history_bytes,
                                         event_ttl=event_ttl))

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
        click.option("--gpus-per-node", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Simulated DRA devices per node: publishes DeviceClass gpu.kubeplane.io and one "
                          "ResourceSlice per node."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _node_agent(client, factory, node_count, node_cpu, node_memory, node_pods, zones, node_prefix, gpus=0):
    from kubeplane.controllers.nodeagent import NodeAgent, NodeSpec

    names = [f"{node_prefix}-{i}" for i in range(node_count)]
    spec = NodeSpec(cpu=node_cpu, memory=node_memory, pods=node_pods, zones=zones, gpus=gpus)
    return NodeAgent(client, names, spec, factory)


@main.command()
@server_options
@_node_options
@click.option("--scheduler-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="KubeSchedulerConfiguration file for the built-in scheduler.")
@click.option("--split", is_flag=True,
              help="Run the scheduler, controllers and simulated nodes in a second process, joined to the "
                   "API server by a Unix socket, so that two cores do the work.")
def up(data_dir: str, listen: str, kubeconfig: str | None, storage: str, history_revisions: int,
       history_bytes: int, event_ttl: float, verbose: bool, node_count: int, node_cpu: str, node_memory: str, node_pods: int, zones: int,
       node_prefix: str, gpus_per_node: int, scheduler_config: str | None, split: bool) -> None:
    """Run a whole cluster: API server, scheduler, controllers, simulated nodes (one process,
    or two with --split)."""
    import os

    from kubeplane.apiserver.app import APIServer, APIServerConfig, parse_listen
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.cluster import Components

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
                                       history_revisions=history_revisions, history_bytes=history_bytes,
                                       event_ttl=event_ttl))
    node_args = (node_count, node_cpu, node_memory, node_pods, zones, node_prefix, gpus_per_node)

    async def go(stop: asyncio.Event) -> None:
        await server.start()
        comps = Components()
        try:
            if split:
                await _start_split(comps, server.registry, data_dir, node_args, scheduler_config, verbose)
            else:
                client = InProcessClient(server.registry, field_manager="kubeplane")
                await _start_components(comps, client, node_args, sched_kwargs)
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


async def _start_components(comps, client, node_args: tuple, sched_kwargs: dict) -> None:
    """Controllers, simulated nodes and the scheduler on ``client``, sharing one informer factory."""
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.cluster import ControllerOptions, build_controllers
    from kubeplane.scheduler.scheduler import Scheduler

    factory = SharedInformerFactory(client)
    agent = _node_agent(client, factory, *node_args)
    for ctrl in build_controllers(client, factory, ControllerOptions()):
        await comps.start(ctrl)
    await comps.start(agent)
    scheduler = Scheduler(client, informer_factory=factory, **sched_kwargs)
    comps.run(scheduler.run(), "scheduler")
    comps.items.append(scheduler)


async def _start_split(comps, registry, data_dir: str, node_args: tuple, scheduler_config: str | None,
                       verbose: bool) -> None:
    """``up --split``: serve the registry on a private Unix socket and run
    :func:`components` in a child process, restarted if it dies."""
    import os
    import tempfile

    from kubeplane.client.wireserver import WireServer
    from kubeplane.cluster import ComponentProcess, ServedSocket

    path = os.path.abspath(os.path.join(data_dir, "api.sock"))
    sock_dir = None
    if len(path.encode()) > 100:  # Unix socket paths are limited to about 100 bytes
        sock_dir = tempfile.mkdtemp(prefix="kubeplane-")
        path = os.path.join(sock_dir, "api.sock")
    wire = WireServer(registry, path)
    await wire.start()
    comps.items.append(ServedSocket(wire, sock_dir))
    count, cpu, memory, pods, zones, prefix, gpus = node_args
    argv = [sys.executable, "-m", "kubeplane.cli.main", "components", "--api-socket", wire.path,
            "--nodes", str(count), "--node-cpu", cpu, "--node-memory", memory, "--node-pods", str(pods),
            "--zones", str(zones), "--node-prefix", prefix, "--gpus-per-node", str(gpus)]
    if scheduler_config:
        argv += ["--scheduler-config", os.path.abspath(scheduler_config)]
    if verbose:
        argv.append("--verbose")
    child = ComponentProcess(argv, "components process")
    await child.start()
    comps.items.append(child)
    comps.run(child.supervise(), "components-supervisor")


@main.command(hidden=True)
@click.option("--api-socket", required=True, help="The API server's local wire socket.")
@_node_options
@click.option("--scheduler-config", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def components(api_socket: str, node_count: int, node_cpu: str, node_memory: str, node_pods: int, zones: int,
               node_prefix: str, gpus_per_node: int, scheduler_config: str | None, verbose: bool) -> None:
    """The second process of ``up --split``: scheduler, controllers and simulated
    nodes over the local wire. Stops at ``stop`` or when its input ends."""
    from kubeplane.client.wire import WireClient
    from kubeplane.cluster import Components, read_commands, say

    _setup_logging(verbose)
    sched_kwargs = _scheduler_kwargs(scheduler_config)
    node_args = (node_count, node_cpu, node_memory, node_pods, zones, node_prefix, gpus_per_node)

    async def go(stop: asyncio.Event) -> None:
        client = WireClient(api_socket, managed_fields=False)
        comps = Components()

        async def command(words: list[str]) -> None:
            say(f"error unknown command {' '.join(words)!r}")

        try:
            await _start_components(comps, client, node_args, sched_kwargs)
            say("ready")
            commands = asyncio.ensure_future(read_commands(command))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({commands, stopped}, return_when=asyncio.FIRST_COMPLETED)
            commands.cancel()
            stopped.cancel()
        finally:
            await comps.stop()
            await client.close()

    _run(go)


def _load_scheduler_config(path: str | None):
    from kubeplane.scheduler.config import ConfigError, load_config
    from kubeplane.scheduler.framework.registry import in_tree_registry

    try:
        return load_config(path, in_tree_registry())
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _scheduler_kwargs(path: str | None) -> dict:
    if path is None:
        return {}
    cfg = _load_scheduler_config(path)
    return {
        "profiles": cfg.framework_profiles(),
        "percentage_of_nodes_to_score": cfg.percentage_of_nodes_to_score,
        "pod_initial_backoff": cfg.pod_initial_backoff_seconds,
        "pod_max_backoff": cfg.pod_max_backoff_seconds,
    }


def _http_client(kubeconfig: str | None, context: str | None):
    from kubeplane.client.http import HttpClient
    from kubeplane.client.kubeconfig import KubeconfigError

    try:
        return HttpClient.from_kubeconfig(kubeconfig, context)
    except (KubeconfigError, OSError) as exc:
        raise click.ClickException(f"cannot load kubeconfig: {exc}") from None


_client_options = [
    click.option("--kubeconfig", "kubeconfig", default=None,
                 help="Kubeconfig of the API server (default: $KUBECONFIG or ~/.kube/config)."),
    click.option("--context", default=None, help="Kubeconfig context to use."),
    click.option("-v", "--verbose", is_flag=True, help="Debug logging."),
]


def client_options(f):
    for opt in reversed(_client_options):
        f = opt(f)
    return f


@main.command()
@client_options
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) file.")
@click.option("--leader-elect/--no-leader-elect", default=None,
              help="Coordinate replicas through a Lease (default: the config's leaderElection.leaderElect).")
@click.option("--metrics-listen", default="127.0.0.1:10259", show_default=True,
              help="HOST:PORT for /metrics and /healthz; empty to disable.")
def scheduler(kubeconfig: str | None, context: str | None, verbose: bool, config_path: str | None,
              leader_elect: bool | None, metrics_listen: str) -> None:
    """Run the scheduler against any Kubernetes API server."""
    import os
    import socket
    import uuid

    _setup_logging(verbose)
    cfg = _load_scheduler_config(config_path)
    elect = cfg.leader_election.leader_elect if leader_elect is None else leader_elect

    async def go(stop: asyncio.Event) -> None:
        from aiohttp import web

        from kubeplane.apiserver.app import parse_listen
        from kubeplane.leaderelection import LeaderElector
        from kubeplane.scheduler.metrics import SchedulerMetrics, metrics_app
        from kubeplane.scheduler.scheduler import Scheduler

        client = _http_client(kubeconfig, context)
        metrics = SchedulerMetrics()
        runner = None
        if metrics_listen:
            host, port = parse_listen(metrics_listen)
            runner = web.AppRunner(metrics_app(metrics), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, host, port).start()
        identity = f"{socket.gethostname()}_{uuid.uuid4()}"
        sched = Scheduler.from_config(client, cfg, metrics=metrics, identity=identity)
        names = ", ".join(cfg.scheduler_names())
        try:
            if not elect:
                click.echo(f"kubeplane scheduler running (profiles: {names})", err=True)
                run = asyncio.create_task(sched.run())
                await asyncio.wait({run, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
            else:
                le = cfg.leader_election
                lost = asyncio.Event()

                async def lead() -> None:
                    click.echo(f"became leader {identity}; scheduling (profiles: {names})", err=True)
                    await sched.run()

                def stopped() -> None:
                    click.echo("leader election lost", err=True)
                    lost.set()

                elector = LeaderElector(client, le.resource_namespace, le.resource_name, identity,
                                        lease_duration=le.lease_duration, renew_deadline=le.renew_deadline,
                                        retry_period=le.retry_period, on_started_leading=lead,
                                        on_stopped_leading=stopped)
                task = asyncio.create_task(elector.run())
                await asyncio.wait({task, asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                if lost.is_set():
                    os._exit(1)  # as upstream: a replica that lost the lease exits and restarts clean
        finally:
            await sched.stop()
            if runner is not None:
                await runner.cleanup()
            await client.close()

    _run(go)


@main.command()
@client_options
@click.option("--provisioner-name", default="kubeplane.io/local", show_default=True,
              help="Provisioner name served by the simulated storage provisioner.")
def controllers(kubeconfig: str | None, context: str | None, verbose: bool, provisioner_name: str) -> None:
    """Run the controllers against any Kubernetes API server."""
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.cluster import Components, ControllerOptions, build_controllers

    _setup_logging(verbose)

    async def go(stop: asyncio.Event) -> None:
        client = _http_client(kubeconfig, context)
        comps = Components()
        try:
            factory = SharedInformerFactory(client)
            for ctrl in build_controllers(client, factory, ControllerOptions(provisioner_name=provisioner_name)):
                await comps.start(ctrl)
            click.echo(f"kubeplane controllers running ({len(comps.items)})", err=True)
            await stop.wait()
        finally:
            await comps.stop()
            await client.close()

    _run(go)


@main.command()
@client_options
@_node_options
def nodes(kubeconfig: str | None, context: str | None, verbose: bool, node_count: int, node_cpu: str,
          node_memory: str, node_pods: int, zones: int, node_prefix: str, gpus_per_node: int) -> None:
    """Run simulated nodes against any Kubernetes API server."""
    from kubeplane.client.informer import SharedInformerFactory

    _setup_logging(verbose)

    async def go(stop: asyncio.Event) -> None:
        client = _http_client(kubeconfig, context)
        agent = _node_agent(client, SharedInformerFactory(client), node_count, node_cpu, node_memory, node_pods,
                            zones, node_prefix, gpus_per_node)
        try:
            await agent.start()
            click.echo(f"{node_count} simulated node(s) running", err=True)
            await stop.wait()
        finally:
            await agent.stop()
            await client.close()

    _run(go)


@main.command()
@click.argument("workload")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="Nodes (scheduler workloads).")
@click.option("--pods", type=click.IntRange(min=1), default=None, help="Measured pods (scheduler workloads).")
@click.option("--storage", type=click.Choice(["memory", "sqlite"]), default="memory", show_default=True,
              help="Storage of the embedded API (scheduler workloads).")
@click.option("--runs", type=click.IntRange(min=1), default=None,
              help="Repetitions. api: per measurement, medians reported (default 3). Scheduler "
                   "workloads: whole runs, the one with the median throughput_avg reported with every "
                   "run's throughput (default 1).")
@click.option("--split", is_flag=True,
              help="Run the scheduler and controllers in a second process (scheduler workloads).")
@click.option("--pv-interval-ms", type=click.FloatRange(min=0), default=None,
              help="SchedulingPVsChurn: milliseconds between two PV creations (default 10).")
@click.option("--profile", "profile_dir", type=click.Path(file_okay=False), default=None,
              help="Scheduler workloads: cProfile each process over the measured phase, write the "
                   "profiles to this directory and report where the time went (slows the run).")
def bench(workload: str, as_json: bool, nodes: int | None, pods: int | None, storage: str, runs: int | None,
          split: bool, pv_interval_ms: float | None, profile_dir: str | None) -> None:
    """Benchmarks, run on demand. WORKLOAD is `api` (API machinery) or a scheduler_perf
    workload: SchedulingBasic, SchedulingPodAntiAffinity, SchedulingPodAffinity,
    SchedulingNodeAffinity, TopologySpreading, PreemptionBasic, PreemptionAsync, Unschedulable,
    SchedulingInTreePVs, SchedulingCSIPVs, SchedulingPVsChurn,
    SchedulingWithResourceClaimTemplate, SteadyStateClusterResourceClaimTemplate[/half|/full]."""
    import json as _json

    if workload == "api":
        from kubeplane.bench.api import run

        if profile_dir is not None:
            raise click.BadParameter("applies to scheduler workloads only", param_hint="--profile")

        def progress(msg: str) -> None:
            if not as_json:
                click.echo(msg, err=True)

        result = run(runs=3 if runs is None else runs, progress=progress)
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
        return
    from kubeplane.bench.scheduler import get_workload, run_cli

    try:
        get_workload(workload)
    except KeyError as err:
        raise click.BadParameter(str(err.args[0]), param_hint="WORKLOAD") from None
    out = runtime.run(run_cli(workload, nodes=nodes, pods=pods, storage=storage, as_json=as_json, split=split,
                              pv_interval_ms=pv_interval_ms, runs=1 if runs is None else runs,
                              profile_dir=profile_dir))
    if out.get("timed_out"):
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
