"""scheduler_perf workload shapes: object templates and op sequences.

Names, templates and op order follow upstream's
test/integration/scheduler_perf performance configuration: nodes first,
then (optionally) namespaces and helper objects, then the initial pods, then
the measured pods (the only phase whose throughput and latency is reported).
Defaults are upstream's "5000Nodes" variants where that is practical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

Obj = dict[str, Any]

ZONE_KEY = "topology.kubernetes.io/zone"
HOSTNAME_KEY = "kubernetes.io/hostname"
DRA_DRIVER = "test-driver.cdi.k8s.io"
DRA_CLASS = "test-class"
DRA_TEMPLATE = "test-claim-template"
DEVICES_PER_NODE = 10
STATIC_CLASS = "bench-static-wffc"
DYNAMIC_CLASS = "bench-csi-wffc"
LOCAL_PROVISIONER = "kubeplane.io/local"
NO_PROVISIONER = "kubernetes.io/no-provisioner"


# -- templates ------------------------------------------------------------


def node_default(name: str, labels: dict[str, str] | None = None) -> Obj:
    """node-default.yaml: 4 CPU, 32Gi memory, 110 pods, Ready."""
    capacity = {"pods": "110", "cpu": "4", "memory": "32Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {HOSTNAME_KEY: name, **(labels or {})}},
        "spec": {},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity),
                   "conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"},
    }


def _container(cpu: str = "100m", memory: str = "500Mi", claims: list[str] | None = None) -> Obj:
    res: Obj = {"limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": cpu, "memory": memory}}
    if claims:
        res["claims"] = [{"name": c} for c in claims]
    return {"name": "pause", "image": "registry.k8s.io/pause:3.10", "ports": [{"containerPort": 80}],
            "resources": res}


def _pod(name: str, spec: Obj | None = None, labels: dict[str, str] | None = None, **container: Any) -> Obj:
    md: Obj = {"name": name}
    if labels:
        md["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"containers": [_container(**container)], **(spec or {})}}


def pod_default(name: str) -> Obj:
    """pod-default.yaml: one pause container, 100m CPU / 500Mi."""
    return _pod(name)


def pod_with_pod_anti_affinity(name: str) -> Obj:
    """pod-with-pod-anti-affinity.yaml: at most one color=green pod per host."""
    return _pod(name, labels={"color": "green"}, spec={"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"color": "green"}},
            "topologyKey": HOSTNAME_KEY,
            "namespaces": ["sched-0", "sched-1"]}]}}})


def pod_with_pod_affinity(name: str) -> Obj:
    """pod-with-pod-affinity.yaml: co-located by zone with color=blue pods."""
    return _pod(name, labels={"color": "blue"}, spec={"affinity": {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"color": "blue"}},
            "topologyKey": ZONE_KEY,
            "namespaces": ["sched-0", "sched-1"]}]}}})


def pod_with_node_affinity(name: str) -> Obj:
    """pod-with-node-affinity.yaml: zone In [zone1, zone2]."""
    return _pod(name, spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": ZONE_KEY, "operator": "In", "values": ["zone1", "zone2"]}]}]}}}})


def pod_with_topology_spreading(name: str) -> Obj:
    """pod-with-topology-spreading.yaml: maxSkew 5 over zones, DoNotSchedule."""
    return _pod(name, labels={"color": "blue"}, spec={"topologySpreadConstraints": [{
        "maxSkew": 5, "topologyKey": ZONE_KEY, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"color": "blue"}}}]})


def pod_low_priority(name: str) -> Obj:
    """pod-low-priority.yaml: 900m CPU, no termination grace."""
    return _pod(name, spec={"terminationGracePeriodSeconds": 0}, cpu="900m")


def pod_high_priority(name: str) -> Obj:
    """pod-high-priority.yaml: priority 10, 3000m CPU."""
    return _pod(name, spec={"priority": 10}, cpu="3000m")


def pod_high_priority_large_cpu(name: str) -> Obj:
    """pod-high-priority-large-cpu.yaml: priority 10, 9 CPU (fits no 4-CPU node, even by preemption)."""
    return _pod(name, spec={"priority": 10}, cpu="9")


def pod_with_claim(name: str, claim: str) -> Obj:
    """A pod-default pod mounting one PersistentVolumeClaim."""
    return _pod(name, spec={"volumes": [{"name": "vol", "persistentVolumeClaim": {"claimName": claim}}]})


def pod_with_claim_template(name: str) -> Obj:
    """dra/pod-with-claim-template.yaml: one claim generated from the template."""
    return _pod(name, spec={"resourceClaims": [{"name": "resource", "resourceClaimTemplateName": DRA_TEMPLATE}]},
                claims=["resource"])


def pvc_wffc(name: str, storage_class: str, selector_label: str | None = None) -> Obj:
    """pvc.yaml shape with a WaitForFirstConsumer class (1Gi)."""
    spec: Obj = {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}
    if selector_label is not None:
        spec["selector"] = {"matchLabels": {"bench/claim": selector_label}}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def pv_static(name: str, storage_class: str, label: str | None = None) -> Obj:
    """A pre-created 1Gi volume of ``storage_class`` usable from any node."""
    md: Obj = {"name": name}
    if label is not None:
        md["labels"] = {"bench/claim": label}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": md,
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": f"/bench/{name}"}}}


def storage_class(name: str, provisioner: str) -> Obj:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}


def device_class() -> Obj:
    """dra/deviceclass.yaml: every device of the test driver."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRA_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]}}


def claim_template() -> Obj:
    """dra/resourceclaimtemplate.yaml: exactly one device of the test class."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": DRA_TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "req-0", "exactly": {"deviceClassName": DRA_CLASS}}]}}}}


def resource_slice(node_name: str, devices: int = DEVICES_PER_NODE) -> Obj:
    """One slice per node publishing ``devices`` devices of the test driver."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-{DRA_DRIVER}"},
            "spec": {"driver": DRA_DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"device-{i}", "attributes": {"index": {"int": i}}}
                                 for i in range(devices)]}}


# -- ops ------------------------------------------------------------------

PodTemplate = Callable[[str], Obj]
VolumeMode = Literal["none", "static", "dynamic"]


@dataclass
class CreateNodes:
    """``createNodes``: count nodes; labelNodePrepareStrategy as (key, values) round-robin."""

    label_key: str | None = None
    label_values: tuple[str, ...] = ()
    resource_slices: bool = False


@dataclass
class CreateNamespaces:
    """``createNamespaces``: prefix-0 .. prefix-(count-1)."""

    prefix: str
    count: int


@dataclass
class CreateAny:
    """``createAny``: one cluster-scoped or namespaced object per namespace listed."""

    make: Callable[[], Obj]
    namespaces: tuple[str, ...] = ()


@dataclass
class CreatePods:
    """``createPods``: ``init`` or ``measure`` pods of one template.

    ``volumes`` adds a WaitForFirstConsumer claim per pod ("static": a matching
    PV is created with it; "dynamic": the local provisioner creates it).
    ``skip_wait`` is upstream's skipWaitToCompletion.
    """

    phase: Literal["init", "measure"]
    template: PodTemplate
    namespace: str = "default"
    volumes: VolumeMode = "none"
    skip_wait: bool = False


@dataclass
class ChurnPVs:
    """Measured pods with one selector-pinned claim each wait unschedulable;
    then, once past their initial 1 s backoff (``settle_s``), their PVs
    appear one by one (``interval_s`` apart).

    The measure is the time from a PV's creation to its pod's binding, which
    shows whether the PV's event alone brings the pod back. The default
    (100 PVs/s; upstream's churn op defaults to one object per 500 ms) stays
    below the rate at which the volume pipeline binds pods; a faster rate
    (``--pv-interval-ms``) queues PVs and then measures that rate instead."""

    interval_s: float = 0.010
    settle_s: float = 1.5


@dataclass
class SteadyState:
    """Measured phase keeping ``in_flight`` pods pending: every bound pod is
    deleted and replaced until ``pods`` pods have been scheduled."""

    template: PodTemplate
    in_flight: int = 10
    namespace: str = "default"


@dataclass
class Churn:
    """``churn`` in create mode: one unmeasured pod of ``template`` every
    ``interval_ms`` from this point until the measured pods are all scheduled."""

    template: PodTemplate
    interval_ms: int = 200
    namespace: str = "default"


Op = CreateNodes | CreateNamespaces | CreateAny | CreatePods | ChurnPVs | SteadyState | Churn


@dataclass
class Workload:
    """A named workload: default sizes and the op sequence."""

    name: str
    nodes: int
    init_pods: int
    measure_pods: int
    ops: list[Op]
    #: measured pods are expected to be scheduled (False: they must stay pending)
    schedulable: bool = True
    #: controllers needed: "pv" (binder), "provisioner", "resourceclaim"
    controllers: tuple[str, ...] = ()
    #: plugin that must be registered for the workload to make sense
    requires_plugin: str | None = None
    #: init pods as a function of nodes (default: scaled from the defaults)
    init_for: Callable[[int], int] | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def init_count(self, nodes: int) -> int:
        if self.init_for is not None:
            return self.init_for(nodes)
        if self.nodes == 0:
            return self.init_pods
        return round(self.init_pods * nodes / self.nodes)

    def measure_count(self, nodes: int) -> int:
        """Measured pods for ``nodes`` nodes: the default, scaled when the node count differs."""
        if nodes == self.nodes or self.nodes == 0:
            return self.measure_pods
        return max(1, round(self.measure_pods * nodes / self.nodes))


def _steady_fill(fraction: float, in_flight: int = 10) -> Callable[[int], int]:
    def fill(nodes: int) -> int:
        devices = nodes * DEVICES_PER_NODE
        if fraction >= 1.0:
            return max(0, devices - in_flight)
        return int(devices * fraction)
    return fill


def _steady(fill: str, fraction: float) -> Workload:
    return Workload(
        f"SteadyStateClusterResourceClaimTemplate/{fill}", 500, 0, 2000,
        [CreateNodes(resource_slices=True), CreateAny(device_class),
         CreateAny(claim_template, ("default",)),
         CreatePods("init", pod_with_claim_template),
         SteadyState(pod_with_claim_template)],
        controllers=("resourceclaim",), requires_plugin="DynamicResources", init_for=_steady_fill(fraction),
        description=f"DRA steady state, cluster {fill}: 10 pods pending at a time, each deleted once bound")


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("SchedulingBasic", 5000, 1000, 10000,
             [CreateNodes(), CreatePods("init", pod_default), CreatePods("measure", pod_default)],
             description="pod-default pods on node-default nodes"),
    Workload("SchedulingPodAntiAffinity", 5000, 1000, 1000,
             [CreateNodes(), CreateNamespaces("sched", 2),
              CreatePods("init", pod_with_pod_anti_affinity, "sched-0"),
              CreatePods("measure", pod_with_pod_anti_affinity, "sched-1")],
             description="required anti-affinity per hostname across two namespaces"),
    Workload("SchedulingPodAffinity", 5000, 5000, 1000,
             [CreateNodes(ZONE_KEY, ("zone1",)), CreateNamespaces("sched", 2),
              CreatePods("init", pod_with_pod_affinity, "sched-0"),
              CreatePods("measure", pod_with_pod_affinity, "sched-1")],
             description="required zone affinity, all nodes in zone1"),
    Workload("SchedulingNodeAffinity", 5000, 5000, 1000,
             [CreateNodes(ZONE_KEY, ("zone1",)), CreatePods("init", pod_with_node_affinity),
              CreatePods("measure", pod_with_node_affinity)],
             description="required node affinity zone In [zone1, zone2]"),
    Workload("TopologySpreading", 5000, 5000, 2000,
             [CreateNodes(ZONE_KEY, ("moon-1", "moon-2", "moon-3")), CreatePods("init", pod_default),
              CreatePods("measure", pod_with_topology_spreading)],
             description="hard spread over three zones, maxSkew 5"),
    Workload("PreemptionBasic", 500, 2000, 500,
             [CreateNodes(), CreatePods("init", pod_low_priority), CreatePods("measure", pod_high_priority)],
             init_for=lambda n: 4 * n,
             description="low-priority 900m pods fill the nodes; 3000m priority-10 pods preempt"),
    Workload("PreemptionAsync", 5000, 20000, 5000,
             [CreateNodes(), CreatePods("init", pod_low_priority), Churn(pod_high_priority),
              CreatePods("measure", pod_default)],
             init_for=lambda n: 4 * n,
             description="pod-default pods measured while a 3000m priority-10 pod arrives every 200 ms "
                         "and preempts low-priority 900m pods"),
    Workload("Unschedulable", 5000, 100, 10000,
             [CreateNodes(), CreatePods("init", pod_default), Churn(pod_high_priority_large_cpu),
              CreatePods("measure", pod_default)],
             description="pod-default pods measured while a 9-CPU priority-10 pod that fits nowhere "
                         "(not even by preemption) arrives every 200 ms"),
    Workload("SchedulingInTreePVs", 5000, 2000, 1000,
             [CreateNodes(), CreateAny(lambda: storage_class(STATIC_CLASS, NO_PROVISIONER)),
              CreatePods("init", pod_default, volumes="static"),
              CreatePods("measure", pod_default, volumes="static")],
             controllers=("pv",), requires_plugin="VolumeBinding",
             description="a WaitForFirstConsumer claim per pod, matching PVs created beforehand"),
    Workload("SchedulingCSIPVs", 5000, 1000, 5000,
             [CreateNodes(), CreateAny(lambda: storage_class(DYNAMIC_CLASS, LOCAL_PROVISIONER)),
              CreatePods("init", pod_default, volumes="dynamic"),
              CreatePods("measure", pod_default, volumes="dynamic")],
             controllers=("pv", "provisioner"), requires_plugin="VolumeBinding",
             description="a WaitForFirstConsumer claim per pod, provisioned on the selected node"),
    Workload("SchedulingPVsChurn", 500, 0, 500,
             [CreateNodes(), CreateAny(lambda: storage_class(STATIC_CLASS, NO_PROVISIONER)), ChurnPVs()],
             controllers=("pv",), requires_plugin="VolumeBinding", init_for=lambda n: 0,
             description="pods wait for their claim's PV; PVs are created one by one while they wait"),
    Workload("SchedulingWithResourceClaimTemplate", 500, 2500, 2500,
             [CreateNodes(resource_slices=True), CreateAny(device_class),
              CreateNamespaces("init", 1), CreateNamespaces("test", 1),
              CreateAny(claim_template, ("init-0", "test-0")),
              CreatePods("init", pod_with_claim_template, "init-0"),
              CreatePods("measure", pod_with_claim_template, "test-0")],
             controllers=("resourceclaim",), requires_plugin="DynamicResources",
             init_for=lambda n: n * DEVICES_PER_NODE // 2,
             description="a claim from a template per pod, 10 devices per node"),
    _steady("empty", 0.0),
    _steady("half", 0.5),
    _steady("full", 1.0),
]}

#: the bare name runs the empty-cluster variant, as upstream's first entry
ALIASES: dict[str, str] = {
    "SteadyStateClusterResourceClaimTemplate": "SteadyStateClusterResourceClaimTemplate/empty",
}


def get_workload(name: str) -> Workload:
    """The workload called ``name`` (or an alias); KeyError lists the known names."""
    w = WORKLOADS.get(ALIASES.get(name, name))
    if w is None:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    return w
