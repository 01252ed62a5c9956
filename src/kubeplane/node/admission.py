"""Whether a pod bound to the node may run there: upstream kubelet's
predicate admit handler (``pkg/kubelet/lifecycle/predicate.go``).

The checks, in upstream's order, the first failure deciding:

- the pod's ``kubernetes.io/os`` label against the node's OS
  (``PodOSSelectorNodeLabelDoesNotMatch``) and ``spec.os.name`` against the
  node's (``PodOSNotSupported``);
- the general predicates the scheduler shares with the kubelet: the pod's
  effective requests (the scheduler's :func:`pod_requests`: init containers,
  sidecars, pod-level requests, overhead) against the allocatable left by the
  pods already admitted (``OutOf<resource>``), the required node affinity and
  node selector (``NodeAffinity``), ``spec.nodeName`` (``NodeName``), host
  ports taken by admitted pods (``NodePorts``);
- a ``NoExecute`` taint of the node the pod does not tolerate
  (``TaintToleration``).

Extended resources the node does not report are not checked (they may be
cluster-level resources), as upstream.
"""

from __future__ import annotations

from typing import Any, Iterable

from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo, is_extended_resource_name
from kubeplane.scheduler.plugins import node_affinity, node_name, node_ports, taint_toleration
from kubeplane.scheduler.plugins.node_ports import fits_ports
from kubeplane.scheduler.plugins.node_resources_fit import insufficient_resources
from kubeplane.scheduler.plugins.taint_toleration import find_untolerated_taint

Obj = dict[str, Any]

#: the OS this node runs (upstream: runtime.GOOS)
NODE_OS = "linux"
OS_LABEL = "kubernetes.io/os"

POD_OS_SELECTOR_MISMATCH = "PodOSSelectorNodeLabelDoesNotMatch"
POD_OS_NOT_SUPPORTED = "PodOSNotSupported"
INVALID_NODE_INFO = "InvalidNodeInfo"
INSUFFICIENT_RESOURCE_PREFIX = "OutOf"
#: upstream TaintToleration's ErrReasonNotMatch
TAINTS_NOT_TOLERATED = "node(s) had taints that the pod didn't tolerate"


class Rejection(tuple):
    """``(reason, message)`` of a pod not admitted; ``predicate`` names the
    general predicate that failed (None for the other checks)."""

    predicate: str | None

    def __new__(cls, reason: str, message: str, predicate: str | None = None) -> "Rejection":
        self = super().__new__(cls, (reason, message))
        self.predicate = predicate
        return self

    @property
    def reason(self) -> str:
        return self[0]

    @property
    def message(self) -> str:
        return self[1]


def _predicate_failure(name: str, desc: str) -> Rejection:
    return Rejection(name, f"Predicate {name} failed: {desc}", name)


def os_rejection(pod: Obj, node: Obj) -> Rejection | None:
    """The OS checks upstream makes before the predicates (preemption cannot help them)."""
    node_labels = (node.get("metadata") or {}).get("labels") or {}
    node_os = node_labels.get(OS_LABEL)
    if node_os != NODE_OS:
        node_os = NODE_OS  # the kubelet corrects the label at its next status update
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    if OS_LABEL in pod_labels and pod_labels[OS_LABEL] != node_os:
        return Rejection(POD_OS_SELECTOR_MISMATCH,
                         "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label")
    os_field = (pod.get("spec") or {}).get("os")
    if isinstance(os_field, dict) and (os_field.get("name") or "") != NODE_OS:
        return Rejection(POD_OS_NOT_SUPPORTED, "Failed to admit pod as the OS field doesn't match node OS")
    return None


def general_predicates(pod: Obj, node: Obj, others: Iterable[Obj]) -> list[Rejection]:
    """Every general predicate ``pod`` fails on ``node`` running ``others``
    (upstream's generalFilter with all failures), in upstream's order."""
    info = NodeInfo(node, others)
    pi = PodInfo(pod)
    out: list[Rejection] = []
    # extended resources the node does not know are left out (cluster-level ones)
    missing = frozenset(n for n in pi.requests if is_extended_resource_name(n) and n not in info.allocatable)
    for name, _reason, requested, used, capacity in insufficient_resources(pi.requests, info, ignored=missing):
        out.append(Rejection(INSUFFICIENT_RESOURCE_PREFIX + name,
                             f"Node didn't have enough resource: {name}, requested: {requested}, "
                             f"used: {used}, capacity: {capacity}"))
    if not pi.required_node_affinity.matches(node):
        out.append(_predicate_failure(node_affinity.NodeAffinity.name, node_affinity.ERR_REASON_POD))
    if pi.node_name and pi.node_name != info.name:
        out.append(_predicate_failure(node_name.NodeName.name, node_name.ERR_REASON))
    if not fits_ports(pi.host_ports, info.used_ports):
        out.append(_predicate_failure(node_ports.NodePorts.name, node_ports.ERR_REASON))
    taints = (node.get("spec") or {}).get("taints") or []
    if find_untolerated_taint(taints, pi.tolerations, ("NoExecute",)) is not None:
        out.append(_predicate_failure(taint_toleration.TaintToleration.name, TAINTS_NOT_TOLERATED))
    return out


def admit(pod: Obj, node: Obj, others: Iterable[Obj]) -> Rejection | None:
    """None when ``pod`` may run on ``node`` next to ``others`` (the pods
    admitted there and still running), else the first failure."""
    rejected = os_rejection(pod, node)
    if rejected is not None:
        return rejected
    failures = general_predicates(pod, node, others)
    return failures[0] if failures else None

