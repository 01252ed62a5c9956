"""The scheduler cache: nodes, assigned and assumed pods, incremental snapshots.

Behaves as upstream's cache: assumed pods are added to their node at once,
confirmed by the informer's Add, forgotten on failure, optionally expired
``ttl`` seconds after binding finished (``ttl == 0``: never). Every NodeInfo
mutation bumps its generation; ``update_snapshot`` walks nodes from the most
recently changed and copies only those newer than the snapshot, so a cycle
costs O(changed nodes), not O(cluster). Node order in the snapshot follows a
zone-interleaved node tree and stays stable between cycles.

All methods are meant to run on one thread (the scheduler's event loop).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable

from kubeplane.scheduler.framework.nodeinfo import ImageStateSummary, NodeInfo, PodInfo, pod_key
from kubeplane.scheduler.framework.types import Obj

ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
_OLD_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
_OLD_REGION_LABEL = "failure-domain.beta.kubernetes.io/region"


class CacheError(Exception):
    """An inconsistent cache operation (pod already assumed, unknown pod/node...)."""


def _name(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name") or ""


_pod_key = pod_key


def _pod_node(pod: Obj) -> str:
    return (pod.get("spec") or {}).get("nodeName") or ""


def _pod_ref(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}({meta.get('uid') or ''})"


def zone_key(node: Obj) -> str:
    """Region and zone of a node joined as upstream (empty when unlabelled)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    region = labels.get(REGION_LABEL) or labels.get(_OLD_REGION_LABEL) or ""
    zone = labels.get(ZONE_LABEL) or labels.get(_OLD_ZONE_LABEL) or ""
    if not region and not zone:
        return ""
    return region + ":\x00:" + zone


class NodeTree:
    """Node names grouped by zone; ``list()`` interleaves zones round-robin."""

    def __init__(self) -> None:
        self.tree: dict[str, list[str]] = {}
        self.zones: list[str] = []
        self.num_nodes = 0

    def add_node(self, node: Obj) -> None:
        zone, name = zone_key(node), _name(node)
        names = self.tree.get(zone)
        if names is None:
            self.tree[zone] = [name]
            self.zones.append(zone)
        elif name in names:
            return
        else:
            names.append(name)
        self.num_nodes += 1

    def remove_node(self, node: Obj) -> bool:
        zone, name = zone_key(node), _name(node)
        names = self.tree.get(zone)
        if names is None or name not in names:
            return False
        names.remove(name)
        if not names:
            del self.tree[zone]
            self.zones.remove(zone)
        self.num_nodes -= 1
        return True

    def update_node(self, old: Obj | None, new: Obj) -> None:
        if old is not None and zone_key(old) == zone_key(new):
            return
        if old is not None:
            self.remove_node(old)
        self.add_node(new)

    def list(self) -> list[str]:
        if len(self.zones) == 1:
            return list(self.tree[self.zones[0]])
        out: list[str] = []
        lists = [self.tree[z] for z in self.zones]
        i = 0
        while len(out) < self.num_nodes:
            for names in lists:
                if i < len(names):
                    out.append(names[i])
            i += 1
        return out


class Snapshot:
    """A consistent view of the cache for one scheduling cycle."""

    def __init__(self, node_infos: list[NodeInfo] | None = None) -> None:
        self.node_info_map: dict[str, NodeInfo] = {}
        self.node_info_list: list[NodeInfo] = []
        self.have_pods_with_affinity_list: list[NodeInfo] = []
        self.have_pods_with_required_anti_affinity_list: list[NodeInfo] = []
        self.used_pvc_set: set[str] = set()
        #: bumped whenever a NodeInfo's Node object is replaced (labels may have changed)
        self.node_objects_version = 0
        #: PVC key -> number of nodes whose pods use it (``used_pvc_set`` = its keys)
        self._pvc_nodes: dict[str, int] = {}
        self.generation = 0
        # Column arrays for the vectorised Filter/Score (built lazily by
        # ``fastpath.arrays_for``) and names of NodeInfos changed since.
        self.fast_arrays: Any = None
        self.fast_changed: set[str] = set()
        for ni in node_infos or ():
            self.node_info_map[ni.name] = ni
        if node_infos:
            self._rebuild_lists([ni.name for ni in node_infos])

    @classmethod
    def from_objects(cls, nodes: list[Obj], pods: list[Obj]) -> "Snapshot":
        """A snapshot built directly from node and (assigned) pod objects, for tests and tools."""
        infos = {(_name(n)): NodeInfo(n) for n in nodes}
        for p in pods:
            ni = infos.get(_pod_node(p))
            if ni is not None:
                ni.add_pod(p)
        return cls(list(infos.values()))

    def _rebuild_lists(self, order: list[str]) -> None:
        self.node_info_list = [self.node_info_map[n] for n in order if n in self.node_info_map]
        self._rebuild_affinity_lists()
        self._rebuild_pvcs()

    def _rebuild_affinity_lists(self) -> None:
        self.have_pods_with_affinity_list = [ni for ni in self.node_info_list if ni.pods_with_affinity]
        self.have_pods_with_required_anti_affinity_list = [
            ni for ni in self.node_info_list if ni.pods_with_required_anti_affinity
        ]

    def _rebuild_pvcs(self) -> None:
        counts: dict[str, int] = {}
        for ni in self.node_info_list:
            for key in ni.pvc_ref_counts:
                counts[key] = counts.get(key, 0) + 1
        self._pvc_nodes = counts
        self.used_pvc_set = set(counts)

    def _update_pvcs(self, old_keys: Any, new_keys: Any) -> None:
        """One node's PVC keys changed from ``old_keys`` to ``new_keys``."""
        counts, used = self._pvc_nodes, self.used_pvc_set
        for key in old_keys - new_keys:
            n = counts.get(key, 0) - 1
            if n <= 0:
                counts.pop(key, None)
                used.discard(key)
            else:
                counts[key] = n
        for key in new_keys - old_keys:
            counts[key] = counts.get(key, 0) + 1
            used.add(key)

    def get(self, node_name: str) -> NodeInfo:
        ni = self.node_info_map.get(node_name)
        if ni is None or ni.node is None:
            raise KeyError(f"nodeinfo not found for node name {node_name!r}")
        return ni

    def num_nodes(self) -> int:
        return len(self.node_info_list)

    def is_pvc_used_by_pods(self, key: str) -> bool:
        return key in self.used_pvc_set


class _PodState:
    __slots__ = ("pod", "deadline", "binding_finished")

    def __init__(self, pod: Obj) -> None:
        self.pod = pod
        self.deadline: float | None = None
        self.binding_finished = False


class Cache:
    """Scheduler cache (see module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = 0.0) -> None:
        self.clock = clock
        self.ttl = ttl
        # Most recently changed node last.
        self._nodes: OrderedDict[str, NodeInfo] = OrderedDict()
        self._pod_states: dict[str, _PodState] = {}
        self._assumed: set[str] = set()
        self._image_states: dict[str, ImageStateSummary] = {}
        self.node_tree = NodeTree()

    # ------------------------------------------------------------------ nodes

    def _touch(self, name: str) -> None:
        self._nodes.move_to_end(name)

    def _node_info(self, name: str) -> NodeInfo:
        ni = self._nodes.get(name)
        if ni is None:
            ni = NodeInfo()
            ni.name = name
            self._nodes[name] = ni
        return ni

    def add_node(self, node: Obj) -> NodeInfo:
        name = _name(node)
        ni = self._nodes.get(name)
        if ni is None:
            ni = self._node_info(name)
        if ni.node is not None:
            self._remove_images(ni)
            self.node_tree.update_node(ni.node, node)
        else:
            self.node_tree.add_node(node)
        self._touch(name)
        ni.set_node(node)
        self._add_images(node, ni)
        return ni.clone()

    def update_node(self, old: Obj | None, new: Obj) -> NodeInfo:
        name = _name(new)
        ni = self._nodes.get(name)
        if ni is None:
            ni = self._node_info(name)
            self.node_tree.add_node(new)
        else:
            if ni.node is not None:
                self._remove_images(ni)
            self.node_tree.update_node(ni.node if ni.node is not None else old, new)
        self._touch(name)
        ni.set_node(new)
        self._add_images(new, ni)
        return ni.clone()

    def remove_node(self, node: Obj) -> None:
        name = _name(node)
        ni = self._nodes.get(name)
        if ni is None:
            raise CacheError(f"node {name} is not found")
        current = ni.node or node
        self._remove_images(ni)
        ni.remove_node()
        if not ni.pods:
            del self._nodes[name]
        else:
            self._touch(name)
        self.node_tree.remove_node(current)

    def _add_images(self, node: Obj, ni: NodeInfo) -> None:
        states: dict[str, ImageStateSummary] = {}
        for image in (node.get("status") or {}).get("images") or ():
            size = int(image.get("sizeBytes") or 0)
            for nm in image.get("names") or ():
                st = self._image_states.get(nm)
                if st is None:
                    st = self._image_states[nm] = ImageStateSummary(size)
                st.nodes.add(ni.name)
                states[nm] = st
        ni.image_states = states

    def _remove_images(self, ni: NodeInfo) -> None:
        for nm, st in ni.image_states.items():
            st.nodes.discard(ni.name)
            if not st.nodes:
                self._image_states.pop(nm, None)
        ni.image_states = {}

    def node_count(self) -> int:
        return self.node_tree.num_nodes

    # ------------------------------------------------------------------ pods

    def _add_pod(self, pod: Obj, info: PodInfo | None = None) -> None:
        name = _pod_node(pod)
        ni = self._node_info(name)
        ni.add_pod(info if info is not None else PodInfo(pod))
        self._touch(name)

    def _remove_pod(self, pod: Obj) -> PodInfo:
        name = _pod_node(pod)
        ni = self._nodes.get(name)
        if ni is None:
            raise CacheError(f"node {name} not found when trying to remove pod {_pod_ref(pod)}")
        try:
            removed = ni.remove_pod(pod)
        except KeyError as e:
            raise CacheError(str(e)) from None
        if not ni.pods and ni.node is None:
            del self._nodes[name]
        else:
            self._touch(name)
        return removed

    def _update_pod(self, old: Obj, new: Obj) -> None:
        removed = self._remove_pod(old)
        # A new version with the same spec (a confirmed assumed pod, a status
        # update) keeps what was derived from the spec.
        self._add_pod(new, removed.for_version(new))

    def assume_pod(self, pod: Obj, info: PodInfo | None = None) -> None:
        """Add a pod (with ``spec.nodeName`` set) before it is bound; ``info``, when
        given, is its PodInfo."""
        key = _pod_key(pod)
        if key in self._pod_states:
            raise CacheError(f"pod {_pod_ref(pod)} is in the cache, so can't be assumed")
        self._add_pod(pod, info)
        self._pod_states[key] = _PodState(pod)
        self._assumed.add(key)

    def finish_binding(self, pod: Obj) -> None:
        """Binding ended; start the expiry clock (no expiry with ``ttl == 0``)."""
        key = _pod_key(pod)
        st = self._pod_states.get(key)
        if st is not None and key in self._assumed:
            st.deadline = None if self.ttl == 0 else self.clock() + self.ttl
            st.binding_finished = True

    def forget_pod(self, pod: Obj) -> None:
        key = _pod_key(pod)
        st = self._pod_states.get(key)
        if st is not None and _pod_node(st.pod) != _pod_node(pod):
            raise CacheError(
                f"pod {_pod_ref(pod)} was assumed on {_pod_node(pod)} but assigned to {_pod_node(st.pod)}"
            )
        if st is None or key not in self._assumed:
            raise CacheError(f"pod {_pod_ref(pod)} wasn't assumed so cannot be forgotten")
        self._remove_pod(st.pod)
        del self._pod_states[key]
        self._assumed.discard(key)

    def is_assumed(self, pod: Obj) -> bool:
        return _pod_key(pod) in self._assumed

    def get_pod(self, pod: Obj) -> Obj:
        st = self._pod_states.get(_pod_key(pod))
        if st is None:
            raise CacheError(f"pod {_pod_ref(pod)} does not exist in scheduler cache")
        return st.pod

    def add_pod(self, pod: Obj) -> None:
        """Informer Add of an assigned pod; confirms an assumed pod."""
        key = _pod_key(pod)
        st = self._pod_states.get(key)
        if st is not None and key in self._assumed:
            self._update_pod(st.pod, pod)
            self._assumed.discard(key)
            st.deadline = None
            st.pod = pod
        elif st is None:
            self._add_pod(pod)
            self._pod_states[key] = _PodState(pod)
        else:
            raise CacheError(f"pod {_pod_ref(pod)} was already in added state")

    def update_pod(self, old: Obj, new: Obj) -> None:
        key = _pod_key(old)
        st = self._pod_states.get(key)
        if st is None or key in self._assumed:
            raise CacheError(f"pod {_pod_ref(old)} is not added to scheduler cache, so cannot be updated")
        if _pod_node(st.pod) != _pod_node(new):
            raise CacheError(
                f"pod {_pod_ref(old)} updated on a different node than previously added to"
            )
        self._update_pod(st.pod, new)
        st.pod = new

    def remove_pod(self, pod: Obj) -> None:
        key = _pod_key(pod)
        st = self._pod_states.get(key)
        if st is None:
            raise CacheError(f"pod {_pod_ref(pod)} is not found in scheduler cache, so cannot be removed from it")
        if _pod_node(st.pod) != _pod_node(pod) and _pod_node(pod):
            raise CacheError(f"pod {_pod_ref(pod)} was assumed on {_pod_node(st.pod)} but removed from {_pod_node(pod)}")
        self._remove_pod(st.pod)
        del self._pod_states[key]
        self._assumed.discard(key)

    def cleanup_assumed_pods(self, now: float | None = None) -> list[Obj]:
        """Drop assumed pods whose binding finished and whose deadline passed."""
        now = self.clock() if now is None else now
        expired: list[Obj] = []
        for key in list(self._assumed):
            st = self._pod_states[key]
            if not st.binding_finished or st.deadline is None or now <= st.deadline:
                continue
            self._remove_pod(st.pod)
            del self._pod_states[key]
            self._assumed.discard(key)
            expired.append(st.pod)
        return expired

    def sizes(self) -> tuple[int, int, int]:
        """Nodes, pods and assumed pods held (scheduler_scheduler_cache_size)."""
        return len(self._nodes), len(self._pod_states), len(self._assumed)

    def pod_count(self) -> int:
        return sum(len(ni.pods) for ni in self._nodes.values())

    # ------------------------------------------------------------------ snapshot

    def update_snapshot(self, snapshot: Snapshot) -> None:
        """Bring ``snapshot`` up to date, copying only NodeInfos changed since its generation."""
        gen = snapshot.generation
        update_all = False
        update_affinity = False
        update_pvcs = False
        changed_pvcs: list[tuple[set[str], set[str]]] = []
        for name in reversed(self._nodes):
            ni = self._nodes[name]
            if ni.generation <= gen:
                break
            if ni.node is None:
                continue
            existing = snapshot.node_info_map.get(name)
            if existing is None:
                update_all = True
                snapshot.node_info_map[name] = ni.clone()
                update_affinity = True
                update_pvcs = True
                continue
            if snapshot.fast_arrays is not None:
                snapshot.fast_changed.add(name)
            if bool(existing.pods_with_affinity) != bool(ni.pods_with_affinity) or bool(
                existing.pods_with_required_anti_affinity
            ) != bool(ni.pods_with_required_anti_affinity):
                update_affinity = True
            if existing.node is not ni.node:
                snapshot.node_objects_version += 1
            old_keys, new_keys = existing.pvc_ref_counts.keys(), ni.pvc_ref_counts.keys()
            if old_keys != new_keys:
                changed_pvcs.append((set(old_keys), set(new_keys)))
            ni.copy_into(existing)
        if self._nodes:
            snapshot.generation = self._nodes[next(reversed(self._nodes))].generation
        if len(snapshot.node_info_map) > self.node_tree.num_nodes:
            live = {n for n, ni in self._nodes.items() if ni.node is not None}
            for n in [n for n in snapshot.node_info_map if n not in live]:
                del snapshot.node_info_map[n]
            update_all = True
        if update_all:
            snapshot._rebuild_lists(self.node_tree.list())
        else:
            if update_affinity:
                snapshot._rebuild_affinity_lists()
            if update_pvcs:
                snapshot._rebuild_pvcs()
            else:
                for old_keys, new_keys in changed_pvcs:
                    snapshot._update_pvcs(old_keys, new_keys)
        if len(snapshot.node_info_list) != self.node_tree.num_nodes:
            snapshot._rebuild_lists(self.node_tree.list())

    def snapshot(self) -> Snapshot:
        """A new, fully built snapshot."""
        s = Snapshot()
        self.update_snapshot(s)
        return s

    # ------------------------------------------------------------------ debugging

    def dump(self) -> dict[str, Any]:
        """Nodes with their pods and the assumed pods, for logs and debugging."""
        return {
            "nodes": {
                name: {
                    "present": ni.node is not None,
                    "generation": ni.generation,
                    "requested": dict(ni.requested),
                    "allocatable": dict(ni.allocatable),
                    "pods": [f"{p.namespace}/{p.name}" for p in ni.pods],
                }
                for name, ni in self._nodes.items()
            },
            "assumed_pods": sorted(self._assumed),
        }
