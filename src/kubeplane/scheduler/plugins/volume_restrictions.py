"""VolumeRestrictions: volumes that cannot be shared between pods.

Upstream ``pkg/scheduler/framework/plugins/volumerestrictions``:

* disk conflicts on the node: the same GCE PD / iSCSI IQN / RBD image
  (unless every user mounts it read-only) or the same AWS EBS volume;
* a PersistentVolumeClaim with access mode ReadWriteOncePod that any other
  scheduled (or assumed) pod already uses.

Both rejections are Unschedulable: preempting the other pod can help, so the
PreFilter extensions track pods added/removed during preemption.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kubeplane.api.meta import meta_of as _meta
from kubeplane.api.resources import resource
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle, Plugin
from kubeplane.scheduler.framework.hintscope import HintScope, set_hint_scope
from kubeplane.scheduler.plugins.hint_scopes import CLAIM_HINT_SCOPE
from kubeplane.scheduler.framework.types import (
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    CycleState,
    EventResource,
    Obj,
    PreFilterResult,
    QueueingHint,
    Status,
)

NAME = "VolumeRestrictions"
STATE_KEY = "PreFilter" + NAME
REASON_DISK_CONFLICT = "node(s) had no available disk"
REASON_RWOP_CONFLICT = "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"

PVCS = resource("persistentvolumeclaims")

__all__ = ["NAME", "REASON_DISK_CONFLICT", "REASON_RWOP_CONFLICT", "VolumeRestrictions", "is_volume_conflict"]

_RESTRICTED = ("gcePersistentDisk", "awsElasticBlockStore", "rbd", "iscsi")


def _volumes(pod: Mapping[str, Any]) -> list[Obj]:
    return list((pod.get("spec") or {}).get("volumes") or ())


def needs_restrictions_check(volume: Mapping[str, Any]) -> bool:
    return any(volume.get(k) is not None for k in _RESTRICTED)


def is_volume_conflict(volume: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``volume`` conflicts with a volume of ``pod`` (upstream isVolumeConflict)."""
    for other in _volumes(pod):
        a, b = volume.get("gcePersistentDisk"), other.get("gcePersistentDisk")
        if a is not None and b is not None:
            if a.get("pdName") == b.get("pdName") and not (a.get("readOnly") and b.get("readOnly")):
                return True
        a, b = volume.get("awsElasticBlockStore"), other.get("awsElasticBlockStore")
        if a is not None and b is not None and a.get("volumeID") == b.get("volumeID"):
            return True
        a, b = volume.get("iscsi"), other.get("iscsi")
        if a is not None and b is not None:
            if a.get("iqn") == b.get("iqn") and not (a.get("readOnly") and b.get("readOnly")):
                return True
        a, b = volume.get("rbd"), other.get("rbd")
        if a is not None and b is not None:
            overlap = bool(set(a.get("monitors") or ()) & set(b.get("monitors") or ()))
            same = ((a.get("pool") or "rbd") == (b.get("pool") or "rbd") and a.get("image") == b.get("image"))
            if overlap and same and not (a.get("readOnly") and b.get("readOnly")):
                return True
    return False


def _disk_keys(volume: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Keys under which :func:`is_volume_conflict` can find ``volume`` in conflict
    with another volume: equal keys are necessary for a conflict."""
    keys: list[tuple[Any, ...]] = []
    a = volume.get("gcePersistentDisk")
    if a is not None:
        keys.append(("gce", a.get("pdName")))
    a = volume.get("awsElasticBlockStore")
    if a is not None:
        keys.append(("aws", a.get("volumeID")))
    a = volume.get("iscsi")
    if a is not None:
        keys.append(("iscsi", a.get("iqn")))
    a = volume.get("rbd")
    if a is not None:
        set(a.get("monitors") or ())  # evaluated as the conflict check does
        keys.append(("rbd", a.get("pool") or "rbd", a.get("image")))
    return keys


def _pod_deleted_keys_of_pod(pod: Obj) -> list[tuple[Any, ...]]:
    """Disk keys of the pod's restricted volumes, and its namespace when it has
    claims (a deleted pod in that namespace may release a ReadWriteOncePod claim)."""
    keys: list[tuple[Any, ...]] = []
    has_claim = False
    for vol in _volumes(pod):
        if needs_restrictions_check(vol):
            keys.extend(_disk_keys(vol))
        if vol.get("persistentVolumeClaim") is not None:
            has_claim = True
    if has_claim:
        keys.append(("ns", _meta(pod).get("namespace") or "default"))
    return keys


def _pod_deleted_event_keys(old: Any, new: Any) -> list[tuple[Any, ...]]:
    """Keys of a deleted assigned pod: its disks and namespace (none for an unassigned pod)."""
    if old is None or not (old.get("spec") or {}).get("nodeName"):
        return []
    keys: list[tuple[Any, ...]] = []
    for vol in _volumes(old):
        keys.extend(_disk_keys(vol))
    PodInfo(old)  # the hint builds it for same-namespace pods; raising here disables pre-selection
    keys.append(("ns", _meta(old).get("namespace") or "default"))
    return keys


#: is_schedulable_after_pod_deleted: a conflicting disk or a claim in the deleted pod's namespace
POD_DELETED_HINT_SCOPE = HintScope(_pod_deleted_keys_of_pod, _pod_deleted_event_keys)


@dataclass
class _State:
    rwop_pvcs: set[str] = field(default_factory=set)
    conflicting_pvc_ref_count: int = 0

    def clone(self) -> "_State":
        return _State(set(self.rwop_pvcs), self.conflicting_pvc_ref_count)

    def update_with_pod(self, pod_info: PodInfo, multiplier: int) -> None:
        for claim in pod_info.pvc_names:
            if f"{pod_info.namespace}/{claim}" in self.rwop_pvcs:
                self.conflicting_pvc_ref_count += multiplier


class VolumeRestrictions(Plugin):
    """See the module docstring. PVCs are read from ``handle.informer_factory``."""

    name = NAME

    def __init__(self, args: dict | None, handle: Handle) -> None:
        super().__init__(args, handle)
        self.pvc_lister = (handle.informer_factory.informer_for(PVCS).indexer
                           if handle.informer_factory is not None else None)

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.DELETE), self.is_schedulable_after_pod_deleted),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD)),
            ClusterEventWithHint(ClusterEvent(EventResource.PERSISTENT_VOLUME_CLAIM, ActionType.ADD),
                                 self.is_schedulable_after_pvc_added),
        ]

    def is_schedulable_after_pod_deleted(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if old is None:
            return QueueingHint.SKIP
        if not (old.get("spec") or {}).get("nodeName"):
            return QueueingHint.SKIP
        for vol in _volumes(pod):
            if needs_restrictions_check(vol) and is_volume_conflict(vol, old):
                return QueueingHint.QUEUE
        ns = _meta(pod).get("namespace") or "default"
        if (_meta(old).get("namespace") or "default") != ns:
            return QueueingHint.SKIP
        try:
            rwop = self._rwop_pvcs(pod)
        except LookupError:
            return QueueingHint.QUEUE
        deleted = {f"{ns}/{c}" for c in PodInfo(old).pvc_names}
        return QueueingHint.QUEUE if rwop & deleted else QueueingHint.SKIP

    @staticmethod
    def is_schedulable_after_pvc_added(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if new is None or (_meta(new).get("namespace") or "default") != (_meta(pod).get("namespace") or "default"):
            return QueueingHint.SKIP
        names = {(v.get("persistentVolumeClaim") or {}).get("claimName") for v in _volumes(pod)}
        return QueueingHint.QUEUE if _meta(new).get("name") in names else QueueingHint.SKIP

    def _rwop_pvcs(self, pod: Obj) -> set[str]:
        """Keys of the pod's claims with ReadWriteOncePod; ``LookupError`` names a missing claim."""
        out: set[str] = set()
        if self.pvc_lister is None:
            return out
        ns = _meta(pod).get("namespace") or "default"
        for vol in _volumes(pod):
            claim = vol.get("persistentVolumeClaim")
            if claim is None:
                continue
            name = claim.get("claimName") or ""
            pvc = self.pvc_lister.get_by_key(f"{ns}/{name}")
            if pvc is None:
                raise LookupError(f'persistentvolumeclaim "{name}" not found')
            if READ_WRITE_ONCE_POD in ((pvc.get("spec") or {}).get("accessModes") or ()):
                out.add(f"{ns}/{name}")
        return out

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        pod = pod_info.pod
        needs_check = any(needs_restrictions_check(v) for v in _volumes(pod))
        try:
            rwop = self._rwop_pvcs(pod)
        except LookupError as err:
            return None, Status.unresolvable(str(err))
        count = 0
        if rwop:
            node_infos = self.handle.node_infos()
            for key in rwop:
                if any(ni.pvc_ref_counts.get(key) for ni in node_infos):
                    count += 1
        if not needs_check and count == 0:
            return None, Status.skip()
        state.write(STATE_KEY, _State(rwop, count))
        return None, None

    def add_pod(self, state: CycleState, pod_info: PodInfo, pod_info_to_add: PodInfo,
                node_info: NodeInfo) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is not None:
            s.update_with_pod(pod_info_to_add, 1)
        return None

    def remove_pod(self, state: CycleState, pod_info: PodInfo, pod_info_to_remove: PodInfo,
                   node_info: NodeInfo) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is not None:
            s.update_with_pod(pod_info_to_remove, -1)
        return None

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        for vol in _volumes(pod_info.pod):
            if not needs_restrictions_check(vol):
                continue
            for existing in node_info.pods:
                if is_volume_conflict(vol, existing.pod):
                    return Status.unschedulable(REASON_DISK_CONFLICT)
        s: _State | None = state.get(STATE_KEY)
        if s is not None and s.conflicting_pvc_ref_count > 0:
            return Status.unschedulable(REASON_RWOP_CONFLICT)
        return None


# Which pods each queueing hint can queue, for the queue's pre-selection (see queue.HintScope).
set_hint_scope(VolumeRestrictions.is_schedulable_after_pod_deleted, POD_DELETED_HINT_SCOPE)
set_hint_scope(VolumeRestrictions.is_schedulable_after_pvc_added, CLAIM_HINT_SCOPE)
