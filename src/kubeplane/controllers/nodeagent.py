"""Simulated nodes: what a kubelet does, minus the containers.

For each simulated node the agent registers a Node (capacity, allocatable,
labels, addresses, Ready condition, node info), renews its Lease in
``kube-node-lease``, and for pods bound to it plays the kubelet: reports them
Running and Ready (pod IP, container statuses, conditions) and finishes
graceful deletion (the containers are stopped and a pod not yet terminal is
reported Failed first, as a kubelet does).

A pod annotated ``kubeplane.io/exit-after`` (seconds) has its containers exit
that long after they started, with the exit code ``kubeplane.io/exit-code``
(0 by default). The pod's ``restartPolicy`` decides what follows, as in the
kubelet: ``Never`` ends the pod (Succeeded for 0, Failed otherwise),
``OnFailure`` ends it on 0 and restarts the containers otherwise, ``Always``
restarts them (``restartCount`` and ``lastState`` move on). The agent reads
time from its ``clock``; a timer only wakes the pod up to compare again, so a
test moving the clock just resyncs (:meth:`NodeAgent.resync_pods`).
Each Lease renewal carries the node's resource usage report (the model is in
:mod:`kubeplane.controllers.nodeusage`, the API that serves it in
:mod:`kubeplane.registry.metrics`).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import ipaddress
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, parse_time, utcnow
from kubeplane.api.nodestatus import KUBELET_VERSION, LEASE_NAMESPACE, lease_object, micro_time, node_conditions
from kubeplane.api.resources import resource
from kubeplane.auth.user import AUTHENTICATED, NODE_PREFIX, NODES_GROUP, UserInfo, acting_as
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

NODES = resource("nodes")
PODS = resource("pods")
LEASES = resource("leases")
DEVICE_CLASSES = resource("deviceclasses")
RESOURCE_SLICES = resource("resourceslices")

GPU_DRIVER = "gpu.kubeplane.io"

EXIT_AFTER_ANNOTATION = "kubeplane.io/exit-after"
EXIT_CODE_ANNOTATION = "kubeplane.io/exit-code"
#: the exit code of a container stopped by SIGTERM when its pod is deleted
TERMINATED_EXIT_CODE = 143


@dataclass
class NodeSpec:
    """Shape of the simulated nodes."""

    cpu: str = "4"
    memory: str = "32Gi"
    pods: int = 110
    ephemeral_storage: str = "100Gi"
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)
    zones: int = 0  # >0: spread nodes over zone-0..zone-(n-1) (topology.kubernetes.io/zone)
    extra_capacity: dict[str, str] = field(default_factory=dict)
    gpus: int = 0  # simulated DRA devices per node, published as a ResourceSlice
    gpu_model: str = "KP-A100"
    gpu_memory: str = "40Gi"


def node_object(name: str, index: int, spec: NodeSpec) -> Obj:
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods),
                "ephemeral-storage": spec.ephemeral_storage, **spec.extra_capacity}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kubeplane-simulated",
        **spec.labels,
    }
    if spec.zones > 0:
        zone = f"zone-{index % spec.zones}"
        labels["topology.kubernetes.io/zone"] = zone
        labels["topology.kubernetes.io/region"] = "region-0"
    now = format_time(utcnow())
    internal_ip = str(ipaddress.ip_address("10.0.0.0") + 1 + index)
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": f"10.244.{index % 256}.0/24", "podCIDRs": [f"10.244.{index % 256}.0/24"]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": _conditions(now),
            "addresses": [{"type": "InternalIP", "address": internal_ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"kubeplane-{index}", "systemUUID": f"kubeplane-{index}", "bootID": f"boot-{index}",
                "kernelVersion": "6.1.0-kubeplane", "osImage": "kubeplane simulated node",
                "containerRuntimeVersion": "kubeplane://0.1.0", "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION, "operatingSystem": "linux", "architecture": "amd64",
            },
            "images": [],
        },
    }
    if spec.taints:
        body["spec"]["taints"] = [dict(t) for t in spec.taints]
    return body


def gpu_device_class() -> Obj:
    """The DeviceClass selecting every simulated GPU."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": GPU_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]},
    }


def gpu_slice(node: str, spec: "NodeSpec") -> Obj:
    """One ResourceSlice per node: a pool named after the node with ``spec.gpus`` devices."""
    devices = [{
        "name": f"gpu-{i}",
        "attributes": {"model": {"string": spec.gpu_model}, "index": {"int": i},
                       "driverVersion": {"version": "1.0.0"}},
        "capacity": {"memory": {"value": spec.gpu_memory}},
    } for i in range(spec.gpus)]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{GPU_DRIVER}"},
        "spec": {"driver": GPU_DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }


def _conditions(now: str) -> list[dict]:
    return node_conditions(now)


def node_user(name: str) -> UserInfo:
    """A kubelet's identity (upstream's system:node:<name> in system:nodes)."""
    user = _node_users.get(name)
    if user is None:
        user = _node_users[name] = UserInfo(NODE_PREFIX + name, groups=(NODES_GROUP, AUTHENTICATED))
    return user


_node_users: dict[str, UserInfo] = {}


class NodeAgent(Controller):
    """Runs ``count`` simulated nodes named ``<prefix>-<i>``."""

    def __init__(
        self,
        client: Client,
        names: list[str],
        spec: NodeSpec | None = None,
        factory: SharedInformerFactory | None = None,
        *,
        heartbeat_interval: float = 10.0,
        start_delay: float = 0.0,
        termination_delay: float = 0.05,
        clock: Callable[[], _dt.datetime] = utcnow,
    ) -> None:
        super().__init__("kubelet", client, factory, workers=4)
        self.clock = clock
        #: when this agent started each pod's containers (by pod key: uid, time): the
        #: status keeps whole seconds only, exit-after is measured from the exact time
        self._started: dict[str, tuple[str, _dt.datetime]] = {}
        self._warned: set[tuple[str, str]] = set()
        self.names = list(names)
        self._index = {n: i for i, n in enumerate(self.names)}
        self.spec = spec or NodeSpec()
        self.heartbeat_interval = heartbeat_interval
        self.start_delay = start_delay
        self.termination_delay = termination_delay
        self._pods = self.factory.informer_for(PODS)
        #: to notice the node lifecycle controller marking a node Unknown while it runs
        self._nodes = self.factory.informer_for(NODES)
        self._pods.add_event_handler(self._enqueue, lambda old, new: self._enqueue(new), self._enqueue)
        self._queue = self.add_queue("pods", self._sync_pod)
        self._ip_counter: dict[str, int] = {}
        self._timers: set[asyncio.Task] = set()
        self._heartbeat: asyncio.Task | None = None
        # resource usage, reported with each Lease renewal (kubeplane.registry.metrics)
        from kubeplane.controllers.nodeusage import UsageReports
        from kubeplane.controllers.replicaset import add_indexers

        add_indexers(self._pods, {"spec.nodeName": lambda p: [(p.get("spec") or {}).get("nodeName") or ""]})
        self.usage = UsageReports(lambda node: self._pods.indexer.by_index("spec.nodeName", node),
                                  self._report_usage)
        self._usage_task: asyncio.Task | None = None

    def resync_pods(self) -> None:
        """Look at every pod of these nodes again (e.g. after the clock moved)."""
        for pod in self._pods.indexer.list():
            self._enqueue(pod)

    def _enqueue(self, pod: Any) -> None:
        pod = getattr(pod, "obj", pod)
        node = (pod.get("spec") or {}).get("nodeName")
        if node in self._index:
            md = pod.get("metadata") or {}
            self._queue.add(f"{md.get('namespace')}/{md.get('name')}")
            self.usage.touched(node)

    async def register(self) -> None:
        """Create or refresh the Node objects."""
        for i, name in enumerate(self.names):
            body = node_object(name, i, self.spec)
            with acting_as(node_user(name)):
                try:
                    await self.client.create(NODES, body)
                except StatusError as err:
                    if err.code != 409:
                        raise
                    await self._refresh_status(name, body)
        if self.spec.gpus:
            await self._publish_devices()

    async def _publish_devices(self) -> None:
        """What a DRA driver's kubelet plugin does: a DeviceClass and one slice per node."""
        await self._create_or_replace(DEVICE_CLASSES, gpu_device_class())
        for name in self.names:
            await self._create_or_replace(RESOURCE_SLICES, gpu_slice(name, self.spec))

    async def _create_or_replace(self, res, body: Obj) -> None:
        try:
            await self.client.create(res, body)
        except StatusError as err:
            if err.code != 409:
                raise
            current = await self.client.get(res, body["metadata"]["name"])
            if current.get("spec") != body["spec"]:
                body = {**body, "metadata": {**body["metadata"],
                                             "resourceVersion": current["metadata"]["resourceVersion"]}}
                await self.client.update(res, body)

    async def _refresh_status(self, name: str, body: Obj) -> None:
        patch = {"status": {"conditions": _conditions(format_time(utcnow())),
                            "capacity": body["status"]["capacity"],
                            "allocatable": body["status"]["allocatable"],
                            "nodeInfo": body["status"]["nodeInfo"]}}
        await self.client.patch(NODES, name, patch, patch_type="strategic", subresource="status")

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        await self.register()
        await super().start(sync_timeout)
        self._heartbeat = asyncio.get_running_loop().create_task(self._heartbeats())
        self._usage_task = asyncio.get_running_loop().create_task(self.usage.run())

    async def stop(self, timeout: float = 5.0) -> None:
        for task in (self._heartbeat, self._usage_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for t in list(self._timers):
            t.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        await super().stop(timeout)

    async def _heartbeats(self) -> None:
        while True:
            for name in self.names:
                try:
                    with acting_as(node_user(name)):
                        await self._renew_lease(name)
                        await self._repost_status_if_stale(name)
                except StatusError as err:
                    log.debug("lease renewal for %s failed: %s", name, err)
            await asyncio.sleep(self.heartbeat_interval)

    async def _report_usage(self, name: str) -> None:
        """An early Lease renewal: the usage of the node's pods changed."""
        with acting_as(node_user(name)):
            await self._renew_lease(name)

    async def _repost_status_if_stale(self, name: str) -> None:
        """A kubelet posts its status again when the node's differs from what it
        would report: here, when the node lifecycle controller (or anyone) set
        Ready to anything but True while this node runs."""
        node = self._nodes.indexer.get_by_key(name)
        if node is None:
            return
        ready = next((c for c in (node.get("status") or {}).get("conditions") or []
                      if isinstance(c, dict) and c.get("type") == "Ready"), None)
        if ready is None or ready.get("status") != "True":
            await self._refresh_status(name, node_object(name, self._index[name], self.spec))

    async def _renew_lease(self, name: str) -> None:
        from kubeplane.api.usage import USAGE_ANNOTATION

        now = micro_time()
        usage = {USAGE_ANNOTATION: self.usage.annotation(name)}
        try:
            await self.client.patch(LEASES, name, {"metadata": {"annotations": usage}, "spec": {"renewTime": now}},
                                    LEASE_NAMESPACE)
        except StatusError as err:
            if err.code != 404:
                raise
            await self.client.create(LEASES, lease_object(name, now, annotations=usage), LEASE_NAMESPACE)

    # -- pods ------------------------------------------------------------------

    def _pod_ip(self, node: str) -> str:
        n = self._ip_counter.get(node, 1) + 1
        if n > 254:
            n = 2
        self._ip_counter[node] = n
        return f"10.244.{self._index[node] % 256}.{n}"

    async def _sync_pod(self, key: str) -> None:
        pod = self._pods.indexer.get_by_key(key)
        if pod is None:
            self._started.pop(key, None)
            return
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if node not in self._index:
            return
        with acting_as(node_user(node)):  # the timers it starts inherit the identity
            await self._sync_pod_on(pod, spec, node)

    async def _sync_pod_on(self, pod: Obj, spec: Obj, node: str) -> None:
        md = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if md.get("deletionTimestamp"):
            self._later(self.termination_delay, self._finish_deletion(pod))
            return
        phase = status.get("phase")
        if phase == "Pending" and not status.get("startTime"):
            if self.start_delay:
                self._later(self.start_delay, self._start_pod(pod, node))
            else:
                await self._start_pod(pod, node)
            return
        if phase == "Running":
            await self._maybe_exit(pod)

    async def _maybe_exit(self, pod: Obj) -> None:
        """Containers of a pod with ``exit-after`` exit once that long has
        passed since they started; until then a timer looks again."""
        md = pod.get("metadata") or {}
        annotations = md.get("annotations") or {}
        exit_after = annotations.get(EXIT_AFTER_ANNOTATION)
        if exit_after is None:
            return
        try:
            seconds = float(exit_after)
            if not math.isfinite(seconds):
                raise ValueError(exit_after)
            seconds = max(0.0, seconds)
        except ValueError:
            self._bad_annotation(pod, f"{EXIT_AFTER_ANNOTATION} {exit_after!r} is not a number of seconds: "
                                      "the containers keep running")
            return
        raw_code = annotations.get(EXIT_CODE_ANNOTATION, "0")
        try:
            code = int(raw_code)
        except ValueError:
            self._bad_annotation(pod, f"{EXIT_CODE_ANNOTATION} {raw_code!r} is not an integer: "
                                      "the containers exit with 1")
            code = 1
        status = pod.get("status") or {}
        now = self.clock()
        key = f"{md.get('namespace')}/{md.get('name')}"
        waiting = _backing_off(status)
        if waiting is not None:
            wait = restart_backoff(int(waiting.get("restartCount") or 0))
            finished = ((waiting.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
            left = wait - ((now - parse_time(finished)).total_seconds() if finished else wait)
            if left > 0:
                self._later(left, _enqueue_key(self._queue, key))
            else:
                await self._restart_containers(pod, now)
            return
        exact = self._started.get(key)
        if exact is not None and exact[0] == md.get("uid"):
            elapsed = (now - exact[1]).total_seconds()
        else:
            started = _container_started(status) or status.get("startTime")
            elapsed = (now - parse_time(started)).total_seconds() if started else 0.0
        if elapsed < seconds:
            self._later(seconds - elapsed, _enqueue_key(self._queue, key))
            return
        await self._exit_containers(pod, code, now)

    def _later(self, delay: float, coro) -> None:
        async def run() -> None:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                coro.close()  # stopped before its time: never started
                raise
            await coro

        task = asyncio.get_running_loop().create_task(run())
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    async def _start_pod(self, pod: Obj, node: str) -> None:
        md = pod["metadata"]
        spec = pod.get("spec") or {}
        started = self.clock()
        now = format_time(started)
        host_ip = str(ipaddress.ip_address("10.0.0.0") + 1 + self._index[node])
        pod_ip = host_ip if spec.get("hostNetwork") else self._pod_ip(node)

        def running(c: Obj) -> Obj:
            return {"name": c.get("name"), "image": c.get("image"), "imageID": f"sim://{c.get('image')}",
                    "containerID": f"kubeplane://{md.get('uid', '')[:8]}-{c.get('name')}", "ready": True,
                    "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}

        inits = []
        for c in spec.get("initContainers") or []:
            if c.get("restartPolicy") == "Always":  # sidecar
                inits.append(running(c))
            else:
                inits.append({"name": c.get("name"), "image": c.get("image"), "imageID": f"sim://{c.get('image')}",
                              "ready": True, "started": False, "restartCount": 0,
                              "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                       "startedAt": now, "finishedAt": now}}})
        cond = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
        ]
        status: Obj = {
            "phase": "Running", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}], "startTime": now, "conditions": cond,
            "containerStatuses": [running(c) for c in spec.get("containers") or []],
        }
        if inits:
            status["initContainerStatuses"] = inits
        self._started[f"{md.get('namespace')}/{md['name']}"] = (md.get("uid", ""), started)
        try:
            await self.client.patch(PODS, md["name"], {"status": status}, md.get("namespace"),
                                    patch_type="strategic", subresource="status", field_manager="kubelet")
        except StatusError as err:
            if err.code != 404:
                raise

    def _bad_annotation(self, pod: Obj, message: str) -> None:
        """Tell the pod's owner once (a Warning event on the pod) that an annotation is unusable."""
        md = pod.get("metadata") or {}
        mark = (md.get("uid", ""), message)
        if mark in self._warned:
            return
        self._warned.add(mark)
        log.warning("pod %s/%s: %s", md.get("namespace"), md.get("name"), message)
        self.recorder.event(pod, "Warning", "InvalidAnnotation", message)

    async def _exit_containers(self, pod: Obj, code: int, now: _dt.datetime) -> None:
        """The containers exit with ``code``; the restart policy decides
        whether they run again or the pod ends (Succeeded or Failed)."""
        spec = pod.get("spec") or {}
        policy = spec.get("restartPolicy") or "Always"
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        stamp = format_time(now)
        previous = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
        statuses = []
        for c in spec.get("containers") or []:
            prev = previous.get(c.get("name")) or {}
            terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                          "startedAt": ((prev.get("state") or {}).get("running") or {}).get("startedAt", stamp),
                          "finishedAt": stamp}
            status = {"name": c.get("name"), "image": c.get("image"), "imageID": f"sim://{c.get('image')}",
                      "containerID": prev.get("containerID", ""), "restartCount": int(prev.get("restartCount") or 0)}
            status.update(ready=False, started=False)
            if restart:
                wait = restart_backoff(status["restartCount"])
                status.update(lastState={"terminated": terminated}, state={"waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {wait}s restarting failed container={c.get('name')} "
                               f"pod={md_name(pod)}_{md_namespace(pod)}({md_uid(pod)})"}})
            else:
                status["state"] = {"terminated": terminated}
            statuses.append(status)
        if not restart:
            await self._finish(pod, "Succeeded" if code == 0 else "Failed", statuses, stamp)
            return
        await self._patch_status(pod, {"conditions": _readiness(False, "ContainersNotReady", stamp),
                                       "containerStatuses": statuses})

    async def _restart_containers(self, pod: Obj, now: _dt.datetime) -> None:
        """Back-off over: the containers run again, one restart more."""
        stamp = format_time(now)
        md = pod.get("metadata") or {}
        self._started[f"{md.get('namespace')}/{md.get('name')}"] = (md.get("uid", ""), now)
        statuses = []
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            if "waiting" in (c.get("state") or {}):
                c = {**c, "ready": True, "started": True, "restartCount": int(c.get("restartCount") or 0) + 1,
                     "state": {"running": {"startedAt": stamp}}}
            statuses.append(c)
        await self._patch_status(pod, {"conditions": _readiness(True, None, stamp), "containerStatuses": statuses})

    async def _finish(self, pod: Obj, phase: str, statuses: list[Obj], stamp: str) -> None:
        """The pod ends in ``phase``: not ready any more, containers terminated."""
        md = pod.get("metadata") or {}
        self._started.pop(f"{md.get('namespace')}/{md.get('name')}", None)
        reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        await self._patch_status(pod, {"phase": phase, "conditions": _readiness(False, reason, stamp),
                                       "containerStatuses": statuses})

    async def _patch_status(self, pod: Obj, status: Obj) -> None:
        md = pod["metadata"]
        try:
            await self.client.patch(PODS, md["name"], {"status": status}, md.get("namespace"),
                                    patch_type="strategic", subresource="status", field_manager="kubelet")
        except StatusError as err:
            if err.code != 404:
                raise

    async def _stop_containers(self, pod: Obj) -> None:
        """A deleted pod's running containers are stopped (SIGTERM): the pod
        is reported Failed unless it had already ended."""
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        stamp = format_time(self.clock())
        statuses = []
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            state = c.get("state") or {}
            if "terminated" in state:
                statuses.append(c)
                continue
            started = (state.get("running") or {}).get("startedAt", stamp)
            statuses.append({**c, "ready": False, "started": False, "state": {"terminated": {
                "exitCode": TERMINATED_EXIT_CODE, "reason": "Error", "startedAt": started, "finishedAt": stamp}}})
        await self._finish(pod, "Failed", statuses, stamp)

    async def _finish_deletion(self, pod: Obj) -> None:
        md = pod["metadata"]
        if (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("startTime"):
            await self._stop_containers(pod)
        try:
            await self.client.delete(PODS, md["name"], md.get("namespace"), grace_period_seconds=0,
                                     preconditions={"uid": md.get("uid", "")})
        except StatusError as err:
            if err.code not in (404, 409):
                raise


def _container_started(status: Obj) -> str | None:
    """When the (latest) containers started: the newest ``running.startedAt``."""
    times = [((c.get("state") or {}).get("running") or {}).get("startedAt")
             for c in status.get("containerStatuses") or []]
    times = [t for t in times if t]
    return max(times) if times else None


async def _enqueue_key(queue: Any, key: str) -> None:
    queue.add(key)


def _backing_off(status: Obj) -> Obj | None:
    """A container status waiting in CrashLoopBackOff, if any."""
    for c in status.get("containerStatuses") or []:
        if ((c.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
            return c
    return None


def restart_backoff(restarts: int) -> int:
    """The kubelet's crash-loop back-off: 10 s, doubling per restart, at most 5 minutes."""
    return min(10 * 2 ** min(restarts, 5), 300)


def _readiness(ready: bool, reason: str | None, stamp: str) -> list[Obj]:
    """The pod's Ready and ContainersReady conditions."""
    out = []
    for t in ("Ready", "ContainersReady"):
        cond: Obj = {"type": t, "status": "True" if ready else "False", "lastProbeTime": None,
                     "lastTransitionTime": stamp}
        if reason:
            cond["reason"] = reason
        out.append(cond)
    return out


def md_name(pod: Obj) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def md_namespace(pod: Obj) -> str:
    return (pod.get("metadata") or {}).get("namespace", "")


def md_uid(pod: Obj) -> str:
    return (pod.get("metadata") or {}).get("uid", "")
