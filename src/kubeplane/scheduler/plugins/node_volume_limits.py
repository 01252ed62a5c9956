"""NodeVolumeLimits: a node's CSI attach limits (upstream CSILimits).

The limit of a driver on a node is ``CSINode.spec.drivers[].allocatable.count``
(no CSINode, driver or count: unlimited). Volumes are identified per driver:
a bound PV by its ``spec.csi`` driver and volume handle; an unbound claim (or
one whose PV is missing) by its class's provisioner and ``<namespace>-<claim>``;
an inline CSI volume by the pod uid and volume name. A pod fits when the
node's attached volumes plus the pod's new ones (already attached ones not
counted twice) stay within each driver's limit; otherwise Unschedulable
"node(s) exceed max volume count".

For the scheduler's vectorised Filter, :meth:`NodeVolumeLimits.filter_pass_except`
names the only nodes that can reject the pod: those whose CSINode publishes a
limit for one of the pod's new volumes' drivers (an index of the CSINode
informer, ``driver -> CSINode names``).
"""

from __future__ import annotations

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

NAME = "NodeVolumeLimits"
REASON_MAX_VOLUME_COUNT = "node(s) exceed max volume count"

PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
STORAGE_CLASSES = resource("storageclasses")
CSI_NODES = resource("csinodes")

#: CSINode informer index: names of the drivers with an attach limit
CSI_NODE_LIMITED_DRIVER_INDEX = "csinode-limited-driver"

__all__ = ["CSI_NODE_LIMITED_DRIVER_INDEX", "NAME", "NodeVolumeLimits", "REASON_MAX_VOLUME_COUNT",
           "limited_drivers_index", "volume_limits"]


def volume_limits(csi_node: Mapping[str, Any] | None) -> dict[str, int]:
    """Driver name -> attach limit from a CSINode."""
    out: dict[str, int] = {}
    for d in ((csi_node or {}).get("spec") or {}).get("drivers") or ():
        count = (d.get("allocatable") or {}).get("count")
        if count is not None:
            out[d.get("name") or ""] = int(count)
    return out


def limited_drivers_index(csi_node: Mapping[str, Any]) -> list[str]:
    """Index values of a CSINode: the drivers :func:`volume_limits` reports a limit for."""
    return list(volume_limits(csi_node))


class _MissingClaim(Exception):
    pass


class NodeVolumeLimits(Plugin):
    """See the module docstring. Listers come from ``handle.informer_factory``."""

    name = NAME

    def __init__(self, args: dict | None, handle: Handle) -> None:
        super().__init__(args, handle)
        f = handle.informer_factory
        self.pv_lister = f.informer_for(PVS).indexer if f is not None else None
        self.pvc_lister = f.informer_for(PVCS).indexer if f is not None else None
        self.class_lister = f.informer_for(STORAGE_CLASSES).indexer if f is not None else None
        self.csi_node_lister = f.informer_for(CSI_NODES).indexer if f is not None else None
        self._limit_index = False
        if self.csi_node_lister is not None and hasattr(self.csi_node_lister, "index_keys"):
            try:
                self.csi_node_lister.add_indexers({CSI_NODE_LIMITED_DRIVER_INDEX: limited_drivers_index})
            except ValueError:
                pass  # registered by another profile on the shared informer
            self._limit_index = True

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.CSI_NODE, ActionType.ADD)),
            ClusterEventWithHint(ClusterEvent(EventResource.CSI_NODE, ActionType.UPDATE),
                                 self.is_schedulable_after_csi_node_updated),
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.DELETE),
                                 self.is_schedulable_after_pod_deleted),
            ClusterEventWithHint(ClusterEvent(EventResource.PERSISTENT_VOLUME_CLAIM, ActionType.ADD),
                                 self.is_schedulable_after_pvc_added),
        ]

    @staticmethod
    def is_schedulable_after_csi_node_updated(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if old is None or new is None:
            return QueueingHint.QUEUE
        before, after = volume_limits(old), volume_limits(new)
        for driver, limit in before.items():
            if driver not in after or after[driver] > limit:
                return QueueingHint.QUEUE
        return QueueingHint.SKIP

    @staticmethod
    def is_schedulable_after_pod_deleted(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if old is None or not (old.get("spec") or {}).get("nodeName"):
            return QueueingHint.SKIP
        for vol in (old.get("spec") or {}).get("volumes") or ():
            if vol.get("persistentVolumeClaim") is not None or vol.get("ephemeral") is not None or vol.get("csi"):
                return QueueingHint.QUEUE
        return QueueingHint.SKIP

    @staticmethod
    def is_schedulable_after_pvc_added(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if new is None or (_meta(new).get("namespace") or "default") != (_meta(pod).get("namespace") or "default"):
            return QueueingHint.SKIP
        return QueueingHint.QUEUE if _meta(new).get("name") in PodInfo(pod).pvc_names else QueueingHint.SKIP

    # ------------------------------------------------------------------ counting

    def _driver_from_class(self, pvc: Mapping[str, Any], ns: str, name: str) -> tuple[str, str]:
        cls = claim_class(pvc)
        sc = self.class_lister.get_by_key(cls) if cls and self.class_lister is not None else None
        if sc is None or not sc.get("provisioner"):
            return "", ""
        return sc["provisioner"], f"{ns}-{name}"

    def _attachable(self, pod: Mapping[str, Any], new_pod: bool, out: dict[str, str]) -> None:
        """Add ``unique key -> driver`` for each CSI volume of ``pod``; raises
        ``_MissingClaim`` for a new pod whose claim does not exist."""
        md = _meta(pod)
        ns = md.get("namespace") or "default"
        for vol in (pod.get("spec") or {}).get("volumes") or ():
            csi = vol.get("csi")
            if csi is not None:
                driver = csi.get("driver") or ""
                if driver:
                    out[f"{driver}/{md.get('uid') or ''}-{vol.get('name') or ''}"] = driver
                continue
            if vol.get("persistentVolumeClaim") is not None:
                name = vol["persistentVolumeClaim"].get("claimName") or ""
            elif vol.get("ephemeral") is not None:
                name = f"{md.get('name') or ''}-{vol.get('name') or ''}"
            else:
                continue
            pvc = self.pvc_lister.get_by_key(f"{ns}/{name}") if self.pvc_lister is not None else None
            if pvc is None:
                if new_pod:
                    raise _MissingClaim(f'looking up PVC {ns}/{name}: persistentvolumeclaim "{name}" not found')
                continue
            driver, handle = "", ""
            pv_name = (pvc.get("spec") or {}).get("volumeName") or ""
            pv = self.pv_lister.get_by_key(pv_name) if pv_name and self.pv_lister is not None else None
            if pv is not None:
                source = (pv.get("spec") or {}).get("csi")
                if source is not None:
                    driver, handle = source.get("driver") or "", source.get("volumeHandle") or ""
            else:
                driver, handle = self._driver_from_class(pvc, ns, name)
            if driver and handle:
                out[f"{driver}/{handle}"] = driver

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        for vol in (pod_info.pod.get("spec") or {}).get("volumes") or ():
            if vol.get("persistentVolumeClaim") is not None or vol.get("ephemeral") is not None or vol.get("csi"):
                return None, None
        return None, Status.skip()

    def filter_pass_except(self, state: CycleState, pod_info: PodInfo) -> set[str] | None:
        """Nodes where :meth:`filter` may fail (None: unknown, check every node).

        Filter can only reject a node whose CSINode publishes a limit for a
        driver of one of the pod's new volumes; other nodes pass."""
        pod = pod_info.pod
        if not (pod.get("spec") or {}).get("volumes"):
            return set()
        new_volumes: dict[str, str] = {}
        try:
            self._attachable(pod, True, new_volumes)
        except _MissingClaim:
            return None  # Filter reports the missing claim on every node
        if not new_volumes:
            return set()
        if not self._limit_index or self.csi_node_lister is None:
            return None
        names: set[str] = set()
        for driver in set(new_volumes.values()):
            names.update(self.csi_node_lister.index_keys(CSI_NODE_LIMITED_DRIVER_INDEX, driver))
        return names

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        pod = pod_info.pod
        if not (pod.get("spec") or {}).get("volumes"):
            return None
        csi_node = (self.csi_node_lister.get_by_key(node_info.name)
                    if self.csi_node_lister is not None else None)
        new_volumes: dict[str, str] = {}
        try:
            self._attachable(pod, True, new_volumes)
        except _MissingClaim as err:
            return Status.unresolvable(str(err))
        if not new_volumes:
            return None
        limits = volume_limits(csi_node)
        if not limits:
            return None
        attached: dict[str, str] = {}
        for existing in node_info.pods:
            if existing.uid == pod_info.uid:
                continue
            self._attachable(existing.pod, False, attached)
        attached_count: dict[str, int] = {}
        for driver in attached.values():
            attached_count[driver] = attached_count.get(driver, 0) + 1
        new_count: dict[str, int] = {}
        for key, driver in new_volumes.items():
            if key not in attached:
                new_count[driver] = new_count.get(driver, 0) + 1
        for driver, count in new_count.items():
            limit = limits.get(driver)
            if limit is not None and attached_count.get(driver, 0) + count > limit:
                return Status.unschedulable(REASON_MAX_VOLUME_COUNT)
        return None


# Which pods each queueing hint can queue, for the queue's pre-selection (see queue.HintScope).
set_hint_scope(NodeVolumeLimits.is_schedulable_after_pvc_added, CLAIM_HINT_SCOPE)
for _hint in (NodeVolumeLimits.is_schedulable_after_csi_node_updated, NodeVolumeLimits.is_schedulable_after_pod_deleted):
    set_hint_scope(_hint, pod_independent_scope(_hint))
del _hint
