"""What a kubelet writes about its node: conditions, labels, the node Lease.

Shared by the simulated nodes (:mod:`kubeplane.controllers.nodeagent`) and
the real node agent (:mod:`kubeplane.node.agent`), so both word the
conditions as upstream's kubelet (pkg/kubelet/nodestatus) and shape the
Lease as its node lease controller does.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from kubeplane.api.meta import utcnow

#: the kubelet version nodes report (kubeplane follows this API version)
KUBELET_VERSION = "v1.32.0-kubeplane"
LEASE_NAMESPACE = "kube-node-lease"
#: the kubelet's default --node-lease-duration-seconds; renewed every quarter of it
LEASE_DURATION_SECONDS = 40

#: (condition type, status) -> (reason, message), as upstream's setters word them
CONDITION_TEXTS: dict[tuple[str, str], tuple[str, str]] = {
    ("MemoryPressure", "False"): ("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("MemoryPressure", "True"): ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
    ("DiskPressure", "False"): ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("DiskPressure", "True"): ("KubeletHasDiskPressure", "kubelet has disk pressure"),
    ("PIDPressure", "False"): ("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("PIDPressure", "True"): ("KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
    ("Ready", "True"): ("KubeletReady", "kubelet is posting ready status"),
}
CONDITION_ORDER = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")


def micro_time(t: _dt.datetime | None = None) -> str:
    """A MicroTime (the Lease's renewTime): RFC 3339 with microseconds."""
    t = t or utcnow()
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def condition(type_: str, status: str, now: str, reason: str | None = None,
              message: str | None = None) -> dict:
    """One node condition; reason and message default to upstream's words."""
    default = CONDITION_TEXTS.get((type_, status), ("KubeletNotReady", ""))
    return {"type": type_, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": now,
            "reason": reason if reason is not None else default[0],
            "message": message if message is not None else default[1]}


def node_conditions(now: str, *, memory_pressure: bool = False, disk_pressure: bool = False,
                    pid_pressure: bool = False, not_ready: str | None = None) -> list[dict]:
    """The four conditions a kubelet keeps, in its order; ``not_ready`` is
    the message of a Ready=False (reason KubeletNotReady)."""
    return [
        condition("MemoryPressure", "True" if memory_pressure else "False", now),
        condition("DiskPressure", "True" if disk_pressure else "False", now),
        condition("PIDPressure", "True" if pid_pressure else "False", now),
        condition("Ready", "True", now) if not_ready is None
        else condition("Ready", "False", now, "KubeletNotReady", not_ready),
    ]


def carry_transitions(old: list[Any] | None, new: list[dict]) -> list[dict]:
    """``new`` conditions keeping the lastTransitionTime of an ``old`` one of
    the same type and status (a transition is a change of status)."""
    before = {c.get("type"): c for c in old or [] if isinstance(c, dict)}
    out = []
    for c in new:
        prev = before.get(c["type"])
        if prev is not None and prev.get("status") == c["status"] and prev.get("lastTransitionTime"):
            c = {**c, "lastTransitionTime": prev["lastTransitionTime"]}
        out.append(c)
    return out


def default_labels(hostname: str, os_name: str = "linux", arch: str = "amd64") -> dict[str, str]:
    """The labels a kubelet puts on its Node (the stable and the beta OS/arch ones)."""
    return {"kubernetes.io/hostname": hostname, "kubernetes.io/os": os_name, "kubernetes.io/arch": arch,
            "beta.kubernetes.io/os": os_name, "beta.kubernetes.io/arch": arch}


def lease_object(node: str, renew_time: str, *, duration: int = LEASE_DURATION_SECONDS,
                 node_uid: str | None = None, annotations: dict[str, str] | None = None) -> dict:
    """A node's Lease in kube-node-lease, owned by its Node when its uid is known."""
    md: dict = {"name": node, "namespace": LEASE_NAMESPACE}
    if annotations:
        md["annotations"] = dict(annotations)
    if node_uid:
        md["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": md,
            "spec": {"holderIdentity": node, "leaseDurationSeconds": duration, "renewTime": renew_time}}
