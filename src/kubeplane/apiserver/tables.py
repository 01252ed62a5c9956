"""Server-side printing: ``meta.k8s.io/v1`` Table responses for ``kubectl get``.

kubectl asks for ``application/json;as=Table;v=v1;g=meta.k8s.io`` and prints
whatever columns the server sends. The columns and cell values here follow
the upstream API server's printers, which run with wide output enabled:
every row carries all cells and the ``priority: 1`` columns are the ones
kubectl shows only with ``-o wide``.

Each printer is a function ``(obj, now) -> cells`` over plain dict objects
in their v1 JSON form. Missing optional fields get the values the upstream
defaulting would have produced (for example one replica, TCP ports).
"""

from __future__ import annotations

import copy
import datetime as _dt
import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable

from kubeplane.api.errors import bad_request
from kubeplane.api.meta import meta_of, parse_time
from kubeplane.api.resources import ResourceInfo

Obj = dict[str, Any]
Cell = str | int | bool
RowFn = Callable[[Obj, _dt.datetime], list[Cell]]

TABLE_API_VERSION = "meta.k8s.io/v1"
INCLUDE_OBJECT_VALUES = ("None", "Metadata", "Object")

_NAME_DOC = "Name must be unique within a namespace."
_AGE_DOC = "CreationTimestamp is a timestamp representing the server time when this object was created."
_CONTAINERS_DOC = "Names of each container in the template."
_IMAGES_DOC = "Images referenced by each container in the template."
_NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
_NODE_ROLE_LABEL = "kubernetes.io/role"
_BETA_STORAGE_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
_DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


# --------------------------------------------------------------------------- durations


def human_duration(d: _dt.timedelta) -> str:
    """Upstream ``duration.HumanDuration``: about two significant figures.

    Up to two seconds in the future counts as "now" (clock skew); further
    in the future is ``<invalid>``.
    """
    micros = d // _dt.timedelta(microseconds=1)
    seconds = math.trunc(micros / 1_000_000)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def _parse(ts: Any) -> _dt.datetime | None:
    if not ts or not isinstance(ts, str):
        return None
    try:
        return parse_time(ts)
    except ValueError:
        return None


def since(ts: Any, now: _dt.datetime) -> str:
    """Age of an RFC 3339 timestamp; ``<unknown>`` when it is missing."""
    t = _parse(ts)
    if t is None:
        return "<unknown>"
    return human_duration(now - t)


# --------------------------------------------------------------------------- formatting helpers


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    cur = obj
    for p in path:
        if not isinstance(cur, dict):
            return default
        cur = cur.get(p)
        if cur is None:
            return default
    return cur


def _name(obj: Obj) -> str:
    return meta_of(obj).get("name", "")


def _age(obj: Obj, now: _dt.datetime) -> str:
    return since(meta_of(obj).get("creationTimestamp"), now)


def format_labels(labels: dict[str, str] | None) -> str:
    """``labels.FormatLabels``: sorted ``k=v`` pairs, ``<none>`` when empty."""
    if not labels:
        return "<none>"
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def selector_string(selector: Obj | None) -> str:
    """A LabelSelector rendered as upstream's ``labels.Selector.String()``.

    Requirements are sorted by key; set values are sorted and deduplicated.
    """
    if not selector:
        return ""
    reqs: list[tuple[str, str]] = []
    for k, v in (selector.get("matchLabels") or {}).items():
        reqs.append((k, f"{k}={v}"))
    for expr in selector.get("matchExpressions") or []:
        key = expr.get("key", "")
        op = expr.get("operator", "")
        values = ",".join(sorted(set(expr.get("values") or [])))
        if op == "In":
            reqs.append((key, f"{key} in ({values})"))
        elif op == "NotIn":
            reqs.append((key, f"{key} notin ({values})"))
        elif op == "Exists":
            reqs.append((key, key))
        elif op == "DoesNotExist":
            reqs.append((key, f"!{key}"))
        else:
            return "<error>"
    reqs.sort(key=lambda r: r[0])
    return ",".join(r[1] for r in reqs)


def format_label_selector(selector: Obj | None) -> str:
    """``metav1.FormatLabelSelector``: like :func:`selector_string`, ``<none>`` when empty."""
    return selector_string(selector) or "<none>"


def access_modes(modes: list[str] | None) -> str:
    """Abbreviated access modes, always in the order RWO, ROX, RWX, RWOP."""
    present = set(modes or [])
    order = (
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    )
    return ",".join(short for full, short in order if full in present)


def _containers_cells(pod_spec: Obj | None) -> tuple[str, str]:
    containers = (pod_spec or {}).get("containers") or []
    return (
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
    )


def _template_spec(obj: Obj) -> Obj:
    return _get(obj, "spec", "template", "spec", default={})


def _condition_status(conditions: list[Obj] | None, ctype: str) -> bool:
    """True when the first condition of ``ctype`` has status True."""
    for c in conditions or []:
        if c.get("type") == ctype:
            return c.get("status") == "True"
    return False


# --------------------------------------------------------------------------- columns


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str = "string"
    description: str = ""
    priority: int = 0
    format: str = ""

    def definition(self) -> Obj:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


def _name_col(priority: int = 0) -> Column:
    return Column("Name", format="name", description=_NAME_DOC, priority=priority)


def _age_col() -> Column:
    return Column("Age", description=_AGE_DOC)


@dataclass(frozen=True, slots=True)
class Printer:
    columns: tuple[Column, ...]
    row: RowFn
    conditions: Callable[[Obj], list[Obj]] | None = None


# --------------------------------------------------------------------------- pods


def _pod_status_reason(pod: Obj) -> tuple[str, int, int, _dt.datetime | None]:
    """Returns (status, ready containers, restarts, last restart time)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or ""
    reason = status.get("reason") or phase

    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    init_specs = {c.get("name"): c for c in spec.get("initContainers") or []}

    def restartable(name: str | None) -> bool:
        return (init_specs.get(name) or {}).get("restartPolicy") == "Always"

    ready = 0
    restarts = 0
    sidecar_restarts = 0
    last_restart: _dt.datetime | None = None
    last_sidecar_restart: _dt.datetime | None = None

    def later(a: _dt.datetime | None, cs: Obj) -> _dt.datetime | None:
        finished = _parse(_get(cs, "lastState", "terminated", "finishedAt"))
        if finished is not None and (a is None or finished > a):
            return finished
        return a

    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    for i, cs in enumerate(init_statuses):
        restarts += int(cs.get("restartCount") or 0)
        last_restart = later(last_restart, cs)
        if restartable(cs.get("name")):
            sidecar_restarts += int(cs.get("restartCount") or 0)
            last_sidecar_restart = later(last_sidecar_restart, cs)
        state = cs.get("state") or {}
        terminated = state.get("terminated")
        waiting = state.get("waiting")
        if terminated is not None and int(terminated.get("exitCode") or 0) == 0:
            continue
        if restartable(cs.get("name")) and cs.get("started") is True:
            if cs.get("ready"):
                ready += 1
            continue
        if terminated is not None:
            if not terminated.get("reason"):
                if terminated.get("signal"):
                    reason = f"Init:Signal:{terminated['signal']}"
                else:
                    reason = f"Init:ExitCode:{terminated.get('exitCode', 0)}"
            else:
                reason = "Init:" + terminated["reason"]
        elif waiting is not None and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = "Init:" + waiting["reason"]
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break

    if not initializing or _condition_status(status.get("conditions"), "Initialized"):
        restarts = sidecar_restarts
        last_restart = last_sidecar_restart
        has_running = False
        for cs in reversed(status.get("containerStatuses") or []):
            restarts += int(cs.get("restartCount") or 0)
            last_restart = later(last_restart, cs)
            state = cs.get("state") or {}
            waiting = state.get("waiting")
            terminated = state.get("terminated")
            if waiting is not None and waiting.get("reason"):
                reason = waiting["reason"]
            elif terminated is not None and terminated.get("reason"):
                reason = terminated["reason"]
            elif terminated is not None:
                if terminated.get("signal"):
                    reason = f"Signal:{terminated['signal']}"
                else:
                    reason = f"ExitCode:{terminated.get('exitCode', 0)}"
            elif cs.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running" if _condition_status(status.get("conditions"), "Ready") else "NotReady"

    deleting = bool(meta_of(pod).get("deletionTimestamp"))
    if deleting and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif deleting and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    return reason, ready, restarts, last_restart


def _pod_row(pod: Obj, now: _dt.datetime) -> list[Cell]:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    reason, ready, restarts, last_restart = _pod_status_reason(pod)
    total = len(spec.get("containers") or []) + sum(
        1 for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"
    )
    restarts_cell = str(restarts)
    if restarts != 0 and last_restart is not None:
        restarts_cell = f"{restarts} ({human_duration(now - last_restart)} ago)"

    pod_ips = status.get("podIPs") or []
    pod_ip = (pod_ips[0].get("ip") if pod_ips else None) or status.get("podIP") or "<none>"
    gates = spec.get("readinessGates") or []
    gates_cell = "<none>"
    if gates:
        true_count = 0
        for gate in gates:
            for cond in status.get("conditions") or []:
                if cond.get("type") == gate.get("conditionType"):
                    if cond.get("status") == "True":
                        true_count += 1
                    break
        gates_cell = f"{true_count}/{len(gates)}"
    return [
        _name(pod),
        f"{ready}/{total}",
        reason,
        restarts_cell,
        _age(pod, now),
        pod_ip,
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gates_cell,
    ]


def _pod_conditions(pod: Obj) -> list[Obj]:
    phase = _get(pod, "status", "phase")
    if phase == "Succeeded":
        return [{"type": "Completed", "status": "True", "reason": "Succeeded",
                 "message": "The pod has completed successfully."}]
    if phase == "Failed":
        return [{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]
    return []


_POD = Printer(
    (
        _name_col(),
        Column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
        Column("Status", description="The aggregate status of the containers in this pod."),
        Column("Restarts", description="The number of times the containers in this pod have been restarted "
                                       "and when the last container in this pod has restarted."),
        _age_col(),
        Column("IP", priority=1, description="IP address allocated to the pod."),
        Column("Node", priority=1, description="The node this pod is bound to."),
        Column("Nominated Node", priority=1, description="The node the scheduler nominated for preemption."),
        Column("Readiness Gates", priority=1, description="Pod readiness gates that are true, of all gates."),
    ),
    _pod_row,
    _pod_conditions,
)


# --------------------------------------------------------------------------- nodes


def _node_row(node: Obj, now: _dt.datetime) -> list[Cell]:
    status = node.get("status") or {}
    parts: list[str] = []
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            parts = ["Ready" if cond.get("status") == "True" else "NotReady"]
    if not parts:
        parts = ["Unknown"]
    if _get(node, "spec", "unschedulable"):
        parts.append("SchedulingDisabled")

    roles: set[str] = set()
    for k, v in (meta_of(node).get("labels") or {}).items():
        if k.startswith(_NODE_ROLE_PREFIX):
            role = k[len(_NODE_ROLE_PREFIX):]
            if role:
                roles.add(role)
        elif k == _NODE_ROLE_LABEL and v:
            roles.add(v)

    def address(kind: str) -> str:
        for a in status.get("addresses") or []:
            if a.get("type") == kind:
                return a.get("address", "")
        return "<none>"

    info = status.get("nodeInfo") or {}
    return [
        _name(node),
        ",".join(parts),
        ",".join(sorted(roles)) or "<none>",
        _age(node, now),
        info.get("kubeletVersion", ""),
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


_NODE = Printer(
    (
        _name_col(),
        Column("Status", description="The status of the node"),
        Column("Roles", description="The roles of the node"),
        _age_col(),
        Column("Version", description="Kubelet Version reported by the node."),
        Column("Internal-IP", priority=1, description="List of addresses reachable to the node."),
        Column("External-IP", priority=1, description="List of addresses reachable to the node."),
        Column("OS-Image", priority=1, description="OS Image reported by the node."),
        Column("Kernel-Version", priority=1, description="Kernel Version reported by the node."),
        Column("Container-Runtime", priority=1, description="ContainerRuntime Version reported by the node."),
    ),
    _node_row,
)


# --------------------------------------------------------------------------- storage


def _pv_row(pv: Obj, now: _dt.datetime) -> list[Cell]:
    spec = pv.get("spec") or {}
    status = pv.get("status") or {}
    claim_ref = spec.get("claimRef")
    claim = f"{claim_ref.get('namespace', '')}/{claim_ref.get('name', '')}" if claim_ref else ""
    phase = "Terminating" if meta_of(pv).get("deletionTimestamp") else status.get("phase", "")
    annotations = meta_of(pv).get("annotations") or {}
    storage_class = annotations.get(_BETA_STORAGE_CLASS_ANNOTATION, spec.get("storageClassName") or "")
    return [
        _name(pv),
        str(_get(spec, "capacity", "storage", default="0")),
        access_modes(spec.get("accessModes")),
        spec.get("persistentVolumeReclaimPolicy", ""),
        phase,
        claim,
        storage_class,
        spec.get("volumeAttributesClassName") or "<unset>",
        status.get("reason", ""),
        _age(pv, now),
        spec.get("volumeMode") or "<unset>",
    ]


_PV = Printer(
    (
        _name_col(),
        Column("Capacity", description="capacity is the description of the persistent volume's resources and capacity."),
        Column("Access Modes", description="accessModes contains all ways the volume can be mounted."),
        Column("Reclaim Policy", description="persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim."),
        Column("Status", description="phase indicates if a volume is available, bound to a claim, or released by a claim."),
        Column("Claim", description="claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim."),
        Column("StorageClass", description="StorageClass of the pv"),
        Column("VolumeAttributesClass", description="VolumeAttributesClass of the pv"),
        Column("Reason", description="reason is a brief CamelCase string that describes any failure."),
        _age_col(),
        Column("VolumeMode", priority=1, description="volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state."),
    ),
    _pv_row,
)


def _pvc_row(pvc: Obj, now: _dt.datetime) -> list[Cell]:
    spec = pvc.get("spec") or {}
    status = pvc.get("status") or {}
    phase = "Terminating" if meta_of(pvc).get("deletionTimestamp") else status.get("phase", "")
    capacity = ""
    modes = ""
    volume = spec.get("volumeName") or ""
    if volume:
        modes = access_modes(status.get("accessModes"))
        capacity = str(_get(status, "capacity", "storage", default="0"))
    annotations = meta_of(pvc).get("annotations") or {}
    storage_class = annotations.get(_BETA_STORAGE_CLASS_ANNOTATION, spec.get("storageClassName") or "")
    return [
        _name(pvc),
        phase,
        volume,
        capacity,
        modes,
        storage_class,
        spec.get("volumeAttributesClassName") or "<unset>",
        _age(pvc, now),
        spec.get("volumeMode") or "<unset>",
    ]


_PVC = Printer(
    (
        _name_col(),
        Column("Status", description="phase represents the current phase of PersistentVolumeClaim."),
        Column("Volume", description="volumeName is the binding reference to the PersistentVolume backing this claim."),
        Column("Capacity", description="capacity represents the actual resources of the underlying volume."),
        Column("Access Modes", description="accessModes contains the actual access modes the volume backing the PVC has."),
        Column("StorageClass", description="StorageClass of the pvc"),
        Column("VolumeAttributesClass", description="VolumeAttributesClass of the pvc"),
        _age_col(),
        Column("VolumeMode", priority=1, description="volumeMode defines what type of volume is required by the claim."),
    ),
    _pvc_row,
)


def _storage_class_row(sc: Obj, now: _dt.datetime) -> list[Cell]:
    annotations = meta_of(sc).get("annotations") or {}
    name = _name(sc)
    if any(annotations.get(a) == "true" for a in _DEFAULT_CLASS_ANNOTATIONS):
        name += " (default)"
    return [
        name,
        sc.get("provisioner", ""),
        sc.get("reclaimPolicy") or "Delete",
        sc.get("volumeBindingMode") or "Immediate",
        bool(sc.get("allowVolumeExpansion") or False),
        _age(sc, now),
    ]


_STORAGE_CLASS = Printer(
    (
        _name_col(),
        Column("Provisioner", description="provisioner indicates the type of the provisioner."),
        Column("ReclaimPolicy", description="reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class."),
        Column("VolumeBindingMode", description="volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound."),
        Column("AllowVolumeExpansion", description="allowVolumeExpansion shows whether the storage class allow volume expand."),
        _age_col(),
    ),
    _storage_class_row,
)

_CSI_NODE = Printer(
    (
        _name_col(),
        Column("Drivers", type="integer", description="Drivers indicates the number of CSI drivers registered on the node"),
        _age_col(),
    ),
    lambda o, now: [_name(o), len(_get(o, "spec", "drivers", default=[])), _age(o, now)],
)

_CSI_STORAGE_CAPACITY = Printer(
    (
        _name_col(),
        Column("StorageClassName", description="storageClassName represents the name of the StorageClass that the reported capacity applies to."),
        Column("Capacity", description="capacity is the value reported by the CSI driver in its GetCapacityResponse."),
    ),
    lambda o, now: [_name(o), o.get("storageClassName", ""),
                    str(o["capacity"]) if o.get("capacity") is not None else "<unset>"],
)


# --------------------------------------------------------------------------- workloads


def _deployment_row(d: Obj, now: _dt.datetime) -> list[Cell]:
    spec = d.get("spec") or {}
    status = d.get("status") or {}
    desired = spec.get("replicas", 1)
    names, images = _containers_cells(_template_spec(d))
    return [
        _name(d),
        f"{int(status.get('readyReplicas') or 0)}/{int(desired if desired is not None else 1)}",
        int(status.get("updatedReplicas") or 0),
        int(status.get("availableReplicas") or 0),
        _age(d, now),
        names,
        images,
        selector_string(spec.get("selector")),
    ]


_DEPLOYMENT = Printer(
    (
        _name_col(),
        Column("Ready", description="Number of the pod with ready state"),
        Column("Up-to-date", description="Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
        Column("Available", description="Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
        _age_col(),
        Column("Containers", priority=1, description=_CONTAINERS_DOC),
        Column("Images", priority=1, description=_IMAGES_DOC),
        Column("Selector", priority=1, description="Label selector for pods."),
    ),
    _deployment_row,
)


def _replicaset_row(rs: Obj, now: _dt.datetime) -> list[Cell]:
    spec = rs.get("spec") or {}
    status = rs.get("status") or {}
    desired = spec.get("replicas", 1)
    names, images = _containers_cells(_template_spec(rs))
    return [
        _name(rs),
        int(desired if desired is not None else 1),
        int(status.get("replicas") or 0),
        int(status.get("readyReplicas") or 0),
        _age(rs, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


_REPLICASET = Printer(
    (
        _name_col(),
        Column("Desired", type="integer", description="Replicas is the number of desired replicas."),
        Column("Current", type="integer", description="Replicas is the most recently observed number of replicas."),
        Column("Ready", type="integer", description="The number of ready replicas for this replica set."),
        _age_col(),
        Column("Containers", priority=1, description=_CONTAINERS_DOC),
        Column("Images", priority=1, description=_IMAGES_DOC),
        Column("Selector", priority=1, description="Selector is a label query over pods that should match the replica count."),
    ),
    _replicaset_row,
)


def _daemonset_row(ds: Obj, now: _dt.datetime) -> list[Cell]:
    status = ds.get("status") or {}
    names, images = _containers_cells(_template_spec(ds))
    return [
        _name(ds),
        int(status.get("desiredNumberScheduled") or 0),
        int(status.get("currentNumberScheduled") or 0),
        int(status.get("numberReady") or 0),
        int(status.get("updatedNumberScheduled") or 0),
        int(status.get("numberAvailable") or 0),
        format_labels(_template_spec(ds).get("nodeSelector")),
        _age(ds, now),
        names,
        images,
        format_label_selector(_get(ds, "spec", "selector")),
    ]


_DAEMONSET = Printer(
    (
        _name_col(),
        Column("Desired", type="integer", description="The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
        Column("Current", type="integer", description="The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
        Column("Ready", type="integer", description="numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition."),
        Column("Up-to-date", type="integer", description="The total number of nodes that are running updated daemon pod"),
        Column("Available", type="integer", description="The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)"),
        Column("Node Selector", description="NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/"),
        _age_col(),
        Column("Containers", priority=1, description=_CONTAINERS_DOC),
        Column("Images", priority=1, description=_IMAGES_DOC),
        Column("Selector", priority=1, description="A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
    ),
    _daemonset_row,
)


def _controller_name(obj: Obj) -> str:
    """``kind.group/name`` of the controlling owner (lower case, as upstream's
    ``formatResourceName``), ``<none>`` without one."""
    for ref in meta_of(obj).get("ownerReferences") or []:
        if not isinstance(ref, dict) or not ref.get("controller"):
            continue
        api_version = str(ref.get("apiVersion") or "")
        group = api_version.split("/", 1)[0] if "/" in api_version else ""
        kind = str(ref.get("kind") or "")
        name = str(ref.get("name") or "")
        if not kind:
            return name
        return f"{(f'{kind}.{group}' if group else kind).lower()}/{name}"
    return "<none>"


def _controller_revision_row(cr: Obj, now: _dt.datetime) -> list[Cell]:
    revision = cr.get("revision")
    return [_name(cr), _controller_name(cr), revision if isinstance(revision, int) else 0, _age(cr, now)]


def _statefulset_row(sts: Obj, now: _dt.datetime) -> list[Cell]:
    spec = sts.get("spec") or {}
    status = sts.get("status") or {}
    desired = spec.get("replicas", 1)
    names, images = _containers_cells(_template_spec(sts))
    return [
        _name(sts),
        f"{int(status.get('readyReplicas') or 0)}/{int(desired if desired is not None else 1)}",
        _age(sts, now),
        names,
        images,
    ]


_STATEFULSET = Printer(
    (
        _name_col(),
        Column("Ready", description="Number of the pod with ready state"),
        _age_col(),
        Column("Containers", priority=1, description=_CONTAINERS_DOC),
        Column("Images", priority=1, description=_IMAGES_DOC),
    ),
    _statefulset_row,
)


_CONTROLLER_REVISION = Printer(
    (
        _name_col(),
        Column("Controller", description="Controller of the object"),
        Column("Revision", description="Revision indicates the revision of the state represented by Data."),
        _age_col(),
    ),
    _controller_revision_row,
)


def _job_row(job: Obj, now: _dt.datetime) -> list[Cell]:
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    succeeded = int(status.get("succeeded") or 0)
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    else:
        parallelism = int(spec.get("parallelism") or 0)
        completions = f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"
    start = _parse(status.get("startTime"))
    end = _parse(status.get("completionTime"))
    if start is None:
        job_duration = ""
    elif end is None:
        job_duration = human_duration(now - start)
    else:
        job_duration = human_duration(end - start)
    conds = status.get("conditions")
    if _condition_status(conds, "Complete"):
        state = "Complete"
    elif _condition_status(conds, "Failed"):
        state = "Failed"
    elif meta_of(job).get("deletionTimestamp"):
        state = "Terminating"
    elif _condition_status(conds, "Suspended"):
        state = "Suspended"
    elif _condition_status(conds, "FailureTarget"):
        state = "FailureTarget"
    elif _condition_status(conds, "SuccessCriteriaMet"):
        state = "SuccessCriteriaMet"
    else:
        state = "Running"
    names, images = _containers_cells(_template_spec(job))
    return [
        _name(job), state, completions, job_duration, _age(job, now),
        names, images, format_label_selector(spec.get("selector")),
    ]


_JOB = Printer(
    (
        _name_col(),
        Column("Status", description="Status of the job."),
        Column("Completions", description="The number of pods which reached phase Succeeded."),
        Column("Duration", description="Time required to complete the job."),
        _age_col(),
        Column("Containers", priority=1, description=_CONTAINERS_DOC),
        Column("Images", priority=1, description=_IMAGES_DOC),
        Column("Selector", priority=1, description="A label query over pods that should match the pod count."),
    ),
    _job_row,
)

_PDB = Printer(
    (
        _name_col(),
        Column("Min Available", description="The minimum number of pods that must be available."),
        Column("Max Unavailable", description="The maximum number of pods that may be unavailable."),
        Column("Allowed Disruptions", type="integer", description="Calculated number of pods that may be disrupted at this time."),
        _age_col(),
    ),
    lambda o, now: [
        _name(o),
        str(_get(o, "spec", "minAvailable")) if _get(o, "spec", "minAvailable") is not None else "N/A",
        str(_get(o, "spec", "maxUnavailable")) if _get(o, "spec", "maxUnavailable") is not None else "N/A",
        int(_get(o, "status", "disruptionsAllowed", default=0)),
        _age(o, now),
    ],
)

_PRIORITY_CLASS = Printer(
    (
        _name_col(),
        Column("Value", type="integer", description="The value of this priority class."),
        Column("Global-Default", type="boolean", description="globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class."),
        _age_col(),
        Column("PreemptionPolicy", description="PreemptionPolicy is the Policy for preempting pods with lower priority."),
    ),
    lambda o, now: [
        _name(o), int(o.get("value") or 0), bool(o.get("globalDefault") or False), _age(o, now),
        o.get("preemptionPolicy") or "",
    ],
)


def _cronjob_row(cj: Obj, now: _dt.datetime) -> list[Cell]:
    spec = cj.get("spec") or {}
    status = cj.get("status") or {}
    suspend = spec.get("suspend")
    last = status.get("lastScheduleTime")
    job_spec = _get(spec, "jobTemplate", "spec", default={})
    names, images = _containers_cells(_get(job_spec, "template", "spec", default={}))
    return [
        _name(cj),
        spec.get("schedule") or "",
        spec.get("timeZone") if spec.get("timeZone") is not None else "<none>",
        "<unset>" if suspend is None else ("True" if suspend else "False"),
        len(status.get("active") or []),
        since(last, now) if last else "<none>",
        _age(cj, now),
        names,
        images,
        format_label_selector(job_spec.get("selector") if isinstance(job_spec, dict) else None),
    ]


_CRONJOB = Printer(
    (
        _name_col(),
        Column("Schedule", description="The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
        Column("Timezone", description=(
            "The time zone name for the given schedule, see "
            "https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to "
            "the time zone of the kube-controller-manager process. The set of valid time zone names and the time "
            "zone offset is loaded from the system-wide time zone database by the API server during CronJob "
            "validation and the controller manager during execution. If no system-wide time zone database can be "
            "found a bundled version of the database is used instead. If the time zone name becomes invalid "
            "during the lifetime of a CronJob or due to a change in host configuration, the controller will stop "
            "creating new new Jobs and will create a system event with the reason UnknownTimeZone. More "
            "information can be found in "
            "https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones")),
        Column("Suspend", type="boolean", description=(
            "This flag tells the controller to suspend subsequent executions, it does not apply to already started "
            "executions.  Defaults to false.")),
        Column("Active", type="integer", description="A list of pointers to currently running jobs."),
        Column("Last Schedule", description="Information when was the last time the job was successfully scheduled."),
        _age_col(),
        Column("Containers", priority=1, description=_CONTAINERS_DOC),
        Column("Images", priority=1, description=_IMAGES_DOC),
        Column("Selector", priority=1, description=(
            "A label query over pods that should match the pod count. Normally, the system sets this field for "
            "you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/"
            "#label-selectors")),
    ),
    _cronjob_row,
)


def _replication_controller_row(rc: Obj, now: _dt.datetime) -> list[Cell]:
    spec = rc.get("spec") or {}
    status = rc.get("status") or {}
    names, images = _containers_cells(_template_spec(rc))
    selector = spec.get("selector")
    return [
        _name(rc),
        int(spec.get("replicas") or 0),
        int(status.get("replicas") or 0),
        int(status.get("readyReplicas") or 0),
        _age(rc, now),
        names,
        images,
        format_labels(selector if isinstance(selector, dict) else None),
    ]


_REPLICATION_CONTROLLER = Printer(
    (
        _name_col(),
        Column("Desired", type="integer", description=(
            "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero "
            "and unspecified. Defaults to 1. More info: "
            "https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller"
            "#what-is-a-replicationcontroller")),
        Column("Current", type="integer", description=(
            "Replicas is the most recently observed number of replicas. More info: "
            "https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller"
            "#what-is-a-replicationcontroller")),
        Column("Ready", type="integer", description="The number of ready replicas for this replication controller."),
        _age_col(),
        Column("Containers", priority=1, description=_CONTAINERS_DOC),
        Column("Images", priority=1, description=_IMAGES_DOC),
        Column("Selector", priority=1, description=(
            "Selector is a label query over pods that should match the Replicas count. If Selector is empty, it "
            "is defaulted to the labels present on the Pod template. Label keys and values that must match in "
            "order to be controlled by this replication controller, if empty defaulted to labels on Pod template. "
            "More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors")),
    ),
    _replication_controller_row,
)


def _pod_template_row(pt: Obj, now: _dt.datetime) -> list[Cell]:
    names, images = _containers_cells(_get(pt, "template", "spec", default={}))
    labels = _get(pt, "template", "metadata", "labels")
    return [_name(pt), names, images, format_labels(labels if isinstance(labels, dict) else None)]


_POD_TEMPLATE = Printer(
    (
        _name_col(),
        Column("Containers", description=_CONTAINERS_DOC),
        Column("Images", description=_IMAGES_DOC),
        Column("Pod Labels", description="The labels for the pod template."),
    ),
    _pod_template_row,
)


# --------------------------------------------------------------------------- core misc


def _event_row(ev: Obj, now: _dt.datetime) -> list[Cell]:
    first_ts = ev.get("firstTimestamp")
    first = since(first_ts, now) if _parse(first_ts) else since(ev.get("eventTime"), now)
    last_ts = ev.get("lastTimestamp")
    last = since(last_ts, now) if _parse(last_ts) else first
    count = int(ev.get("count") or 0)
    series = ev.get("series")
    if series:
        last = since(series.get("lastObservedTime"), now)
        count = int(series.get("count") or 0)
    elif count == 0:
        count = 1
    involved = ev.get("involvedObject") or {}
    kind = (involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = ev.get("source") or {}
    component = source.get("component") or ev.get("reportingComponent") or ""
    host = source.get("host") or ev.get("reportingInstance") or ""
    source_cell = f"{component}, {host}" if host else component
    return [
        last,
        ev.get("type", ""),
        ev.get("reason", ""),
        target,
        involved.get("fieldPath", ""),
        source_cell,
        (ev.get("message") or "").strip(),
        first,
        count,
        _name(ev),
    ]


_EVENT = Printer(
    (
        Column("Last Seen", description="The time at which the most recent occurrence of this event was recorded."),
        Column("Type", description="Type of this event (Normal, Warning), new types could be added in the future"),
        Column("Reason", description="This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
        Column("Object", description="The object that this event is about."),
        Column("Subobject", priority=1, description="If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement."),
        Column("Source", priority=1, description="The component reporting this event."),
        Column("Message", description="A human-readable description of the status of this operation."),
        Column("First Seen", priority=1, description="The time at which the event was first recorded."),
        Column("Count", priority=1, description="The number of times this event has occurred."),
        _name_col(priority=1),
    ),
    _event_row,
)

_NAMESPACE = Printer(
    (_name_col(), Column("Status", description="The status of the namespace"), _age_col()),
    lambda o, now: [_name(o), _get(o, "status", "phase", default=""), _age(o, now)],
)

_CONFIGMAP = Printer(
    (_name_col(), Column("Data", description="Data contains the configuration data."), _age_col()),
    lambda o, now: [_name(o), len(o.get("data") or {}) + len(o.get("binaryData") or {}), _age(o, now)],
)

_SECRET = Printer(
    (
        _name_col(),
        Column("Type", description="Used to facilitate programmatic handling of secret data."),
        Column("Data", description="Data contains the secret data."),
        _age_col(),
    ),
    lambda o, now: [_name(o), o.get("type", ""), len(o.get("data") or {}), _age(o, now)],
)


_SERVICE_ACCOUNT = Printer(
    (
        _name_col(),
        Column("Secrets", description="Secrets is a list of the secrets in the same namespace that pods "
                                      "running using this ServiceAccount are allowed to use."),
        _age_col(),
    ),
    lambda o, now: [_name(o), len(o.get("secrets") or []), _age(o, now)],
)


def csr_condition(csr: Obj) -> str:
    """``Approved,Issued``, ``Denied``, ``Pending,Failed``...: denial wins over approval."""
    types = {c.get("type") for c in _get(csr, "status", "conditions", default=None) or [] if isinstance(c, dict)}
    out = "Denied" if "Denied" in types else "Approved" if "Approved" in types else "Pending"
    if "Failed" in types:
        out += ",Failed"
    if _get(csr, "status", "certificate", default=""):
        out += ",Issued"
    return out


def _csr_row(csr: Obj, now: _dt.datetime) -> list[Cell]:
    exp = _get(csr, "spec", "expirationSeconds", default=None)
    duration = human_duration(_dt.timedelta(seconds=exp)) if isinstance(exp, int) else "<none>"
    return [_name(csr), _age(csr, now), _get(csr, "spec", "signerName", default="") or "<none>",
            _get(csr, "spec", "username", default=""), duration, csr_condition(csr)]


_CSR = Printer(
    (
        _name_col(),
        _age_col(),
        Column("SignerName", description="signerName indicates the requested signer, and is a qualified name."),
        Column("Requestor", description="request contains an x509 certificate signing request encoded in a "
                                        "\"CERTIFICATE REQUEST\" PEM block."),
        Column("RequestedDuration", description="expirationSeconds is the requested duration of validity of "
                                                "the issued certificate."),
        Column("Condition", description="conditions applied to the request. Known conditions are "
                                        "\"Approved\", \"Denied\", and \"Failed\"."),
    ),
    _csr_row,
)


def _service_external_ip(svc: Obj) -> str:
    spec = svc.get("spec") or {}
    svc_type = spec.get("type") or "ClusterIP"
    external = spec.get("externalIPs") or []
    if svc_type in ("ClusterIP", "NodePort"):
        return ",".join(external) if external else "<none>"
    if svc_type == "LoadBalancer":
        lb: set[str] = set()
        for ing in _get(svc, "status", "loadBalancer", "ingress", default=[]):
            if ing.get("ip"):
                lb.add(ing["ip"])
            elif ing.get("hostname"):
                lb.add(ing["hostname"])
        lb_ips = sorted(lb)
        if external:
            return ",".join(lb_ips + list(external))
        return ",".join(lb_ips) if lb_ips else "<pending>"
    if svc_type == "ExternalName":
        return spec.get("externalName", "")
    return "<unknown>"


def _service_row(svc: Obj, now: _dt.datetime) -> list[Cell]:
    spec = svc.get("spec") or {}
    cluster_ips = spec.get("clusterIPs") or []
    internal_ip = (cluster_ips[0] if cluster_ips else None) or spec.get("clusterIP") or "<none>"
    ports = []
    for p in spec.get("ports") or []:
        proto = p.get("protocol") or "TCP"
        if p.get("nodePort"):
            ports.append(f"{p.get('port')}:{p['nodePort']}/{proto}")
        else:
            ports.append(f"{p.get('port')}/{proto}")
    return [
        _name(svc),
        spec.get("type") or "ClusterIP",
        internal_ip,
        _service_external_ip(svc),
        ",".join(ports) or "<none>",
        _age(svc, now),
        format_labels(spec.get("selector")),
    ]


_SERVICE = Printer(
    (
        _name_col(),
        Column("Type", description="type determines how the Service is exposed."),
        Column("Cluster-IP", description="clusterIP is the IP address of the service."),
        Column("External-IP", description="externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service."),
        Column("Port(s)", description="The list of ports that are exposed by this service."),
        _age_col(),
        Column("Selector", priority=1, description="Route service traffic to pods with label keys and values matching this selector."),
    ),
    _service_row,
)

_LEASE = Printer(
    (_name_col(), Column("Holder", description="holderIdentity contains the identity of the holder of a current lease."),
     _age_col()),
    lambda o, now: [_name(o), _get(o, "spec", "holderIdentity", default=""), _age(o, now)],
)


# CRDs have no printer upstream: the default table convertor's Name and Created At.
_CRD = Printer(
    (_name_col(), Column("Created At", type="date", description=_AGE_DOC)),
    lambda o, now: [_name(o), str((o.get("metadata") or {}).get("creationTimestamp") or "")],
)


# --------------------------------------------------------------------------- resource.k8s.io


def resource_claim_state(claim: Obj) -> str:
    """``allocated,reserved``, ``pending``, ``deleted,allocated`` and so on."""
    states: list[str] = []
    deleting = bool(meta_of(claim).get("deletionTimestamp"))
    if deleting:
        states.append("deleted")
    status = claim.get("status") or {}
    if status.get("allocation") is None:
        if not deleting:
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
    return ",".join(states)


_DEVICE_CLASS = Printer((_name_col(), _age_col()), lambda o, now: [_name(o), _age(o, now)])
_RESOURCE_CLAIM_TEMPLATE = Printer((_name_col(), _age_col()), lambda o, now: [_name(o), _age(o, now)])
_RESOURCE_CLAIM = Printer(
    (
        _name_col(),
        Column("State", description="A summary of the current state (allocated, pending, reserved, etc.)."),
        _age_col(),
    ),
    lambda o, now: [_name(o), resource_claim_state(o), _age(o, now)],
)
_RESOURCE_SLICE = Printer(
    (
        _name_col(),
        Column("Node", description="NodeName identifies the node which provides the resources in this pool."),
        Column("Driver", description="Driver identifies the DRA driver providing the capacity information."),
        Column("Pool", description="Name is used to identify the pool."),
        _age_col(),
    ),
    lambda o, now: [
        _name(o),
        _get(o, "spec", "nodeName", default=""),
        _get(o, "spec", "driver", default=""),
        _get(o, "spec", "pool", "name", default=""),
        _age(o, now),
    ],
)


# --------------------------------------------------------------------------- admissionregistration.k8s.io


def _param_kind(o: Obj) -> str:
    pk = _get(o, "spec", "paramKind")
    return f"{pk.get('apiVersion', '')}/{pk.get('kind', '')}" if isinstance(pk, dict) else "<unset>"


def _param_ref(o: Obj) -> str:
    pr = _get(o, "spec", "paramRef")
    if not isinstance(pr, dict):
        return "<unset>"
    if pr.get("name"):
        # cluster-scoped params cannot be told apart here: no namespace reads as *
        return f"{pr.get('namespace') or '*'}/{pr['name']}"
    if isinstance(pr.get("selector"), dict):
        return format_label_selector(pr["selector"])
    return "<unset>"


_VALIDATING_ADMISSION_POLICY = Printer(
    (
        _name_col(),
        Column("Validations", type="integer", description="Validations indicates the number of validation rules"),
        Column("ParamKind", description="ParamKind specifies the kind of resources used to parameterize this policy"),
        _age_col(),
    ),
    lambda o, now: [_name(o), len(_get(o, "spec", "validations", default=None) or []), _param_kind(o), _age(o, now)],
)
_VALIDATING_ADMISSION_POLICY_BINDING = Printer(
    (
        _name_col(),
        Column("PolicyName", description="PolicyName indicates the policy definition which the policy binding "
                                          "binded to"),
        Column("ParamRef", description="ParamRef indicates the param resource which sets the configration param"),
        _age_col(),
    ),
    lambda o, now: [_name(o), _get(o, "spec", "policyName", default=""), _param_ref(o), _age(o, now)],
)


# --------------------------------------------------------------------------- rbac.authorization.k8s.io


def _created_at(obj: Obj) -> str:
    ts = _parse(meta_of(obj).get("creationTimestamp"))
    return ts.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else ""


_RBAC_ROLE = Printer(
    (_name_col(), Column("Created At", type="date", description=_AGE_DOC)),
    lambda o, now: [_name(o), _created_at(o)],
)


def _subjects_cells(binding: Obj) -> list[Cell]:
    """Users, groups and ServiceAccounts (``namespace/name``), as upstream's SubjectsStrings."""
    users, groups, sas = [], [], []
    for s in binding.get("subjects") or []:
        if not isinstance(s, dict):
            continue
        kind, name = s.get("kind"), s.get("name", "")
        if kind == "User":
            users.append(name)
        elif kind == "Group":
            groups.append(name)
        elif kind == "ServiceAccount":
            sas.append(f"{s.get('namespace', '')}/{name}")
    return [", ".join(users), ", ".join(groups), ", ".join(sas)]


def _binding_printer(role_ref_doc: str) -> Printer:
    return Printer(
        (
            _name_col(),
            Column("Role", description=role_ref_doc),
            _age_col(),
            Column("Users", priority=1, description="Users in the roleBinding"),
            Column("Groups", priority=1, description="Groups in the roleBinding"),
            Column("ServiceAccounts", priority=1, description="ServiceAccounts in the roleBinding"),
        ),
        lambda o, now: [_name(o), f"{_get(o, 'roleRef', 'kind', default='')}/{_get(o, 'roleRef', 'name', default='')}",
                        _age(o, now), *_subjects_cells(o)],
    )


_ROLE_BINDING = _binding_printer(
    "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the "
    "RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.")
_CLUSTER_ROLE_BINDING = _binding_printer(
    "RoleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the "
    "Authorizer must return an error. This field is immutable.")


# --------------------------------------------------------------------------- core: quota


def _quota_text(raw: Any) -> str:
    from kubeplane.api.quantity import canonical_quantity

    try:
        return canonical_quantity(str(raw)) if not isinstance(raw, (int, float)) else str(raw)
    except ValueError:
        return str(raw)


def _resource_quota_row(rq: Obj, now: _dt.datetime) -> list[Cell]:
    """``name: used/hard`` per resource of status.hard, sorted; ``limits.*`` in LIMIT, the rest in REQUEST."""
    hard = _get(rq, "status", "hard", default={}) or {}
    used = _get(rq, "status", "used", default={}) or {}
    request, limit = [], []
    for name in sorted(hard):
        cell = f"{name}: {_quota_text(used.get(name, '0'))}/{_quota_text(hard[name])}"
        parts = name.split(".")
        (limit if len(parts) > 1 and parts[0] == "limits" else request).append(cell)
    return [_name(rq), ", ".join(request), ", ".join(limit), _age(rq, now)]


_RESOURCE_QUOTA = Printer(
    (
        _name_col(),
        Column("Request", description="Request represents a minimum amount of cpu/memory that a container may "
                                      "consume."),
        Column("Limit", description="Limits control the maximum amount of cpu/memory that a container may use "
                                    "independent of contention on the node."),
        _age_col(),
    ),
    _resource_quota_row,
)

# LimitRanges have no printer upstream: the generic NAME / CREATED AT table
_LIMIT_RANGE = Printer(
    (_name_col(), Column("Created At", type="date", description=_AGE_DOC)),
    lambda o, now: [_name(o), _created_at(o)],
)


# --------------------------------------------------------------------------- registry

_DEFAULT = Printer(
    (_name_col(), Column("Age", type="date", description=_AGE_DOC)),
    lambda o, now: [_name(o), _age(o, now)],
)

PRINTERS: dict[tuple[str, str], Printer] = {
    ("", "pods"): _POD,
    ("", "nodes"): _NODE,
    ("", "persistentvolumes"): _PV,
    ("", "persistentvolumeclaims"): _PVC,
    ("", "events"): _EVENT,
    ("", "namespaces"): _NAMESPACE,
    ("", "configmaps"): _CONFIGMAP,
    ("", "secrets"): _SECRET,
    ("", "serviceaccounts"): _SERVICE_ACCOUNT,
    ("certificates.k8s.io", "certificatesigningrequests"): _CSR,
    ("", "services"): _SERVICE,
    ("storage.k8s.io", "storageclasses"): _STORAGE_CLASS,
    ("storage.k8s.io", "csinodes"): _CSI_NODE,
    ("storage.k8s.io", "csistoragecapacities"): _CSI_STORAGE_CAPACITY,
    ("coordination.k8s.io", "leases"): _LEASE,
    ("apps", "deployments"): _DEPLOYMENT,
    ("apps", "replicasets"): _REPLICASET,
    ("batch", "jobs"): _JOB,
    ("policy", "poddisruptionbudgets"): _PDB,
    ("apiextensions.k8s.io", "customresourcedefinitions"): _CRD,
    ("scheduling.k8s.io", "priorityclasses"): _PRIORITY_CLASS,
    ("resource.k8s.io", "deviceclasses"): _DEVICE_CLASS,
    ("resource.k8s.io", "resourceclaims"): _RESOURCE_CLAIM,
    ("resource.k8s.io", "resourceclaimtemplates"): _RESOURCE_CLAIM_TEMPLATE,
    ("resource.k8s.io", "resourceslices"): _RESOURCE_SLICE,
    ("admissionregistration.k8s.io", "validatingadmissionpolicies"): _VALIDATING_ADMISSION_POLICY,
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): _VALIDATING_ADMISSION_POLICY_BINDING,
    ("rbac.authorization.k8s.io", "roles"): _RBAC_ROLE,
    ("rbac.authorization.k8s.io", "clusterroles"): _RBAC_ROLE,
    ("rbac.authorization.k8s.io", "rolebindings"): _ROLE_BINDING,
    ("rbac.authorization.k8s.io", "clusterrolebindings"): _CLUSTER_ROLE_BINDING,
    # -- job --

    # -- cronjob --
    ("batch", "cronjobs"): _CRONJOB,
    ("", "replicationcontrollers"): _REPLICATION_CONTROLLER,
    ("", "podtemplates"): _POD_TEMPLATE,

    # -- statefulset --
    ("apps", "controllerrevisions"): _CONTROLLER_REVISION,
    ("apps", "statefulsets"): _STATEFULSET,

    # -- daemonset --
    ("apps", "daemonsets"): _DAEMONSET,

    # -- endpoints --
    # (tables_networking.py builds them from this module's helpers, defined above)
    **importlib.import_module("kubeplane.apiserver.tables_networking").PRINTERS,

    # -- hpa --
    ("autoscaling", "horizontalpodautoscalers"): __import__("kubeplane.apiserver.tables_hpa", fromlist=["_"]).HPA,
    ("metrics.k8s.io", "nodes"): __import__("kubeplane.apiserver.tables_hpa", fromlist=["_"]).METRICS,
    ("metrics.k8s.io", "pods"): __import__("kubeplane.apiserver.tables_hpa", fromlist=["_"]).METRICS,

    # -- maintenance --

    # -- quota --
    ("", "resourcequotas"): _RESOURCE_QUOTA,
    ("", "limitranges"): _LIMIT_RANGE,

}


def printer_for(resource: ResourceInfo) -> Printer:
    """The printer for a resource; ``NAME AGE`` for resources without one."""
    if resource.custom is not None:
        printer = resource.custom.compiled.get("printer")
        if printer is None:
            printer = resource.custom.compiled["printer"] = custom_printer(resource.custom.printer_columns)
        return printer
    return PRINTERS.get(resource.key, _DEFAULT)


# --------------------------------------------------------------------------- custom resources

_CR_NAME_DOC = (
    "Name must be unique within a namespace. Is required when creating resources, although some resources may "
    "allow a client to request the generation of a name automatically. Name is primarily intended for creation "
    "idempotence and configuration definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
_CR_AGE_DOC = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
    "guaranteed to be set in happens-before order across separate operations. Clients may not set this value. "
    "It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. "
    "More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata")


def _json_cell(typ: str, value: Any, now: _dt.datetime) -> Any:
    """A typed column's cell as upstream's cellForJSONValue makes it (None: no value)."""
    if typ == "integer":
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                return None
        return None
    if typ == "number":
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, float)):
            return value
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return None
        return None
    if typ == "boolean":
        return value if isinstance(value, bool) else None
    if typ == "date":
        if isinstance(value, str) and _parse(value) is not None:
            return since(value, now)
        return None
    return None


def _text_cell(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, (int, float)):
        return str(value)
    import orjson

    return orjson.dumps(value).decode()


def custom_printer(columns: list[Obj]) -> Printer:
    """The Table of a custom resource: Name, then the CRD's
    additionalPrinterColumns (JSONPath cells typed as the column says), or
    Age when the CRD names none (upstream's tableconvertor)."""
    from kubeplane.api.jsonpath import JSONPathError, compile_path, find

    if not columns:
        columns = [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
                    "description": _CR_AGE_DOC}]
    cols = [Column("Name", format="name", description=_CR_NAME_DOC)]
    paths = []
    for c in columns:
        jp = str(c.get("jsonPath") or "")
        cols.append(Column(str(c.get("name") or ""), type=str(c.get("type") or "string"),
                           description=str(c.get("description") or
                                           f"Custom resource definition column (in JSONPath format): {jp}"),
                           priority=int(c.get("priority") or 0), format=str(c.get("format") or "")))
        try:
            paths.append((str(c.get("type") or "string"), compile_path(jp)))
        except JSONPathError:
            paths.append((str(c.get("type") or "string"), None))

    def row(obj: Obj, now: _dt.datetime) -> list[Any]:
        cells: list[Any] = [_name(obj)]
        for typ, steps in paths:
            found = find(obj, steps) if steps is not None else []
            if not found:
                cells.append(None)
            elif typ == "string":
                cells.append(_text_cell(found[0]))
            else:
                cells.append(_json_cell(typ, found[0], now))
        return cells

    return Printer(tuple(cols), row)


def column_definitions(resource: ResourceInfo) -> list[Obj]:
    """The ``columnDefinitions`` of a resource's Table."""
    return [c.definition() for c in printer_for(resource).columns]


def _row_object(resource: ResourceInfo, obj: Obj, include_object: str, api_version: str) -> Obj | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        full = copy.deepcopy(obj)
        full.setdefault("apiVersion", resource.api_version)
        full.setdefault("kind", resource.kind)
        return full
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": api_version,
        "metadata": copy.deepcopy(meta_of(obj)),
    }


def build_table(
    resource: ResourceInfo,
    items: list[Obj],
    *,
    now: _dt.datetime,
    include_object: str = "Metadata",
    list_metadata: Obj | None = None,
    api_version: str = TABLE_API_VERSION,
) -> Obj:
    """Renders objects of one resource as a Table.

    ``include_object`` is the ``includeObject`` query value (empty means
    ``Metadata``); anything else raises a 400. ``list_metadata`` is the list's
    metadata (``resourceVersion``, ``continue``, ``remainingItemCount``); for a
    single-object GET leave it out and the object's resourceVersion is used.
    ``api_version`` is ``meta.k8s.io/v1`` or ``meta.k8s.io/v1beta1``.
    """
    include_object = include_object or "Metadata"
    if include_object not in INCLUDE_OBJECT_VALUES:
        raise bad_request(f'unrecognized includeObject value: "{include_object}"')
    if now.tzinfo is None:
        now = now.replace(tzinfo=_dt.timezone.utc)
    printer = printer_for(resource)

    metadata: Obj = {}
    if list_metadata is not None:
        for key in ("resourceVersion", "continue", "remainingItemCount"):
            if list_metadata.get(key) not in (None, ""):
                metadata[key] = list_metadata[key]
    elif len(items) == 1 and meta_of(items[0]).get("resourceVersion"):
        metadata["resourceVersion"] = meta_of(items[0])["resourceVersion"]

    rows: list[Obj] = []
    for obj in items:
        row: Obj = {"cells": printer.row(obj, now)}
        if printer.conditions is not None:
            conditions = printer.conditions(obj)
            if conditions:
                row["conditions"] = conditions
        embedded = _row_object(resource, obj, include_object, api_version)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)

    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": metadata,
        "columnDefinitions": [c.definition() for c in printer.columns],
        "rows": rows,
    }
