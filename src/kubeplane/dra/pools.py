"""Resource pools as the structured allocator sees them for one node.

A pool is identified by (driver, pool name). Only slices of the pool's highest
generation count; the pool is complete when that generation has
``resourceSliceCount`` slices, and invalid when a device name repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from kubeplane.api.nodeselector import NodeSelector

Obj = dict[str, Any]

__all__ = ["DeviceID", "Pool", "PoolIndex", "gather_pools", "slice_matches_node"]


class DeviceID(NamedTuple):
    """A device, unique in the cluster: (driver, pool, device).

    A named tuple: immutable, ordered, and hashed in C (hot in allocation)."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(slots=True)
class Pool:
    """The slices of one pool that target a node, at the pool's newest generation."""

    driver: str
    name: str
    generation: int
    slices: list[Obj] = field(default_factory=list)
    is_incomplete: bool = False
    is_invalid: bool = False
    invalid_reason: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.name)


def _spec(s: Mapping[str, Any]) -> Mapping[str, Any]:
    return s.get("spec") or {}


def _pool_key(s: Mapping[str, Any]) -> tuple[str, str]:
    spec = _spec(s)
    return (spec.get("driver") or "", (spec.get("pool") or {}).get("name") or "")


def _generation(s: Mapping[str, Any]) -> int:
    return int((_spec(s).get("pool") or {}).get("generation") or 0)


def _slice_count(s: Mapping[str, Any]) -> int:
    return int((_spec(s).get("pool") or {}).get("resourceSliceCount") or 0)


def uses_disabled_features(s: Mapping[str, Any], partitionable_devices: bool = False) -> bool:
    """Slices needing the partitionable-devices feature are skipped while it is off."""
    spec = _spec(s)
    if partitionable_devices:
        return False
    return bool(spec.get("perDeviceNodeSelection")) or bool(spec.get("sharedCounters"))


_selector_cache: dict[int, tuple[Mapping[str, Any], NodeSelector]] = {}


def _node_selector(sel: Mapping[str, Any]) -> NodeSelector:
    hit = _selector_cache.get(id(sel))
    if hit is not None and hit[0] is sel:
        return hit[1]
    ns = NodeSelector(sel)
    if len(_selector_cache) > 10000:
        _selector_cache.clear()
    _selector_cache[id(sel)] = (sel, ns)
    return ns


def slice_matches_node(s: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Does the slice make its devices available on ``node``? A slice with no
    node-selection field is ignored (an unknown future extension)."""
    spec = _spec(s)
    node_name = spec.get("nodeName")
    if node_name:
        return node_name == ((node.get("metadata") or {}).get("name") or "")
    if spec.get("allNodes"):
        return True
    sel = spec.get("nodeSelector")
    if sel:
        return _node_selector(sel).matches(node)  # type: ignore[arg-type]
    return False


class PoolIndex:
    """All slices grouped by pool, built once and used for many nodes.

    The index keeps references to its slices, so ``id()`` of a slice is stable
    for its lifetime. ``cache`` is free for consumers to memoize per-node or
    per-slice data derived from this exact set of slices."""

    def __init__(self, slices: Iterable[Obj], *, partitionable_devices: bool = False) -> None:
        self.slices: list[Obj] = list(slices)
        self.by_pool: dict[tuple[str, str], list[Obj]] = {}
        # Pools that may target a node: by nodeName, or any node (selectors, allNodes).
        self._by_node: dict[str, dict[tuple[str, str], None]] = {}
        self._any_node: dict[tuple[str, str], None] = {}
        self._order: dict[tuple[str, str], int] = {}
        self._by_node_pools: dict[str, list[Pool]] = {}
        self.cache: dict[Any, Any] = {}
        for s in self.slices:
            if uses_disabled_features(s, partitionable_devices):
                continue
            key = _pool_key(s)
            if key not in self.by_pool:
                self._order[key] = len(self._order)
                self.by_pool[key] = []
            self.by_pool[key].append(s)
            node_name = _spec(s).get("nodeName")
            if node_name:
                self._by_node.setdefault(node_name, {})[key] = None
            else:
                self._any_node[key] = None

    @property
    def per_node_name(self) -> bool:
        """True when a node's pools depend on its name only (no selector or
        allNodes slice exists), so per-node results may be memoized by name."""
        return not self._any_node

    def pools_for_node(self, node: Mapping[str, Any]) -> list[Pool]:
        """Pools with at least one slice targeting ``node``, in first-appearance order.

        Callers must not mutate the returned pools."""
        node_name = (node.get("metadata") or {}).get("name") or ""
        if not self._any_node:
            hit = self._by_node_pools.get(node_name)
            if hit is None:
                hit = self._by_node_pools[node_name] = self._compute(node, node_name)
            return hit
        return self._compute(node, node_name)

    def _compute(self, node: Mapping[str, Any], node_name: str) -> list[Pool]:
        out: list[Pool] = []
        candidates = set(self._by_node.get(node_name, ())) | set(self._any_node)
        for key in sorted(candidates, key=self._order.__getitem__):
            driver, name = key
            all_slices = self.by_pool[key]
            mine = [s for s in all_slices if slice_matches_node(s, node)]
            if not mine:
                continue
            gen = max(_generation(s) for s in mine)
            kept = [s for s in mine if _generation(s) == gen]
            pool = Pool(driver, name, gen, kept)
            if len(kept) != _slice_count(kept[0]):
                newest = max(_generation(s) for s in all_slices)
                if newest > gen:
                    continue  # obsolete: a newer generation exists elsewhere
                at_gen = sum(1 for s in all_slices if _generation(s) == gen)
                if at_gen != _slice_count(kept[0]):
                    pool.is_incomplete = True
                    pool.slices = []
            if not pool.is_incomplete:
                seen: set[str] = set()
                for s in pool.slices:
                    for d in _spec(s).get("devices") or ():
                        dname = d.get("name") or ""
                        if dname in seen:
                            pool.is_invalid = True
                            pool.invalid_reason = f"duplicate device name {dname}"
                            break
                        seen.add(dname)
                    if pool.is_invalid:
                        break
            out.append(pool)
        return out


def gather_pools(slices: Iterable[Obj], node: Mapping[str, Any], *, partitionable_devices: bool = False) -> list[Pool]:
    """The pools available on ``node`` (incomplete and invalid ones included, flagged)."""
    return PoolIndex(slices, partitionable_devices=partitionable_devices).pools_for_node(node)
