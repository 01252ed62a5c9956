"""Cluster events as the queue sees them: labels, matching, and pod update classification."""

from __future__ import annotations

from kubeplane.scheduler.framework.nodeinfo import pod_requests
from kubeplane.scheduler.framework.types import ActionType, ClusterEvent, EventResource
from kubeplane.scheduler.queue.queued_pod_info import Obj, _meta

EVENT_UNSCHEDULED_POD_ADD = ClusterEvent(EventResource.UNSCHEDULED_POD, ActionType.ADD, "UnscheduledPodAdd")
EVENT_UNSCHEDULED_POD_UPDATE = ClusterEvent(EventResource.UNSCHEDULED_POD, ActionType.UPDATE, "UnscheduledPodUpdate")
EVENT_UNSCHEDULED_POD_DELETE = ClusterEvent(EventResource.UNSCHEDULED_POD, ActionType.DELETE, "UnscheduledPodDelete")
EVENT_ASSIGNED_POD_ADD = ClusterEvent(EventResource.ASSIGNED_POD, ActionType.ADD, "AssignedPodAdd")
EVENT_ASSIGNED_POD_UPDATE = ClusterEvent(EventResource.ASSIGNED_POD, ActionType.UPDATE, "AssignedPodUpdate")
EVENT_ASSIGNED_POD_DELETE = ClusterEvent(EventResource.ASSIGNED_POD, ActionType.DELETE, "AssignedPodDelete")


def event_label(event: ClusterEvent) -> str:
    """Upstream-style label: the custom label, else resource + action (``NodeAdd``)."""
    if event.label:
        return event.label
    name = event.action.name or str(int(event.action))
    action = "".join(part.capitalize() for part in name.split("_"))
    return f"{event.resource.value}{action}"


def match_event(registered: ClusterEvent, incoming: ClusterEvent) -> bool:
    """Whether a registered event covers an incoming one (upstream MatchClusterEvents).

    An incoming wildcard event (e.g. UnschedulableTimeout) only matches a
    registration on the wildcard resource.
    """
    if registered.is_wildcard():
        return True
    if incoming.resource == EventResource.WILDCARD and registered.resource != EventResource.WILDCARD:
        return False
    return registered.matches(incoming)


# --------------------------------------------------------------------------------------------
# Pod update classification (upstream PodSchedulingPropertiesChange)


#: the parts of a pod spec :func:`~kubeplane.scheduler.framework.nodeinfo.pod_requests` reads
_REQUEST_FIELDS = ("containers", "initContainers", "overhead", "resources")


def _is_scale_down(new_pod: Obj, old_pod: Obj) -> bool:
    """Whether some request of the pod went down or away (the requests the
    scheduler's cache accounts, pod-level requests included)."""
    new_spec, old_spec = new_pod.get("spec") or {}, old_pod.get("spec") or {}
    if all(new_spec.get(f) == old_spec.get(f) for f in _REQUEST_FIELDS):
        return False  # the same requests (most updates change only metadata or status)
    try:
        new_reqs = pod_requests(new_pod)
        old_reqs = pod_requests(old_pod)
    except Exception:  # malformed requests (validation rejects them): count as a possible shrink
        return True
    for name, old_v in old_reqs.items():
        new_v = new_reqs.get(name)
        if new_v is None or old_v > new_v:
            return True
    return False


def pod_update_events(old_pod: Obj, new_pod: Obj) -> list[ClusterEvent]:
    """Classify a pod update into UpdatePodXYZ events (UnscheduledPod or AssignedPod resource)."""
    new_spec = new_pod.get("spec") or {}
    old_spec = old_pod.get("spec") or {}
    resource = EventResource.ASSIGNED_POD if new_spec.get("nodeName") else EventResource.UNSCHEDULED_POD
    actions: list[ActionType] = []
    if (_meta(new_pod).get("labels") or {}) != (_meta(old_pod).get("labels") or {}):
        actions.append(ActionType.UPDATE_POD_LABEL)
    if _is_scale_down(new_pod, old_pod):
        actions.append(ActionType.UPDATE_POD_SCALE_DOWN)
    if old_spec.get("schedulingGates") and not new_spec.get("schedulingGates"):
        actions.append(ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED)
    if (new_spec.get("tolerations") or []) != (old_spec.get("tolerations") or []):
        actions.append(ActionType.UPDATE_POD_TOLERATIONS)
    old_claims = (old_pod.get("status") or {}).get("resourceClaimStatuses") or []
    new_claims = (new_pod.get("status") or {}).get("resourceClaimStatuses") or []
    if old_claims != new_claims:
        actions.append(ActionType.UPDATE_POD_GENERATED_RESOURCE_CLAIM)
    if not actions:
        actions.append(ActionType.UPDATED_POD_OTHER)
    return [ClusterEvent(resource, a) for a in actions]


def is_pod_updated(old_pod: Obj, new_pod: Obj) -> bool:
    """Whether anything but status/resourceVersion/generation/managedFields/finalizers changed."""

    def strip(p: Obj) -> Obj:
        meta = {k: v for k, v in _meta(p).items()
                if k not in ("resourceVersion", "generation", "managedFields", "finalizers")}
        out = {k: v for k, v in p.items() if k not in ("metadata", "status")}
        out["metadata"] = meta
        status = p.get("status") or {}
        out["status"] = {k: status[k] for k in ("resourceClaimStatuses", "extendedResourceClaimStatus") if k in status}
        return out

    return strip(old_pod) != strip(new_pod)

