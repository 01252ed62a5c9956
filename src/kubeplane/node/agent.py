"""The node agent: a kubelet running the pods bound to its node through the CRI.

:class:`NodeAgent` does what upstream's kubelet does around the container
runtime:

- registers its Node (capacity measured from the host, allocatable after
  ``--system-reserved`` and the hard eviction thresholds, addresses,
  nodeInfo with the runtime's version from CRI ``Version``, the images it
  holds from CRI ``ListImages``, the four conditions, the kubelet port) and
  keeps its status: looked at every 10 s, posted when it changed or 5 min
  after the last post, as with node leases;
- renews its Lease in ``kube-node-lease`` every quarter of its 40 s
  duration, updating the last Lease it wrote (no GET), as upstream's lease
  controller;
- waits for ``spec.podCIDR`` (the node IPAM controller's, or ``pod_cidr``
  given, as the kubelet's ``--pod-cidr``) and writes the runtime's bridge CNI
  configuration for it;
- watches the pods bound to it (``spec.nodeName=<name>``) and gives each
  its own worker, which calls the runtime (:class:`~kubeplane.node.kuberuntime.KubeRuntime`)
  for one reconcile step whenever the pod changed, a container changed
  (the relist below), a probe result changed, a back-off ended, or the sync
  period passed;
- the status manager: writes ``pods/status`` when the status changed,
  and finishes a graceful deletion, once the pod's containers are stopped,
  by deleting it with grace 0 and a uid precondition;
- relists the runtime every second (upstream's generic PLEG) to notice
  containers that changed on their own, and removes the sandboxes and
  containers of pods that are gone from the API (orphans);
- imports every image archive of its images directory at start and when
  one appears there (as k3s's agent/images);
- with ``proxy`` configured, runs the Service proxy (:mod:`kubeplane.proxy`,
  kube-proxy's nftables mode) and removes its rules when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.nodestatus import (KUBELET_VERSION, LEASE_DURATION_SECONDS, LEASE_NAMESPACE,
                                      carry_transitions, default_labels, lease_object, micro_time,
                                      node_conditions)
from kubeplane.api.resources import resource
from kubeplane.client.interface import Client, Obj
from kubeplane.node import admission, cni, host
from kubeplane.node.cri.client import CRIClient, CRIError, pb
from kubeplane.node.images import ImageError, import_archive, is_archive
from kubeplane.node.logs import (DEFAULT_MAX_FILES as DEFAULT_LOG_MAX_FILES, DEFAULT_MAX_SIZE as DEFAULT_LOG_MAX_SIZE,
                                 DEFAULT_MONITOR_INTERVAL as DEFAULT_LOG_MONITOR_INTERVAL, ContainerLogManager)

log = logging.getLogger(__name__)

NODES = resource("nodes")
PODS = resource("pods")
LEASES = resource("leases")

#: upstream's nodeStatusMaxImages and MaxNamesPerImageInNodeStatus
MAX_IMAGES = 50
MAX_NAMES_PER_IMAGE = 5
#: upstream's PLEG relist threshold: not relisted for that long, the node is not ready
PLEG_THRESHOLD = 180.0
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass
class AgentConfig:
    """A node's settings (``kubeplane node``'s flags)."""

    name: str
    data_dir: str
    node_ip: str | None = None
    max_pods: int = 110
    system_reserved: dict[str, str] = field(default_factory=dict)
    kubelet_port: int = 10250
    #: where the kubelet API listens (default: the node IP when given, else every address)
    kubelet_address: str | None = None
    #: the CA of the clients the kubelet API accepts certificates of (the API server's)
    client_ca_data: bytes | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: the kubelet's --pod-cidr: used instead of waiting for spec.podCIDR
    pod_cidr: str | None = None
    images_dir: str | None = None
    #: where the runtime reads its CNI configuration (None: the agent writes none)
    cni_conf_dir: str | None = None
    #: the pods' bridge (default: named after the node, so nodes on one host differ)
    cni_bridge: str | None = None
    node_status_update_frequency: float = 10.0
    node_status_report_frequency: float = 300.0
    lease_duration: int = LEASE_DURATION_SECONDS
    relist_period: float = 1.0
    sync_frequency: float = 60.0
    images_poll_period: float = 2.0
    #: the CRI runtime's request timeout at start: how long to wait for it
    runtime_wait: float = 60.0
    #: container log rotation (upstream's containerLogMaxSize, containerLogMaxFiles)
    container_log_max_size: int = DEFAULT_LOG_MAX_SIZE
    container_log_max_files: int = DEFAULT_LOG_MAX_FILES
    container_log_monitor_interval: float = DEFAULT_LOG_MONITOR_INTERVAL
    #: keep routes to the other nodes' pod CIDRs and the pods' masquerade (node/routes.py)
    pod_routes: bool = True
    #: enforce the NetworkPolicies on the node's pods (node/netpol.py) with this kubeconfig
    #: (an identity that may read every pod, namespace and policy; None: no enforcement)
    network_policy_kubeconfig: str | None = None
    #: exec, attach and port-forward sessions idle for that long are closed (upstream's 4h)
    streaming_idle_timeout: float = 4 * 3600.0
    #: upstream's --cgroups-per-qos and --cgroup-root: each pod's cgroup under
    #: <cgroup_root>/kubepods, the sandbox's cgroup parent
    cgroups_per_qos: bool = True
    cgroup_root: str = "/"
    #: run the Service proxy (kubeplane.proxy) with this configuration; node name, node IP and
    #: (as --cluster-cidr) the pod CIDR are filled in when left empty. None: no proxy
    proxy: Any = None
    #: the kubelet's --cluster-dns (the kube-dns Service's ClusterIP), --cluster-domain
    #: and --resolv-conf: what the pods' resolv.conf is made of
    cluster_dns: list[str] = field(default_factory=list)
    cluster_domain: str = "cluster.local"
    resolv_conf: str = "/etc/resolv.conf"

    @property
    def pods_dir(self) -> str:
        return os.path.join(self.data_dir, "pods")

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.data_dir, "logs")

    @property
    def bridge(self) -> str:
        if self.cni_bridge:
            return self.cni_bridge
        import hashlib

        return "kp-" + hashlib.sha256(self.name.encode()).hexdigest()[:10]

    @property
    def images_path(self) -> str:
        return self.images_dir or os.path.join(self.data_dir, "images")


def pod_key(pod: Obj) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace')}/{md.get('name')}"


def pod_uid(pod: Obj) -> str:
    return (pod.get("metadata") or {}).get("uid") or ""


def deletion_grace(pod: Obj) -> int:
    """The grace a deleted pod's containers get: the deletion's, else the pod's own."""
    md = pod.get("metadata") or {}
    grace = md.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return 30 if grace is None else max(0, int(grace))


def status_patch(old: Obj | None, new: Obj) -> Obj:
    """The strategic merge patch taking ``old`` status to ``new``: every
    field ``new`` has, and a null for each top-level field only ``old`` has
    (conditions merge by type, so conditions others own are kept)."""
    patch = dict(new)
    for k in (old or {}):
        if k not in new and k != "conditions":
            patch[k] = None
    return patch


def status_matches(current: Obj | None, new: Obj) -> bool:
    """Whether ``current`` (the API's pod status) already says what ``new`` says."""
    current = current or {}
    for k, v in new.items():
        if k == "conditions":
            have = {c.get("type"): c for c in current.get("conditions") or [] if isinstance(c, dict)}
            for c in v or []:
                h = have.get(c.get("type"))
                if h is None or any(h.get(f) != c.get(f) for f in ("status", "reason", "message")):
                    return False
        elif current.get(k) != v:
            return False
    return True


class _PodWorker:
    """One pod's serialized life on the node (upstream's podWorkers, per uid)."""

    def __init__(self, agent: "NodeAgent", pod: Obj) -> None:
        self.agent = agent
        self.uid = pod_uid(pod)
        self.pod = pod
        self.removed = False  # gone from the API
        self.terminated = False  # containers stopped (deleted, or ended)
        self.finished = False  # deletion finished or the pod ended: no more syncs
        self.wake = asyncio.Event()
        self.wake.set()
        self.task: asyncio.Task | None = None
        #: the runtime sync under way, cancelled when the pod's termination is requested
        self._sync: asyncio.Future | None = None
        self.failures = 0
        #: admitted to run here (a pod that already started here was, before a restart)
        st = pod.get("status") or {}
        self.admitted = bool(st.get("startTime")) or st.get("phase") in TERMINAL_PHASES

    def update(self, pod: Obj) -> None:
        if self.removed or (pod.get("metadata") or {}).get("deletionTimestamp"):
            # termination requested: a sync under way (an image pull, a postStart hook)
            # is cut short, as upstream's pod workers cancel the sync's context
            if self._sync is not None and not self._sync.done():
                self._sync.cancel()
        self.pod = pod
        self.wake.set()

    async def run(self) -> None:
        agent = self.agent
        while True:
            timeout = agent.config.sync_frequency
            nxt = agent.runtime.next_wakeup(self.uid) if agent.runtime is not None else None
            if nxt is not None:
                timeout = max(0.0, min(timeout, nxt - time.time()))
            if self.failures:
                timeout = min(timeout, min(0.2 * 2 ** self.failures, 10.0))
            try:
                await asyncio.wait_for(self.wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            try:
                done = await self.step()
                self.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged, retried with a back-off
                self.failures += 1
                log.exception("syncing pod %s (%s) failed, retrying", pod_key(self.pod), self.uid)
                continue
            if done:
                return

    async def step(self) -> bool:
        """One reconcile; True when the pod is gone and cleaned up."""
        agent, pod = self.agent, self.pod
        runtime = agent.runtime
        if self.removed:
            agent.probes("stop_liveness_and_startup", pod)
            if not self.terminated:
                await runtime.terminate_pod(pod, deletion_grace(pod))
                self.terminated = True
            agent.probes("remove_pod", self.uid)
            await runtime.remove_pod(self.uid)
            agent.status.forget(self.uid)
            return True
        md = pod.get("metadata") or {}
        if md.get("deletionTimestamp"):
            if not self.terminated:
                agent.probes("stop_liveness_and_startup", pod)
                status = await runtime.terminate_pod(pod, deletion_grace(pod))
                self.terminated = True
                if isinstance(status, dict):
                    await agent.status.set(pod, status)
            # as upstream's status manager: the pod goes from the API only once nothing
            # of it runs and its volumes are unmounted
            await self._release_volumes()
            await agent.status.finish_deletion(pod)
            return False
        if self.finished:
            return False
        if not self.admitted:
            reason = await agent.admit(self)
            if reason is not None:
                await agent.reject(pod, *reason)
                self.finished = self.terminated = True
                return False
        agent.probes("add_pod", pod)
        self._sync = asyncio.ensure_future(runtime.sync_pod(pod))
        try:
            status = await self._sync
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._sync.cancelled() and task is not None and not task.cancelling():
                log.info("pod %s (%s): sync cut short, the pod is terminating", pod_key(pod), self.uid)
                return False  # the next step terminates it
            raise
        finally:
            if not self._sync.done():
                self._sync.cancel()
            self._sync = None
        if isinstance(status, dict):
            # the runtime's compute_status already handed the status to the prober
            await agent.status.set(pod, status)
            if status.get("phase") in TERMINAL_PHASES:
                # the runtime tore a pod in a terminal phase down (sandbox stopped);
                # its exited containers stay until the pod is deleted, its volumes go
                self.terminated = True
                self.finished = True
                await self._release_volumes()
        return False

    async def _release_volumes(self) -> None:
        volumes = getattr(self.agent.runtime, "volumes", None)
        if volumes is not None:
            await volumes.teardown(self.uid)


class StatusManager:
    """Writes pods' status to the API when it changed (upstream's status manager)."""

    def __init__(self, agent: "NodeAgent") -> None:
        self.agent = agent
        #: uid -> the status last written, and the pod's resourceVersions just before and after
        self.written: dict[str, tuple[Obj, tuple[str, str]]] = {}

    def forget(self, uid: str) -> None:
        self.written.pop(uid, None)

    async def set(self, pod: Obj, status: Obj) -> None:
        uid = pod_uid(pod)
        current = self.agent.current_pod(pod)
        if current is None:
            return  # gone, or replaced by another pod of the same name
        rv = (current.get("metadata") or {}).get("resourceVersion", "")
        last = self.written.get(uid)
        if last is not None and last[0] == status and rv in last[1]:
            return  # written, and nobody else changed the pod since (the cache may lag behind)
        if status_matches(current.get("status"), status):
            self.written[uid] = (status, (rv, rv))
            return
        md = pod["metadata"]
        try:
            got = await self.agent.client.patch(
                PODS, md["name"], {"metadata": {"uid": uid}, "status": status_patch(current.get("status"), status)},
                md.get("namespace"), patch_type="strategic", subresource="status", field_manager="kubelet")
        except StatusError as err:
            if err.code in (404, 409):
                return  # gone, or replaced by a pod of the same name
            raise
        self.written[uid] = (status, (rv, (got.get("metadata") or {}).get("resourceVersion", "")))

    async def finish_deletion(self, pod: Obj) -> None:
        """The containers are stopped: delete the pod for good (grace 0, this uid only)."""
        md = pod["metadata"]
        try:
            await self.agent.client.delete(PODS, md["name"], md.get("namespace"), grace_period_seconds=0,
                                           preconditions={"uid": pod_uid(pod)})
        except StatusError as err:
            if err.code not in (404, 409):
                raise


class NodeAgent:
    """A kubelet for one node: ``client`` acts as the node (``system:node:<name>``),
    ``cri`` reaches its container runtime.

    ``containerd_address``: the containerd socket image archives are imported
    through (``ctr``); None when the runtime is not containerd. ``runtime``:
    a KubeRuntime to use; by default one is made on :meth:`start`.
    """

    def __init__(self, client: Client, cri: CRIClient, config: AgentConfig, *,
                 containerd_address: str | None = None, runtime: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.cri = cri
        self.config = config
        self.containerd_address = containerd_address
        self.runtime = runtime
        self.clock = clock
        self.name = config.name
        #: the kubelet API's port (the configured one; the one taken when that was 0)
        self.kubelet_port = config.kubelet_port
        self.status = StatusManager(self)
        self.node: Obj | None = None
        self.pod_cidr: str | None = None
        self.runtime_version: pb.VersionResponse | None = None
        self.recorder: Any = None
        self.volumes: Any = None
        self.prober: Any = None
        self._workers: dict[str, _PodWorker] = {}
        self._informer: Any = None
        self._node_informer: Any = None
        self._tasks: list[asyncio.Task] = []
        self._lease: Obj | None = None
        self._last_posted: Obj | None = None
        self._last_post = 0.0
        self._relisted: dict[str, frozenset] = {}
        self._last_relist = 0.0
        self._runtime_error: str | None = None
        self._imported: dict[str, tuple[float, int]] = {}
        self._cleaning: set[str] = set()
        self._started = False
        #: the kubelet API (logs, exec, attach, port-forward) and the usage measurements
        self.server: Any = None
        #: the Service proxy (config.proxy)
        self.service_proxy: Any = None
        self.stats: Any = None
        self.log_manager: ContainerLogManager | None = None
        self.pod_routes: Any = None
        self.network_policy: Any = None
        self._network_policy_client: Any = None
        self._own_runtime = False
        #: the pods' cgroups (None: the runtime places pods where it wants)
        self.cgroups: Any = None
        self._lease_lock = asyncio.Lock()
        self._admit_lock = asyncio.Lock()

    # -- life ------------------------------------------------------------------

    async def start(self) -> None:
        """Register the node and start every loop; returns once the pods are being watched."""
        await self.start_node()
        await self.start_pods()

    async def start_node(self) -> None:
        """The node without its pods: runtime reached, images imported, Node
        registered, Lease and status kept, pod CIDR awaited."""
        os.makedirs(self.config.pods_dir, exist_ok=True)
        os.makedirs(self.config.logs_dir, exist_ok=True)
        os.makedirs(self.config.images_path, exist_ok=True)
        from kubeplane.client.events import EventRecorder

        self.recorder = EventRecorder(self.client, "kubelet", host=self.name)
        await self._wait_for_runtime()
        await self.import_images()
        await self._start_server()
        self._start_stats()
        if self.config.pod_cidr:  # the network first: the node registers Ready
            await self._set_pod_cidr_from(None)
            await self._wait_network_ready(5.0)
        await self.register()
        self._spawn(self._lease_loop(), "lease")
        self._spawn(self._status_loop(), "node-status")
        self._spawn(self._images_loop(), "images")
        await self._set_pod_cidr_from(self.node)
        if self.pod_cidr is None:
            self._spawn(self._pod_cidr_loop(), "pod-cidr")
        if self.config.proxy is not None:
            await self._start_proxy()
        self._started = True

    async def _start_proxy(self) -> None:
        import dataclasses

        from kubeplane.proxy import ServiceProxy

        cfg = self.config.proxy
        node_ips = cfg.node_ips or [a["address"] for a in (self.node or {}).get("status", {}).get("addresses") or []
                                    if a.get("type") == "InternalIP"]
        local = cfg.local_cidrs or ([self.pod_cidr] if self.pod_cidr else [])
        self.service_proxy = ServiceProxy(self.client, dataclasses.replace(
            cfg, node_name=cfg.node_name or self.name, node_ips=node_ips, local_cidrs=local))
        await self.service_proxy.start()

    async def start_pods(self) -> None:
        """Run the pods bound to the node: the runtime, the pod informer, the relist."""
        if self.runtime is None:
            self.cgroups = await self._pod_cgroups()
            self.runtime = self._make_runtime()
            self._own_runtime = True
        await self._start_pods()
        self._spawn(self._relist_loop(), "pleg")
        self.log_manager = ContainerLogManager(
            self.cri, max_size=self.config.container_log_max_size, max_files=self.config.container_log_max_files,
            monitor_interval=self.config.container_log_monitor_interval)
        self.log_manager.start()
        if self.config.pod_routes and self.config.cni_conf_dir:  # the node's pods are on its bridge network
            from kubeplane.node.routes import PodRoutes

            self.pod_routes = PodRoutes(self.client, self.name)
            await self.pod_routes.start()
        if self.config.network_policy_kubeconfig and self.config.cni_conf_dir:
            from kubeplane.client.http import HttpClient
            from kubeplane.node.netpol import NetworkPolicyController

            self._network_policy_client = HttpClient.from_kubeconfig(self.config.network_policy_kubeconfig)
            self.network_policy = NetworkPolicyController(self._network_policy_client, self.name)
            await self.network_policy.start()

    async def stop(self) -> None:
        """Stop the agent; the pods' containers keep running (a restarted agent adopts them)."""
        if self._informer is not None:  # first: no new pod workers
            await self._informer.stop()
            self._informer = None
        if self._node_informer is not None:
            await self._node_informer.stop()
            self._node_informer = None
        tasks, self._tasks = self._tasks, []
        workers = [w.task for w in self._workers.values() if w.task is not None]
        for t in tasks + workers:
            t.cancel()
        for t in tasks + workers:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception:  # noqa: BLE001
                log.exception("node agent task failed")
        self._workers.clear()
        if self.log_manager is not None:
            await self.log_manager.stop()
            self.log_manager = None
        if self.pod_routes is not None:
            try:
                await self.pod_routes.stop()
            except Exception:  # noqa: BLE001
                log.exception("removing the pod routes failed")
            self.pod_routes = None
        if self.network_policy is not None:
            try:
                await self.network_policy.stop()
            except Exception:  # noqa: BLE001
                log.exception("removing the network policy rules failed")
            self.network_policy = None
        if self._network_policy_client is not None:
            await self._network_policy_client.close()
            self._network_policy_client = None
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.service_proxy is not None:  # its rules go with it
            await self.service_proxy.stop()
            self.service_proxy = None
        for part in (self.runtime, self.prober, self.volumes, self.recorder):
            closer = getattr(part, "stop", None) or getattr(part, "close", None)
            if closer is not None:
                try:
                    res = closer()
                    if asyncio.iscoroutine(res):
                        await res
                except Exception:  # noqa: BLE001
                    log.exception("stopping %s failed", type(part).__name__)
        if self._own_runtime:  # started again, the agent makes new ones
            self.runtime = self.prober = self.volumes = None
        self.recorder = None
        self._relisted = {}
        self._started = False

    def _spawn(self, coro, name: str) -> None:
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=f"{self.name}-{name}"))

    async def _wait_for_runtime(self) -> None:
        deadline = time.monotonic() + self.config.runtime_wait
        delay = 0.1
        while True:
            try:
                self.runtime_version = await self.cri.version()
                return
            except CRIError as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the container runtime at {self.cri.endpoint} does not answer: {err}") \
                        from None
                log.info("waiting for the container runtime at %s: %s", self.cri.endpoint, err)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def kubelet_serving_pair(self) -> tuple[str, str]:
        """The kubelet API's serving certificate: the one under ``<data_dir>/pki``,
        else a self-signed one made there (upstream's kubelet without
        --tls-cert-file), for the node's name and addresses."""
        from kubeplane.auth import pki

        d = os.path.join(self.config.data_dir, "pki")
        names = tuple(dict.fromkeys([self.name, "localhost", "127.0.0.1",
                                     *([self.config.node_ip] if self.config.node_ip else [])]))
        return pki.ensure_self_signed_pair(os.path.join(d, "kubelet.crt"), os.path.join(d, "kubelet.key"),
                                           self.name, names)

    async def _start_server(self) -> None:
        """The kubelet API on the kubelet port (0: a free one, then reported)."""
        try:
            from kubeplane.node.server import KubeletServer
        except ImportError:  # a kubeplane without the kubelet API
            log.warning("node %s: no kubelet API in this kubeplane (logs, exec, port-forward unavailable)",
                        self.name)
            return
        cfg = self.config
        crt, key = await asyncio.to_thread(self.kubelet_serving_pair)
        client_ca = None
        if cfg.client_ca_data:
            client_ca = os.path.join(cfg.data_dir, "pki", "client-ca.crt")
            from kubeplane.auth import pki

            pki.write_private(client_ca, cfg.client_ca_data)
        address = cfg.kubelet_address or cfg.node_ip or "0.0.0.0"
        self.server = KubeletServer(self.cri, node_name=self.name, client=self.client, tls_cert_file=crt,
                                    tls_key_file=key, client_ca_file=client_ca, host=address,
                                    port=cfg.kubelet_port, streaming_idle_timeout=cfg.streaming_idle_timeout)
        await self.server.start()
        self.kubelet_port = self.server.port
        log.info("node %s: kubelet API on %s:%d", self.name, address, self.kubelet_port)

    def _start_stats(self) -> None:
        try:
            from kubeplane.node.stats import StatsProvider
        except ImportError:  # a kubeplane without usage measurements
            return
        self.stats = StatsProvider(self.cri)

    async def _usage_annotations(self) -> dict[str, str]:
        """The measured usage report each Lease renewal carries (for metrics.k8s.io)."""
        if self.stats is None:
            return {}
        from kubeplane.api.usage import USAGE_ANNOTATION

        try:
            return {USAGE_ANNOTATION: await self.stats.report()}
        except Exception as err:  # noqa: BLE001 - the renewal goes on without it
            log.warning("node %s: measuring usage: %s", self.name, err)
            return {}

    async def _pod_cgroups(self) -> Any:
        """The node's pod cgroups (upstream's container manager, cgroupfs driver);
        None when the node does without: --cgroups-per-qos off, a runtime with
        the systemd driver, or a host whose cgroups cannot be written."""
        from kubeplane.node.cgroups import CgroupError, PodCgroups, node_allocatable_config, runtime_cgroup_driver

        cfg = self.config
        if not cfg.cgroups_per_qos:
            return None
        try:
            st = await self.cri.runtime("Status", pb.StatusRequest(verbose=True))
            driver = runtime_cgroup_driver(st.info)
        except CRIError as err:
            log.warning("node %s: the runtime's status: %s; assuming the cgroupfs driver", self.name, err)
            driver = "cgroupfs"
        if driver != "cgroupfs":
            log.warning("node %s: the runtime uses the %s cgroup driver; pods get no pod cgroup of the node",
                        self.name, driver)
            return None
        cap = host.measure_capacity(cfg.data_dir, cfg.max_pods, cfg.system_reserved)
        try:
            cgroups = PodCgroups(cfg.cgroup_root,
                                 node_config=node_allocatable_config(cap.capacity, cfg.system_reserved))
            await asyncio.to_thread(cgroups.setup)
        except (CgroupError, OSError) as err:
            log.warning("node %s: pods get no pod cgroup: %s", self.name, err)
            return None
        return cgroups

    def _make_runtime(self) -> Any:
        from kubeplane.node.kuberuntime import KubeRuntime
        from kubeplane.node.prober import ProbeManager
        from kubeplane.node.volumes import VolumeManager, make_rshared

        # as the kubelet does to its root directory: the pods' volumes on a shared mount, so
        # that mountPropagation HostToContainer and Bidirectional can be honoured
        os.makedirs(self.config.pods_dir, exist_ok=True)
        try:
            make_rshared(self.config.pods_dir)
        except OSError as err:
            log.warning("node %s: %s is not on a shared mount (%s): mountPropagation other than None "
                        "will fail", self.name, self.config.pods_dir, err)
        self.volumes = VolumeManager(self.client, self.config.pods_dir, node_name=self.name,
                                     recorder=self.recorder)
        self.prober = ProbeManager(self.cri, self.wake_pod, recorder=self.recorder)
        status = (self.node or {}).get("status") or {}
        host_ips = [a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"]
        return KubeRuntime(self.cri, client=self.client, node_name=self.name, pods_dir=self.config.pods_dir,
                           logs_dir=self.config.logs_dir, volumes=self.volumes, prober=self.prober,
                           recorder=self.recorder, host_ips=host_ips,
                           cluster_dns=self.config.cluster_dns, cluster_domain=self.config.cluster_domain,
                           resolv_conf=self.config.resolv_conf,
                           allocatable=dict(status.get("allocatable") or {}), cgroups=self.cgroups)

    # -- the Node ------------------------------------------------------------------

    async def node_status(self) -> Obj:
        """The node's status as measured now."""
        cfg = self.config
        cap = host.measure_capacity(cfg.data_dir, cfg.max_pods, cfg.system_reserved)
        pressure = host.measure_pressure(cfg.data_dir, cfg.system_reserved)
        now = format_time(utcnow())
        version = self.runtime_version
        status: Obj = {
            "capacity": cap.capacity,
            "allocatable": cap.allocatable,
            "conditions": node_conditions(now, memory_pressure=pressure.memory, disk_pressure=pressure.disk,
                                          pid_pressure=pressure.pid, not_ready=await self._not_ready()),
            "addresses": host.node_addresses(self.name, cfg.node_ip),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "nodeInfo": host.node_info(version.runtime_name if version else "unknown",
                                       version.runtime_version if version else "",
                                       KUBELET_VERSION),
            "images": await self._images(),
        }
        return status

    async def _not_ready(self) -> str | None:
        """Why the node is not ready (upstream's aggregated runtime errors), None when it is."""
        errs = []
        try:
            st = await self.cri.runtime("Status", pb.StatusRequest(), timeout=10.0)
            self._runtime_error = None
            for c in st.status.conditions:
                if not c.status:
                    what = "container runtime network not ready" if c.type == "NetworkReady" \
                        else "container runtime not ready"
                    errs.append(f"{what}: {c.type}={str(c.status).lower()} reason:{c.reason} message:{c.message}")
        except CRIError as err:
            self._runtime_error = str(err)
            errs.append("container runtime is down")
        if self._started and self._last_relist and self.clock() - self._last_relist > PLEG_THRESHOLD:
            ago = self.clock() - self._last_relist
            errs.append(f"PLEG is not healthy: pleg was last seen active {ago:.0f}s ago; threshold is 3m0s")
        if not errs:
            return None
        return errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"

    async def _images(self) -> list[Obj]:
        try:
            images = (await self.cri.image("ListImages", pb.ListImagesRequest(), timeout=30.0)).images
        except CRIError as err:
            log.warning("listing images: %s", err)
            return []
        out = []
        for im in sorted(images, key=lambda i: i.size, reverse=True)[:MAX_IMAGES]:
            names = (list(im.repo_digests) + list(im.repo_tags))[:MAX_NAMES_PER_IMAGE]
            if names:
                out.append({"names": names, "sizeBytes": int(im.size)})
        return out

    def node_object(self, status: Obj) -> Obj:
        labels = {**default_labels(self.name, "linux", host.go_arch()), **self.config.labels}
        body: Obj = {"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": self.name, "labels": labels,
                                  "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
                     "spec": {}, "status": status}
        if self.config.pod_cidr:
            body["spec"] = {"podCIDR": self.config.pod_cidr, "podCIDRs": [self.config.pod_cidr]}
        return body

    async def register(self) -> None:
        """Create the Node, or take over the one of this name (upstream's registerWithAPIServer)."""
        if self.recorder is not None:
            self.recorder.event({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "uid": self.name}},
                                "Normal", "Starting", "Starting kubelet.")
        status = await self.node_status()
        body = self.node_object(status)
        delay = 0.1
        while True:
            try:
                self.node = await self.client.create(NODES, body)
                break
            except StatusError as err:
                if err.code != 409:
                    if err.code in (401, 403) or err.code < 500:
                        raise
                    log.error("registering node %s: %s; retrying", self.name, err.message)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 7.0)
                    continue
            existing = await self.client.get(NODES, self.name)
            labels = dict((existing.get("metadata") or {}).get("labels") or {})
            want = body["metadata"]["labels"]
            if any(labels.get(k) != v for k, v in want.items()):
                self.node = await self.client.patch(NODES, self.name, {"metadata": {"labels": want}})
            else:
                self.node = existing
            break
        await self._post_status(status, force=True)
        log.info("node %s registered", self.name)

    async def _post_status(self, status: Obj, *, force: bool = False) -> None:
        old = (self.node or {}).get("status") or {}
        status = {**status, "conditions": carry_transitions(old.get("conditions"), status["conditions"])}
        if not force and self._last_posted is not None and _same_status(self._last_posted, status) \
                and self.clock() - self._last_post < self.config.node_status_report_frequency:
            return
        self.node = await self.client.patch(NODES, self.name, {"status": status}, patch_type="strategic",
                                            subresource="status", field_manager="kubelet")
        self._condition_events(old.get("conditions") if self._last_posted is not None else None,
                               status["conditions"])
        self._last_posted = status
        self._last_post = self.clock()

    def _condition_events(self, old: list | None, new: list[Obj]) -> None:
        """Upstream's node status events: one per condition that changed (all at first)."""
        if self.recorder is None:
            return
        before = {c.get("type"): c.get("status") for c in old or [] if isinstance(c, dict)}
        ref = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "uid": self.name}}
        for c in new:
            if before.get(c["type"]) == c["status"]:
                continue
            if c["type"] == "Ready":
                event = "NodeReady" if c["status"] == "True" else "NodeNotReady"
            else:
                event = {"KubeletHasSufficientMemory": "NodeHasSufficientMemory",
                         "KubeletHasInsufficientMemory": "NodeHasInsufficientMemory",
                         "KubeletHasNoDiskPressure": "NodeHasNoDiskPressure",
                         "KubeletHasDiskPressure": "NodeHasDiskPressure",
                         "KubeletHasSufficientPID": "NodeHasSufficientPID",
                         "KubeletHasInsufficientPID": "NodeHasInsufficientPID"}.get(c.get("reason", ""))
            if event:
                self.recorder.event(ref, "Normal", event, f"Node {self.name} status is now: {event}")

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.node_status_update_frequency)
            try:
                await self._post_status(await self.node_status())
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - retried at the next period
                log.error("updating node %s status: %s", self.name, err)

    # -- the Lease -------------------------------------------------------------------

    async def renew_lease(self) -> Obj:
        """One renewal as upstream's lease controller: update the last Lease
        written; on a conflict or when unknown, get (or create) it first."""
        usage = await self._usage_annotations()
        async with self._lease_lock:
            return await self._renew_lease(usage)

    async def _renew_lease(self, usage: dict[str, str]) -> Obj:
        now = micro_time()
        for _ in range(5):
            if self._lease is None:
                try:
                    self._lease = await self.client.get(LEASES, self.name, LEASE_NAMESPACE)
                except StatusError as err:
                    if err.code != 404:
                        raise
                    body = lease_object(self.name, now, duration=self.config.lease_duration,
                                        node_uid=(self.node or {}).get("metadata", {}).get("uid"),
                                        annotations=usage)
                    try:
                        self._lease = await self.client.create(LEASES, body, LEASE_NAMESPACE)
                    except StatusError as err:
                        if err.code != 409:
                            raise
                        continue  # made meanwhile: get it
                    return self._lease
            lease = dict(self._lease)
            lease["spec"] = {**(lease.get("spec") or {}), "holderIdentity": self.name,
                             "leaseDurationSeconds": self.config.lease_duration, "renewTime": now}
            node_uid = (self.node or {}).get("metadata", {}).get("uid")
            md = dict(lease.get("metadata") or {})
            if usage:
                md["annotations"] = {**(md.get("annotations") or {}), **usage}
            if node_uid and not md.get("ownerReferences"):
                md["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node_uid}]
            lease["metadata"] = md
            try:
                self._lease = await self.client.update(LEASES, lease)
                return self._lease
            except StatusError as err:
                self._lease = None
                if err.code not in (404, 409):
                    raise
        raise RuntimeError(f"renewing the Lease of {self.name}: too many conflicts")

    async def _lease_loop(self) -> None:
        interval = self.config.lease_duration / 4
        backoff = 0.1
        while True:
            try:
                await self.renew_lease()
                backoff = 0.1
                await asyncio.sleep(interval)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - retried with upstream's back-off
                backoff = min(backoff * 2, 7.0)
                log.error("renewing the Lease of %s, retrying in %gs: %s", self.name, backoff, err)
                await asyncio.sleep(backoff)

    # -- pod CIDR and networking -----------------------------------------------------

    async def _set_pod_cidr_from(self, node: Obj | None) -> None:
        spec = (node or {}).get("spec") or {}
        cidr = self.config.pod_cidr or spec.get("podCIDR")
        if not cidr or cidr == self.pod_cidr:
            return
        self.pod_cidr = cidr
        if self.config.cni_conf_dir:
            path = cni.write_conflist(self.config.cni_conf_dir, cni.bridge_conflist(
                cidr, bridge=self.config.bridge,
                ipam_dir=os.path.join(self.config.data_dir, "cni-ipam")))
            log.info("node %s: pod CIDR %s, CNI configuration %s", self.name, cidr, path)

    async def _wait_network_ready(self, timeout: float) -> bool:
        """Until the runtime reports NetworkReady (it reads the CNI configuration on its own time)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                st = await self.cri.runtime("Status", pb.StatusRequest(), timeout=5.0)
                if all(c.status for c in st.status.conditions if c.type == "NetworkReady"):
                    return True
            except CRIError:
                pass
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)

    async def _pod_cidr_loop(self) -> None:
        """Until the node has a pod CIDR: look at the Node (the IPAM controller sets it)."""
        delay = 0.2
        while self.pod_cidr is None:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 5.0)
            try:
                await self._set_pod_cidr_from(await self.client.get(NODES, self.name))
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001
                log.warning("reading node %s for its pod CIDR: %s", self.name, err)
        # the runtime's Status turns NetworkReady once it sees the configuration
        await self._wait_network_ready(10.0)
        try:
            await self._post_status(await self.node_status(), force=True)
        except StatusError as err:
            log.warning("updating node %s status: %s", self.name, err.message)

    # -- images ----------------------------------------------------------------------------

    async def import_images(self, *, settle: float = 0.0) -> list[str]:
        """Import the archives of the images directory not imported yet (or
        changed; with ``settle``, only those unchanged for that many seconds,
        which are not being written any more); the names imported."""
        d = self.config.images_path
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return []
        if self.containerd_address is None:
            if any(is_archive(n) for n in names):
                log.warning("images in %s not imported: the runtime is not a containerd this node knows", d)
            return []
        imported = []
        for n in names:
            if not is_archive(n):
                continue
            path = os.path.join(d, n)
            try:
                st = os.stat(path)
            except OSError:
                continue
            mark = (st.st_mtime, st.st_size)
            if self._imported.get(path) == mark:
                continue
            if settle and time.time() - st.st_mtime < settle:
                continue  # possibly still being written: next look
            try:
                got = await import_archive(self.containerd_address, path)
                log.info("imported %s: %s", path, ", ".join(got) or "no image names")
                imported.extend(got)
            except ImageError as err:
                log.error("%s", err)
            self._imported[path] = mark
        return imported

    async def _images_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.images_poll_period)
            try:
                if await self.import_images(settle=1.0):
                    await self._post_status(await self.node_status())
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001
                log.error("images directory: %s", err)

    # -- pods --------------------------------------------------------------------------------

    async def _start_pods(self) -> None:
        from kubeplane.client.informer import SharedInformer

        # the node's own Node as others change it (taints, labels), for admission: upstream's node lister
        self._node_informer = SharedInformer(self.client, NODES, field_selector=f"metadata.name={self.name}")
        self._node_informer.start()
        self._informer = SharedInformer(self.client, PODS, field_selector=f"spec.nodeName={self.name}")
        self._informer.add_event_handler(self._on_pod, self._on_pod_update, self._on_pod_deleted)
        self._informer.start()
        if not await self._informer.wait_for_sync(60.0):
            raise RuntimeError(f"node {self.name}: the pods bound to it could not be listed")

    def current_pod(self, pod: Obj) -> Obj | None:
        """The informer's copy of ``pod`` (None when gone or replaced)."""
        if self._informer is None:
            return None
        cur = self._informer.indexer.get_by_key(pod_key(pod))
        return cur if cur is not None and pod_uid(cur) == pod_uid(pod) else None

    def _on_pod(self, pod: Obj) -> None:
        uid = pod_uid(pod)
        w = self._workers.get(uid)
        if w is None:
            w = self._workers[uid] = _PodWorker(self, pod)
            w.task = asyncio.get_running_loop().create_task(self._run_worker(w), name=f"pod-{pod_key(pod)}")
        else:
            w.update(pod)

    def _on_pod_update(self, old: Obj, new: Obj) -> None:
        if pod_uid(old) != pod_uid(new):  # deleted and made again under the same name
            self._on_pod_deleted(old)
        self._on_pod(new)

    def _on_pod_deleted(self, pod: Obj) -> None:
        from kubeplane.client.informer import unwrap_deleted

        pod = unwrap_deleted(pod)
        w = self._workers.get(pod_uid(pod))
        if w is None:
            return
        w.removed = True
        w.update(pod)

    async def _run_worker(self, w: _PodWorker) -> None:
        try:
            await w.run()
        finally:
            if self._workers.get(w.uid) is w:
                del self._workers[w.uid]

    async def admit(self, worker: "_PodWorker") -> tuple[str, str] | None:
        """Whether a new pod may run here (upstream's predicate admission, see
        :mod:`kubeplane.node.admission`) next to the pods admitted before and
        still running; None (and the worker is admitted), or (reason, message).
        Pods are admitted one at a time, as upstream's HandlePodAdditions."""
        async with self._admit_lock:
            rejected = await self._admission(worker)
            if rejected is None:
                worker.admitted = True
            return rejected

    async def _admission(self, worker: "_PodWorker") -> tuple[str, str] | None:
        inf = self._node_informer
        node = inf.indexer.get_by_key(self.name) if inf is not None and inf.has_synced() else None
        if node is None:
            try:
                node = await self.client.get(NODES, self.name)
            except StatusError as err:
                log.warning("reading node %s for admitting %s: %s", self.name, pod_key(worker.pod), err.message)
                node = self.node
                if node is None:
                    return admission.INVALID_NODE_INFO, "Kubelet cannot get node info."
        others = [w.pod for w in self._workers.values()
                  if w is not worker and w.admitted and not w.finished and not w.removed and not w.terminated
                  and not (w.pod.get("metadata") or {}).get("deletionTimestamp")]
        return admission.admit(worker.pod, node, others)

    async def reject(self, pod: Obj, reason: str, message: str) -> None:
        """A pod this node will not run: Failed, with the reason (and a Warning event)."""
        if self.recorder is not None:
            self.recorder.event(pod, "Warning", reason, message)
        log.info("node %s rejected pod %s: %s", self.name, pod_key(pod), message)
        status: Obj = {"phase": "Failed", "reason": reason, "message": "Pod was rejected: " + message}
        qos = (pod.get("status") or {}).get("qosClass")
        if qos:
            status["qosClass"] = qos
        await self.status.set(pod, status)

    def probes(self, method: str, *args: Any) -> Any:
        """Tell the probe manager (when there is one) about a pod."""
        fn = getattr(self.prober, method, None) if self.prober is not None else None
        return fn(*args) if fn is not None else None

    def wake_pod(self, uid: str) -> None:
        """Sync the pod of ``uid`` now (a probe result or a container changed)."""
        w = self._workers.get(uid)
        if w is not None:
            w.wake.set()

    @property
    def pod_uids(self) -> list[str]:
        return list(self._workers)

    # -- relist (PLEG) and orphans ----------------------------------------------------------

    async def relist(self) -> set[str]:
        """List sandboxes and containers; wake the pods whose ones changed,
        clean up those of pods the API no longer has. The uids that changed."""
        now = {rp.uid: frozenset({("s", s.id, s.ready) for s in rp.sandboxes}
                                 | {("c", c.id, c.state) for c in rp.containers})
               for rp in await self.runtime.running_pods()}
        changed = {uid for uid in set(now) | set(self._relisted) if now.get(uid) != self._relisted.get(uid)}
        self._relisted = now
        self._last_relist = self.clock()
        for uid in changed:
            self.wake_pod(uid)
        if self._informer is not None and self._informer.has_synced():
            known = {pod_uid(p) for p in self._informer.indexer.list()} | set(self._workers)
            on_disk = getattr(self.volumes, "pod_uids_on_disk", None)
            # pods the runtime still holds, or whose directories (volumes) remain
            for uid in set(now) | set(on_disk() if on_disk is not None else ()):
                if uid not in known and uid not in self._cleaning:
                    self._cleaning.add(uid)
                    self._spawn(self._remove_orphan(uid), f"orphan-{uid[:8]}")
        return changed

    async def _remove_orphan(self, uid: str) -> None:
        try:
            log.info("node %s: removing the containers of pod %s, which the API no longer has", self.name, uid)
            await self.runtime.remove_pod(uid)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - tried again at a later relist
            log.error("removing orphaned pod %s: %s", uid, err)
        finally:
            self._cleaning.discard(uid)

    async def _relist_loop(self) -> None:
        while True:
            try:
                await self.relist()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001
                log.error("relisting the container runtime: %s", err)
            await asyncio.sleep(self.config.relist_period)


def _same_status(a: Obj, b: Obj) -> bool:
    """Two node statuses equal but for the conditions' heartbeat times."""
    def strip(s: Obj) -> Obj:
        return {**s, "conditions": [{k: v for k, v in c.items() if k != "lastHeartbeatTime"}
                                    for c in s.get("conditions") or []]}
    return strip(a) == strip(b)


def default_node_name() -> str:
    """The kubelet's default node name: the hostname, lowercased."""
    return socket.gethostname().lower()


#: the sandbox image a node with its own containerd uses unless told otherwise:
#: built from the host's static busybox when the runtime does not have it, so a
#: node works without any registry (``--pod-infra-container-image`` names
#: another, e.g. registry.k8s.io/pause:3.10, pulled when absent)
DEFAULT_SANDBOX_IMAGE = "kubeplane.local/pause:3.10"


async def ensure_sandbox_image(cri: CRIClient, address: str | None, ref: str, work_dir: str) -> str:
    """Make sure the runtime holds the sandbox image ``ref``: present, pulled,
    or (for :data:`DEFAULT_SANDBOX_IMAGE`) built from busybox and imported.
    Returns how it was obtained: ``present``, ``pulled`` or ``built``."""
    from kubeplane.node.images import build_pause_image

    try:
        st = await cri.image("ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)))
        if st.image and st.image.id:
            return "present"
    except CRIError as err:
        if not err.not_found:
            raise
    if ref == DEFAULT_SANDBOX_IMAGE:
        if address is None:
            raise ImageError(f"the sandbox image {ref} is missing and cannot be imported into this runtime")
        os.makedirs(work_dir, exist_ok=True)
        archive = os.path.join(work_dir, "pause.tar")
        await asyncio.to_thread(build_pause_image, archive, ref)
        try:
            await import_archive(address, archive)
        finally:
            try:
                os.unlink(archive)
            except OSError:
                pass
        return "built"
    try:
        await cri.image("PullImage", pb.PullImageRequest(image=pb.ImageSpec(image=ref)))
    except CRIError as err:
        raise ImageError(f"the sandbox image {ref} is missing and pulling it failed: {err.details}") from None
    return "pulled"


class ManagedNode:
    """A whole node: its containerd (its own, under ``<data_dir>/containerd``,
    unless ``cri_socket`` names a running one) and its :class:`NodeAgent`.

    :meth:`stop` leaves the pods' containers running (their shims outlive
    containerd), so a node started again on the same data directory adopts
    them; ``stop(remove_pods=True)`` removes every pod, shim and mount too,
    the bridge, and (with its own containerd) portmap's shared hostPort chains
    once no pod uses them.
    """

    def __init__(self, client: Client, config: AgentConfig, *, cri_socket: str | None = None,
                 sandbox_image: str = DEFAULT_SANDBOX_IMAGE, containerd_binary: str = "containerd",
                 containerd_address: str | None = None) -> None:
        self.client = client
        self.config = config
        self.cri_socket = cri_socket
        self.sandbox_image = sandbox_image
        self.containerd_binary = containerd_binary
        #: with cri_socket: the containerd socket to import images through (default: cri_socket)
        self._containerd_address = containerd_address
        self.containerd: Any = None
        self.cri: CRIClient | None = None
        self.agent: NodeAgent | None = None

    async def start(self) -> None:
        from kubeplane.node.containerd import ManagedContainerd

        cfg = self.config
        os.makedirs(cfg.data_dir, exist_ok=True)
        if cfg.client_ca_data is None:
            # the kubelet API trusts client certificates of the cluster's CA, as its client does
            ccfg = getattr(self.client, "config", None)
            ca_data = getattr(ccfg, "ca_data", None)
            if ca_data is None and getattr(ccfg, "ca_file", None):
                with open(ccfg.ca_file, "rb") as f:
                    ca_data = f.read()
            cfg.client_ca_data = ca_data
        try:
            if self.cri_socket is None:
                self.containerd = ManagedContainerd(os.path.join(cfg.data_dir, "containerd"),
                                                    sandbox_image=self.sandbox_image, binary=self.containerd_binary)
                await self.containerd.start()
                endpoint, address = self.containerd.endpoint, self.containerd.address
                if cfg.cni_conf_dir is None:
                    cfg.cni_conf_dir = self.containerd.paths.cni_conf_dir
            else:
                endpoint = self.cri_socket
                address = self._containerd_address or self.cri_socket.removeprefix("unix://")
            self.cri = CRIClient(endpoint)
            if self.containerd is not None:
                how = await ensure_sandbox_image(self.cri, address, self.sandbox_image,
                                                 os.path.join(cfg.data_dir, "tmp"))
                log.info("sandbox image %s: %s", self.sandbox_image, how)
            self.agent = NodeAgent(self.client, self.cri, cfg, containerd_address=address)
            await self.agent.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self, *, remove_pods: bool = False) -> None:
        owns_runtime = self.containerd is not None
        cgroups = None
        if self.agent is not None:
            cgroups = self.agent.cgroups
            await self.agent.stop()
            self.agent = None
        if self.cri is not None:
            await self.cri.close()
            self.cri = None
        if self.containerd is not None:
            await self.containerd.stop(remove_pods=remove_pods)
            if remove_pods:
                self.containerd.remove()
            self.containerd = None
        if remove_pods:
            from kubeplane.node.containerd import unmount_under

            unmount_under(self.config.data_dir)  # the pods' volumes
        if remove_pods and cgroups is not None and self.cri_socket is None:
            # the pods went with the node's containerd: their cgroups and the node's go too
            try:
                on_disk = set(os.listdir(self.config.pods_dir))
            except OSError:
                on_disk = set()
            for uid in (set(cgroups.pods) | on_disk) & cgroups.pod_uids():
                await asyncio.to_thread(cgroups.remove_pod, uid)
            cgroups.remove_all()
        if remove_pods and self.config.cni_conf_dir:
            # the bridge the CNI configuration named (made by the first pod)
            proc = await asyncio.create_subprocess_exec("ip", "link", "del", self.config.bridge,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            await proc.wait()
        if remove_pods and owns_runtime:
            # every sandbox is gone (CNI DEL ran for each): portmap's shared chains, if no other node uses them
            await asyncio.to_thread(cni.remove_unused_hostport_chains)
