"""Assembling the control-plane components, in one process or separately.

``kubeplane up`` runs everything over the in-process client; ``up --split``
runs the scheduler, controllers and simulated nodes in a child process that
reaches the registry over the local wire (:class:`ComponentProcess`);
``kubeplane scheduler``, ``controllers`` and ``nodes`` run one part each over
HTTP against any Kubernetes API server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any

from kubeplane.auth.user import AUTHENTICATED, KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, UserInfo
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client
from kubeplane.controllers.manager import ControllerDef, ControllerOptions, select_controllers

log = logging.getLogger("kubeplane")

#: the identities of kubeplane's own components, as upstream's
SCHEDULER_USER = UserInfo(KUBE_SCHEDULER, groups=(AUTHENTICATED,))
CONTROLLER_MANAGER_USER = UserInfo(KUBE_CONTROLLER_MANAGER, groups=(AUTHENTICATED,))


def cluster_ca_options(data_dir: str, pki_dir: str | None = None) -> dict[str, str]:
    """The cluster CA the API server keeps in ``<data_dir>/pki`` (or
    ``pki_dir``: ``ca.crt``, ``ca.key``) as :class:`ControllerOptions`
    fields, for those that exist."""
    import os

    directory = pki_dir or os.path.join(data_dir, "pki")
    cert = os.path.join(directory, "ca.crt")
    key = os.path.join(directory, "ca.key")
    out: dict[str, str] = {}
    if os.path.isfile(cert):
        out["root_ca_file"] = cert
        if os.path.isfile(key):
            out["signing_cert_file"] = cert
            out["signing_key_file"] = key
    return out


def service_account_controller(registry: Any) -> Any:
    """The ServiceAccount controller over the in-process client of ``registry``,
    for the API server's process to run (as :func:`namespace_controller`) when
    no controllers run: without a ``default`` ServiceAccount the ServiceAccount
    admission refuses every pod."""
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.controllers.serviceaccount import ServiceAccountsController

    return ServiceAccountsController(InProcessClient(registry, field_manager="kubeplane"))


def _root_ca_publisher(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    """The ``kube-root-ca.crt`` publisher, for the root CA file given."""
    if not opts.root_ca_file:
        log.info("no cluster CA given: the kube-root-ca.crt publisher does not run")
        return []
    from kubeplane.controllers.serviceaccount import RootCACertPublisher

    with open(opts.root_ca_file, "rb") as f:
        bundle = f.read()
    if not bundle.strip():
        log.warning("the root CA file %s is empty: kube-root-ca.crt is not published", opts.root_ca_file)
        return []
    return [RootCACertPublisher(client, bundle, factory)]


def _csr_signer(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    """The CSR signer, for the signing CA files given."""
    if not (opts.signing_cert_file and opts.signing_key_file):
        log.info("no cluster signing CA given: CertificateSigningRequests are not signed")
        return []
    from kubeplane.controllers.csrsigning import CertificateAuthority, CSRSigningController

    ca = CertificateAuthority.from_files(opts.signing_cert_file, opts.signing_key_file)
    return [CSRSigningController(client, ca, factory)]


def _ca_controllers(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    """The root CA publisher and the CSR signer, for the CA files given."""
    return _root_ca_publisher(client, factory, opts) + _csr_signer(client, factory, opts)


def namespace_controller(registry: Any) -> Any:
    """The namespace controller over the in-process client of ``registry``: what
    the API server's process runs itself (give it to
    :class:`~kubeplane.apiserver.app.APIServer` as ``in_process``), since
    namespaces must finish deleting with only the API server running."""
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.controllers.namespace import NamespaceController

    return NamespaceController(InProcessClient(registry, field_manager="kubeplane"))


def _namespace(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.namespace import NamespaceController

    return [NamespaceController(client, factory)] if opts.namespace else []


def _service_accounts(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.serviceaccount import ServiceAccountsController

    return [ServiceAccountsController(client, factory)] if opts.service_accounts else []


def _pv_binder(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.pv.binder import PersistentVolumeController

    return [PersistentVolumeController(client, factory)]


def _local_provisioner(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.pv.provisioner import LocalProvisioner

    return [LocalProvisioner(client, factory, provisioner_name=opts.provisioner_name)]


def _resource_claims(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.resourceclaim import ResourceClaimController

    return [ResourceClaimController(client, factory)]


def _replicasets(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.replicaset import ReplicaSetController

    return [ReplicaSetController(client, factory)]


def _deployments(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.deployment import DeploymentController

    return [DeploymentController(client, factory)]


def _garbage_collector(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.garbagecollector import GarbageCollector

    return [GarbageCollector(client, factory)]


def _node_lifecycle(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.nodelifecycle import NodeLifecycleController

    return [NodeLifecycleController(client, factory, startup_grace=opts.node_startup_grace_period,
                                    monitor_grace=opts.node_monitor_grace_period,
                                    monitor_period=opts.node_monitor_period)]


def _taint_eviction(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.tainteviction import TaintEvictionController

    return [TaintEvictionController(client, factory)]


def _disruption(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.disruption import DisruptionController

    return [DisruptionController(client, factory)]


def _pod_gc(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.podgc import PodGCController

    return [PodGCController(client, factory, terminated_pod_threshold=opts.terminated_pod_gc_threshold)]


def _cronjobs(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.cronjob import CronJobController

    return [CronJobController(client, factory)]


def _replication_controllers(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.replication import ReplicationManager

    return [ReplicationManager(client, factory)]


def _jobs(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.job import JobController

    return [JobController(client, factory)]


def _ttl_after_finished(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.ttlafterfinished import TTLAfterFinishedController

    return [TTLAfterFinishedController(client, factory)]


def _horizontal_pod_autoscaler(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.podautoscaler import HorizontalController

    return [HorizontalController(client, factory, sync_period=opts.hpa_sync_period, tolerance=opts.hpa_tolerance,
                                 downscale_stabilization=opts.hpa_downscale_stabilization,
                                 cpu_initialization_period=opts.hpa_cpu_initialization_period,
                                 initial_readiness_delay=opts.hpa_initial_readiness_delay)]


def _resource_quotas(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.resourcequota import ResourceQuotaController

    return [ResourceQuotaController(client, factory)]


def _endpoints(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.endpoints import EndpointsController

    return [EndpointsController(client, factory)]


def _endpoint_slices(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.endpointslice import EndpointSliceController

    return [EndpointSliceController(client, factory)]


def _daemonsets(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    from kubeplane.controllers.daemonset import DaemonSetsController

    return [DaemonSetsController(client, factory)]


#: every controller kubeplane ships, in start order: upstream's name, the
#: short names upstream also accepts, the kube-system ServiceAccount it acts as
CONTROLLERS: tuple[ControllerDef, ...] = (
    ControllerDef("namespace-controller", ("namespace",), "namespace-controller", _namespace),
    ControllerDef("serviceaccount-controller", ("serviceaccount",), "service-account-controller", _service_accounts),
    ControllerDef("root-ca-certificate-publisher-controller", ("root-ca-cert-publisher",), "root-ca-cert-publisher",
                  _root_ca_publisher),
    ControllerDef("certificatesigningrequest-signing-controller", ("csrsigning",), "certificate-controller",
                  _csr_signer),
    # -- security --
    ControllerDef("certificatesigningrequest-approving-controller", ("csrapproving",), "certificate-controller",
                  lambda client, factory, opts: [importlib.import_module(
                      "kubeplane.controllers.csrapproving").CSRApprovingController(client, factory)]),
    # upstream leaves these two off unless named; kubeadm (and so kubeplane) turns them on
    ControllerDef("bootstrap-signer-controller", ("bootstrapsigner",), "bootstrap-signer",
                  lambda client, factory, opts: importlib.import_module(
                      "kubeplane.controllers.bootstrap").build_signer(client, factory, opts)),
    ControllerDef("token-cleaner-controller", ("tokencleaner",), "token-cleaner",
                  lambda client, factory, opts: importlib.import_module(
                      "kubeplane.controllers.bootstrap").build_cleaner(client, factory, opts)),
    ControllerDef("node-ipam-controller", ("nodeipam",), "node-controller",
                  lambda client, factory, opts: importlib.import_module(
                      "kubeplane.controllers.nodeipam").build(client, factory, opts)),
    ControllerDef("persistentvolume-binder-controller", ("persistentvolume-binder",), "persistent-volume-binder",
                  _pv_binder),
    # kubeplane's own: the provisioner of its local volumes
    ControllerDef("local-volume-provisioner", (), "kubeplane-local-provisioner", _local_provisioner),
    ControllerDef("resourceclaim-controller", ("resourceclaim",), "resource-claim-controller", _resource_claims),
    ControllerDef("replicaset-controller", ("replicaset",), "replicaset-controller", _replicasets),
    ControllerDef("deployment-controller", ("deployment",), "deployment-controller", _deployments),
    ControllerDef("garbage-collector-controller", ("garbagecollector",), "generic-garbage-collector",
                  _garbage_collector),
    ControllerDef("node-lifecycle-controller", ("nodelifecycle",), "node-controller", _node_lifecycle),
    # -- job --
    ControllerDef("job-controller", ("job",), "job-controller", _jobs),
    ControllerDef("ttl-after-finished-controller", ("ttl-after-finished",), "ttl-after-finished-controller",
                  _ttl_after_finished),

    # -- cronjob --
    ControllerDef("cronjob-controller", ("cronjob",), "cronjob-controller", _cronjobs),
    ControllerDef("replicationcontroller-controller", ("replicationcontroller",), "replication-controller",
                  _replication_controllers),

    # -- statefulset --
    ControllerDef("statefulset-controller", ("statefulset",), "statefulset-controller",
                  lambda client, factory, opts: importlib.import_module(
                      "kubeplane.controllers.statefulset").build(client, factory, opts)),

    # -- daemonset --
    ControllerDef("daemonset-controller", ("daemonset",), "daemon-set-controller", _daemonsets),

    # -- endpoints --
    ControllerDef("endpoints-controller", ("endpoint",), "endpoint-controller", _endpoints),
    ControllerDef("endpointslice-controller", ("endpointslice",), "endpointslice-controller", _endpoint_slices),

    # -- hpa --
    ControllerDef("horizontal-pod-autoscaler-controller", ("horizontalpodautoscaling",), "horizontal-pod-autoscaler",
                  _horizontal_pod_autoscaler),

    # -- maintenance --
    # upstream's taint-eviction controller acts with the node controller's role
    ControllerDef("taint-eviction-controller", (), "node-controller", _taint_eviction),
    ControllerDef("disruption-controller", ("disruption",), "disruption-controller", _disruption),
    ControllerDef("pod-garbage-collector-controller", ("podgc",), "pod-garbage-collector", _pod_gc),

    # -- quota --
    ControllerDef("resourcequota-controller", ("resourcequota",), "resourcequota-controller", _resource_quotas),

)


def build_selected(client: Client, factory: SharedInformerFactory, opts: ControllerOptions,
                   selection: tuple[str, ...] | list[str] = ("*",)) -> list[tuple[ControllerDef, list[Any]]]:
    """The controllers ``selection`` (``--controllers`` items) turns on, each
    with its definition, sharing one informer factory."""
    return [(d, d.build(client, factory, opts)) for d in select_controllers(CONTROLLERS, selection)]


def build_controllers(client: Client, factory: SharedInformerFactory, opts: ControllerOptions,
                      selection: tuple[str, ...] | list[str] = ("*",)) -> list[Any]:
    """The controllers ``selection`` turns on (all by default), sharing one informer factory."""
    return [c for _d, built in build_selected(client, factory, opts, selection) for c in built]


async def start_controllers(comps: "Components", client: Client, factory: SharedInformerFactory,
                            opts: ControllerOptions, selection: tuple[str, ...] | list[str] = ("*",), *,
                            clients: Any = None) -> None:
    """Build and start the controllers ``selection`` turns on, added to
    ``comps``. The shared informers read as kube-controller-manager; each
    controller writes as its own kube-system ServiceAccount (upstream's
    ``--use-service-account-credentials``): through ``clients``
    (:class:`~kubeplane.controllers.manager.ServiceAccountClients`, a client
    with the account's token each) when given, otherwise through ``client``
    acting as that account (the in-process client and the local wire carry
    the identity of the task that makes a request)."""
    from kubeplane.auth.user import acting_as
    from kubeplane.controllers.manager import controller_user

    built = []
    for d in select_controllers(CONTROLLERS, selection):
        own = await clients.client_for(d.account) if clients is not None else client
        built.append((d, d.build(own, factory, opts)))
    with acting_as(CONTROLLER_MANAGER_USER):
        factory.start()
    # stopped after every component that reads from it
    comps.items.append(_StopFactory(factory))
    for d, ctrls in built:
        with acting_as(controller_user(d.account)):
            for ctrl in ctrls:
                await comps.start(ctrl)


@dataclass
class _StopFactory:
    factory: SharedInformerFactory

    async def stop(self) -> None:
        await self.factory.stop()


def node_agent(client: Client, factory: SharedInformerFactory, node_count: int, node_cpu: str = "4",
               node_memory: str = "32Gi", node_pods: int = 110, zones: int = 0, node_prefix: str = "node",
               gpus: int = 0) -> Any:
    """The simulated nodes ``PREFIX-0`` .. ``PREFIX-<count-1>`` as one agent."""
    from kubeplane.controllers.nodeagent import NodeAgent, NodeSpec

    names = [f"{node_prefix}-{i}" for i in range(node_count)]
    spec = NodeSpec(cpu=node_cpu, memory=node_memory, pods=node_pods, zones=zones, gpus=gpus)
    return NodeAgent(client, names, spec, factory)


async def start_components(comps: "Components", client: Client, node_args: tuple | None, sched_kwargs: dict,
                           *, controllers: bool = True, scheduler: bool = True, metrics_listen: str = "",
                           scheduler_config: Any = None, namespace_controller: bool = True,
                           controller_options: ControllerOptions | None = None,
                           controller_selection: tuple[str, ...] | list[str] = ("*",)) -> None:
    """Controllers, simulated nodes (``node_args`` as :func:`node_agent` takes
    them after the factory; None for none) and the scheduler on ``client``,
    sharing one informer factory, added to ``comps`` in start order
    (``controller_options`` choose and configure the controllers). With
    ``metrics_listen``, their metrics server (scheduler metrics, work queues,
    /configz) is started first."""
    from kubeplane.auth.user import acting_as
    from kubeplane.client.informer import SharedInformerFactory

    # Each component starts (and so runs: its tasks inherit the context) as
    # upstream's component of that name; requests through the in-process
    # client and the local wire carry the identity, and over HTTP the
    # kubeconfig's certificate names it.
    metrics = None
    if metrics_listen:
        server, metrics = components_metrics_server(metrics_listen, scheduler_config, with_scheduler=scheduler)
        await comps.start(server)
    factory = SharedInformerFactory(client)
    agent = node_agent(client, factory, *node_args) if node_args is not None else None
    if controllers:
        opts = controller_options if controller_options is not None else ControllerOptions()
        opts = dataclasses.replace(opts, namespace=opts.namespace and namespace_controller)
        await start_controllers(comps, client, factory, opts, controller_selection)
    if agent is not None:
        await comps.start(agent)  # each node acts as system:node:<name> (NodeAgent)
    if scheduler:
        from kubeplane.scheduler.scheduler import Scheduler

        with acting_as(SCHEDULER_USER):
            sched = Scheduler(client, informer_factory=factory, metrics=metrics, **sched_kwargs)
            comps.run(sched.run(), "scheduler")
        comps.items.append(sched)


@dataclass
class Components:
    """Started components, stopped in reverse order."""

    items: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)

    async def start(self, component: Any) -> None:
        await component.start()
        self.items.append(component)

    def run(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.append(task)
        return task

    async def stop(self) -> None:
        for component in reversed(self.items):
            try:
                await component.stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("stopping %s failed", type(component).__name__)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class ComponentProcess:
    """A child process running components over the local wire
    (:mod:`kubeplane.client.wire`), driven by lines on its stdin and stdout.

    The child prints ``ready`` once it runs; ``stop`` (or the end of its
    input, e.g. because this process died) makes it stop and exit. Other
    lines are requests answered with one line each."""

    def __init__(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.name = name
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        #: one reader of the child's stdout at a time (start, request, shutdown)
        self._lock = asyncio.Lock()
        self._stopping = False
        self._supervisor: asyncio.Task | None = None

    async def start(self, timeout: float = 180.0) -> None:
        async with self._lock:
            # A session of its own: a Ctrl-C at the terminal reaches only the
            # parent, which then stops the child in order.
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True,
                env=self.env)
            try:
                line = await self._line(timeout)
            except asyncio.TimeoutError:
                line = "(no answer)"
        if line != "ready":
            await self._shutdown(5.0)
            raise RuntimeError(f"{self.name} did not start (said {line!r})")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        return raw.decode().strip()

    async def request(self, line: str, timeout: float = 60.0) -> str:
        """Send one line and return the answer line. Without an answer in time
        the child is killed: a late answer would be taken for the next one."""
        assert self.proc is not None and self.proc.stdin is not None
        async with self._lock:
            self.proc.stdin.write(line.encode() + b"\n")
            await self.proc.stdin.drain()
            try:
                return await self._line(timeout)
            except asyncio.TimeoutError:
                self.proc.kill()
                raise RuntimeError(f"{self.name} did not answer {line!r} within {timeout:g}s") from None

    async def supervise(self, restart_delay: float = 1.0) -> None:
        """Start the child again whenever it exits before :meth:`stop`."""
        self._supervisor = asyncio.current_task()
        while not self._stopping:
            proc = self.proc
            if proc is not None:
                await proc.wait()
                if self._stopping:
                    return
                log.error("%s exited with code %s; starting it again", self.name, proc.returncode)
            await asyncio.sleep(restart_delay)
            if self._stopping:
                return
            try:
                await self.start()
            except (RuntimeError, OSError) as err:
                log.error("%s: %s", self.name, err)

    async def stop(self, timeout: float = 30.0) -> list[str]:
        """Ask the child to stop; returns the lines it printed while stopping."""
        self._stopping = True
        sup = self._supervisor
        if sup is not None and sup is not asyncio.current_task():
            sup.cancel()  # e.g. in the middle of a restart
            await asyncio.gather(sup, return_exceptions=True)
        return await self._shutdown(timeout)

    async def _shutdown(self, timeout: float) -> list[str]:
        async with self._lock:
            return await self._shutdown_locked(timeout)

    async def _shutdown_locked(self, timeout: float) -> list[str]:
        proc = self.proc
        said: list[str] = []
        if proc is None:
            return said
        if proc.returncode is None and proc.stdin is not None:
            try:
                proc.stdin.write(b"stop\n")
                await proc.stdin.drain()
                proc.stdin.close()
                while True:
                    line = await self._line(timeout)
                    if not line:
                        break
                    said.append(line)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        if proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        return said


class ServedSocket:
    """A local wire server as a component; stopping it removes the socket and,
    when given, the private directory made for it."""

    def __init__(self, server: Any, directory: str | None = None) -> None:
        self.server = server
        self.directory = directory

    async def stop(self) -> None:
        import shutil

        await self.server.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


async def read_commands(on_line: Any) -> None:
    """The child's side of :class:`ComponentProcess`: calls ``await on_line(words)``
    for every request line and returns at ``stop`` or at the end of input."""
    import sys

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        raw = await reader.readline()
        if not raw:
            return  # end of input: the parent is gone
        words = raw.decode().split()
        if not words:
            continue
        if words[0] == "stop":
            return
        await on_line(words)


def say(line: str) -> None:
    """One line to the parent (:class:`ComponentProcess`)."""
    import sys

    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class MetricsServer:
    """An aiohttp app on its own TCP address, as a component (:class:`Components`);
    a busy address fails :meth:`start` with a one-line
    :class:`~kubeplane.startup.StartupError`."""

    def __init__(self, app: Any, listen: str, what: str = "metrics") -> None:
        self.app = app
        self.listen = listen
        self.what = what
        self.url = ""
        self._runner: Any = None

    async def start(self) -> None:
        from aiohttp import web

        from kubeplane.apiserver.app import parse_listen
        from kubeplane.startup import bind_socket, format_address

        host, port = parse_listen(self.listen)
        sock = bind_socket(host, port, backlog=128)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner
        self.url = f"http://{format_address(host, sock.getsockname()[1])}"
        log.info("serving %s on %s", self.what, self.url)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


class Exposition:
    """``exposition(accept)`` over one registry, as SchedulerMetrics offers it."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


def components_metrics_server(listen: str, scheduler_config: Any = None, *, with_scheduler: bool = True,
                              with_workqueues: bool = True) -> tuple[MetricsServer, Any]:
    """The components' metrics endpoint, as kube-scheduler's and
    kube-controller-manager's secure ports serve it: ``/metrics`` (the
    scheduler's metrics and/or the controllers' work-queue metrics),
    ``/healthz`` (``/livez``, ``/readyz``) and, with the scheduler, ``/configz``.
    Returns the server (start it) and the SchedulerMetrics to give the
    scheduler (None without one)."""
    from prometheus_client import CollectorRegistry

    from kubeplane.controllers.base import WorkQueueCollector
    from kubeplane.scheduler.metrics import SchedulerMetrics, metrics_app

    sched_metrics = None
    configz = None
    if with_scheduler:
        from kubeplane.scheduler.config import componentconfig, load_config
        from kubeplane.scheduler.plugins.registry import in_tree_registry

        sched_metrics = SchedulerMetrics()
        registry = sched_metrics.registry
        exposition: Any = sched_metrics
        cfg = scheduler_config if scheduler_config is not None else load_config(None, in_tree_registry())
        configz = {"componentconfig": componentconfig(cfg)}
    else:
        registry = CollectorRegistry(auto_describe=True)
        exposition = Exposition(registry)
    if with_workqueues:
        registry.register(WorkQueueCollector())
    what = "scheduler metrics and /configz" if with_scheduler else "controller metrics"
    return MetricsServer(metrics_app(exposition, configz=configz), listen, what), sched_metrics

