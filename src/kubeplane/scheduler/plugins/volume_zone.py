"""VolumeZone: bound PVs' zone/region labels must match the node's.

Upstream ``pkg/scheduler/framework/plugins/volumezone``. PreFilter collects
the topology labels of every bound PV of the pod (``topology.kubernetes.io/
zone|region`` and the legacy ``failure-domain.beta.kubernetes.io`` keys;
values may list several zones joined by ``__``). Unbound WaitForFirstConsumer
claims are skipped. Filter rejects a node whose labels do not contain the
value (a beta key on the PV also matches the node's GA key); nodes without
any topology label are not constrained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kubeplane.api.meta import meta_of as _meta
from kubeplane.api.resources import resource
from kubeplane.volume.matching import claim_class
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle, Plugin
from kubeplane.scheduler.framework.hintscope import pod_independent_scope, set_hint_scope
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

NAME = "VolumeZone"
STATE_KEY = "PreFilter" + NAME
REASON_CONFLICT = "node(s) had no available volume zone"

ZONE_GA = "topology.kubernetes.io/zone"
REGION_GA = "topology.kubernetes.io/region"
ZONE_BETA = "failure-domain.beta.kubernetes.io/zone"
REGION_BETA = "failure-domain.beta.kubernetes.io/region"
TOPOLOGY_LABELS = (ZONE_BETA, REGION_BETA, ZONE_GA, REGION_GA)
_BETA_TO_GA = {ZONE_BETA: ZONE_GA, REGION_BETA: REGION_GA}

PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
STORAGE_CLASSES = resource("storageclasses")

__all__ = ["NAME", "REASON_CONFLICT", "TOPOLOGY_LABELS", "VolumeZone", "label_zones_to_set"]


def label_zones_to_set(value: str) -> set[str]:
    """``"a__b"`` -> ``{"a", "b"}`` (upstream LabelZonesToSet)."""
    return {z for z in value.split("__") if z}


@dataclass(frozen=True)
class _Topology:
    key: str
    values: frozenset[str]


@dataclass
class _State:
    topologies: list[_Topology]

    def clone(self) -> "_State":
        return self


def _pod_claims(pod: Mapping[str, Any]) -> list[str]:
    out = []
    pod_name = _meta(pod).get("name") or ""
    for vol in (pod.get("spec") or {}).get("volumes") or ():
        if vol.get("persistentVolumeClaim") is not None:
            out.append((vol["persistentVolumeClaim"].get("claimName") or ""))
        elif vol.get("ephemeral") is not None:
            out.append(f"{pod_name}-{vol.get('name') or ''}")
    return out


def _topology_of(pv: Mapping[str, Any]) -> dict[str, str]:
    labels = _meta(pv).get("labels") or {}
    return {k: v for k, v in labels.items() if k in TOPOLOGY_LABELS}


class VolumeZone(Plugin):
    """See the module docstring. Listers come from ``handle.informer_factory``."""

    name = NAME

    def __init__(self, args: dict | None, handle: Handle) -> None:
        super().__init__(args, handle)
        f = handle.informer_factory
        self.pv_lister = f.informer_for(PVS).indexer if f is not None else None
        self.pvc_lister = f.informer_for(PVCS).indexer if f is not None else None
        self.class_lister = f.informer_for(STORAGE_CLASSES).indexer if f is not None else None

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.STORAGE_CLASS, ActionType.ADD),
                                 self.is_schedulable_after_storage_class_added),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_LABEL)),
            ClusterEventWithHint(ClusterEvent(EventResource.PERSISTENT_VOLUME_CLAIM,
                                              ActionType.ADD | ActionType.UPDATE),
                                 self.is_schedulable_after_pvc_change),
            ClusterEventWithHint(ClusterEvent(EventResource.PERSISTENT_VOLUME, ActionType.ADD | ActionType.UPDATE),
                                 self.is_schedulable_after_pv_change),
        ]

    @staticmethod
    def is_schedulable_after_storage_class_added(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if new is not None and new.get("volumeBindingMode") == "WaitForFirstConsumer":
            return QueueingHint.QUEUE
        return QueueingHint.SKIP

    @staticmethod
    def is_schedulable_after_pvc_change(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if new is None or (_meta(new).get("namespace") or "default") != (_meta(pod).get("namespace") or "default"):
            return QueueingHint.SKIP
        return QueueingHint.QUEUE if _meta(new).get("name") in _pod_claims(pod) else QueueingHint.SKIP

    @staticmethod
    def is_schedulable_after_pv_change(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if new is None:
            return QueueingHint.SKIP
        if old is None:
            return QueueingHint.QUEUE if _topology_of(new) else QueueingHint.SKIP
        return QueueingHint.QUEUE if _topology_of(old) != _topology_of(new) else QueueingHint.SKIP

    def _pv_topologies(self, pod: Obj) -> tuple[list[_Topology], Status | None]:
        out: list[_Topology] = []
        if self.pvc_lister is None or self.pv_lister is None or self.class_lister is None:
            return out, None
        ns = _meta(pod).get("namespace") or "default"
        for name in _pod_claims(pod):
            if not name:
                return out, Status.unresolvable("PersistentVolumeClaim had no name")
            pvc = self.pvc_lister.get_by_key(f"{ns}/{name}")
            if pvc is None:
                return out, Status.unresolvable(f'persistentvolumeclaim "{name}" not found')
            pv_name = (pvc.get("spec") or {}).get("volumeName") or ""
            if not pv_name:
                cls = claim_class(pvc)
                if not cls:
                    return out, Status.unresolvable("PersistentVolumeClaim had no pv name and storageClass name")
                sc = self.class_lister.get_by_key(cls)
                if sc is None:
                    return out, Status.unresolvable(f'storageclass.storage.k8s.io "{cls}" not found')
                mode = sc.get("volumeBindingMode")
                if mode is None:
                    return out, Status.unresolvable(f'VolumeBindingMode not set for StorageClass "{cls}"')
                if mode == "WaitForFirstConsumer":
                    continue  # the volume will be created/bound for the chosen node
                return out, Status.unresolvable("PersistentVolume had no name")
            pv = self.pv_lister.get_by_key(pv_name)
            if pv is None:
                return out, Status.unresolvable(f'persistentvolume "{pv_name}" not found')
            for key, value in _topology_of(pv).items():
                out.append(_Topology(key, frozenset(label_zones_to_set(value))))
        return out, None

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        if not _pod_claims(pod_info.pod):
            return None, Status.skip()
        topologies, st = self._pv_topologies(pod_info.pod)
        if st is not None:
            return None, st
        if not topologies:
            return None, Status.skip()
        state.write(STATE_KEY, _State(topologies))
        return None, None

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is None or not s.topologies:
            return None
        labels = _meta(node_info.node or {}).get("labels") or {}
        if not any(k in labels for k in TOPOLOGY_LABELS):
            return None
        for t in s.topologies:
            value = labels.get(t.key)
            if value is None and t.key in _BETA_TO_GA:
                value = labels.get(_BETA_TO_GA[t.key])
            if value is None or value not in t.values:
                return Status.unresolvable(REASON_CONFLICT)
        return None


# Which pods each queueing hint can queue, for the queue's pre-selection (see queue.HintScope).
set_hint_scope(VolumeZone.is_schedulable_after_pvc_change, CLAIM_HINT_SCOPE)
for _hint in (VolumeZone.is_schedulable_after_storage_class_added, VolumeZone.is_schedulable_after_pv_change):
    set_hint_scope(_hint, pod_independent_scope(_hint))
del _hint
