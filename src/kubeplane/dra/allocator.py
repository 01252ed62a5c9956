"""The structured allocator: choose devices for a pod's claims on one node.

Follows upstream's ``dynamic-resource-allocation/structured`` (stable
semantics): depth-first search with backtracking over claims, requests,
firstAvailable alternatives and device slots; ``matchAttribute``
constraints; ``All`` mode; admin access; already-allocated devices excluded.

An :class:`Allocator` is built once per scheduling attempt and used for every
node. Selector results are memoized per (device, request alternative) for the
allocator's lifetime, and optionally across allocators in a
:class:`DeviceMatchCache`, so a device's CEL verdict is computed once. A
:class:`~kubeplane.dra.pools.PoolIndex` may be shared by allocators built on
the same slices; per-node device lists are then memoized in it. Allocation
results are built only for the node finally chosen
(:meth:`Allocator.explain_deferred`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Iterable, Mapping

import orjson

from kubeplane.dra.cel import CELCompileError, CELRuntimeError, CompiledSelector, DeviceEnv, compile_selector
from kubeplane.dra.pools import DeviceID, Pool, PoolIndex

Obj = dict[str, Any]
AllocationResult = dict[str, Any]

__all__ = [
    "AllocationError",
    "AllocationResult",
    "Allocator",
    "DeviceMatchCache",
    "DeferredAllocation",
    "Features",
    "NodeAllocationError",
    "REASON_CANNOT_ALLOCATE",
    "RESULTS_MAX_SIZE",
    "claim_device_ids",
]

RESULTS_MAX_SIZE = 32
REASON_CANNOT_ALLOCATE = "cannot allocate all claims"
EXACT_COUNT = "ExactCount"
ALL = "All"


class AllocationError(Exception):
    """A problem with the claims, classes or selectors: fatal for the whole attempt."""


class NodeAllocationError(Exception):
    """Allocation failed on this node for a node-specific reason (e.g. invalid pools)."""


@dataclass(frozen=True, slots=True)
class Features:
    """Feature switches the allocator honours."""

    admin_access: bool = True
    prioritized_list: bool = True


def claim_device_ids(claim: Mapping[str, Any], include_admin: bool = False) -> list[DeviceID]:
    """DeviceIDs of an allocated claim (admin-access results skipped unless asked)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    out: list[DeviceID] = []
    for r in (alloc.get("devices") or {}).get("results") or ():
        if r.get("adminAccess") and not include_admin:
            continue
        out.append(DeviceID(r.get("driver", ""), r.get("pool", ""), r.get("device", "")))
    return out


class DeviceMatchCache:
    """Selector verdicts shared across allocators, keyed by expression and a
    device's identity within a slice version (uid + resourceVersion)."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self._envs: dict[tuple[Any, ...], DeviceEnv] = {}
        self._results: dict[tuple[Any, ...], tuple[bool, str]] = {}
        # (all selector expressions of a request, device key) -> verdict
        self._combined: dict[tuple[Any, ...], tuple[bool, str]] = {}

    def env(self, key: tuple[Any, ...], driver: str, device: Mapping[str, Any]) -> DeviceEnv:
        env = self._envs.get(key)
        if env is None:
            if len(self._envs) >= self.max_entries:
                self._envs.clear()
            env = self._envs[key] = DeviceEnv(driver, device)
        return env

    def get(self, key: tuple[Any, ...]) -> tuple[bool, str] | None:
        return self._results.get(key)

    def put(self, key: tuple[Any, ...], value: tuple[bool, str]) -> None:
        if len(self._results) >= self.max_entries:
            self._results.clear()
        self._results[key] = value

    def get_combined(self, key: tuple[Any, ...]) -> tuple[bool, str] | None:
        """The verdict of a whole selector list for one device, if known."""
        return self._combined.get(key)

    def put_combined(self, key: tuple[Any, ...], value: tuple[bool, str]) -> None:
        if len(self._combined) >= self.max_entries:
            self._combined.clear()
        self._combined[key] = value


# ------------------------------------------------------------------ model


@dataclass(slots=True)
class _Alt:
    """One way to satisfy a request: the request itself or one firstAvailable subrequest."""

    result_name: str  # "req" or "req/sub"
    parent: str
    class_name: str
    device_class: Mapping[str, Any]
    selectors: list[CompiledSelector]  # class selectors first, then the request's
    mode: str
    count: int
    admin: bool
    tolerations: list[Any] | None
    memo_id: int = 0
    sel_key: tuple[str, ...] = ()


@dataclass(slots=True)
class _Request:
    name: str
    alts: list[_Alt]


@dataclass(slots=True)
class _Constraint:
    requests: frozenset[str]
    attribute: str
    value: Any = None
    count: int = 0

    def applies(self, alt: _Alt) -> bool:
        if not self.requests:
            return True
        return alt.result_name in self.requests or alt.parent in self.requests

    def add(self, alt: _Alt, dev: "_Device") -> bool:
        if not self.applies(alt):
            return True
        value = dev.attribute(self.attribute)
        if value is None:
            return False
        if self.count == 0:
            self.value = value
        elif value != self.value:
            return False
        self.count += 1
        return True

    def remove(self, alt: _Alt) -> None:
        if self.applies(alt):
            self.count -= 1


@dataclass(slots=True)
class _Claim:
    obj: Obj
    requests: list[_Request]
    constraints: list[_Constraint]
    configs: list[Any]


@dataclass(slots=True)
class _Device:
    id: DeviceID
    obj: Mapping[str, Any]
    slice: Mapping[str, Any]
    key: tuple[Any, ...]
    shared_key: tuple[Any, ...] | None

    def attribute(self, qualified: str) -> tuple[str, Any] | None:
        attrs = self.obj.get("attributes") or {}
        attr = attrs.get(qualified)
        if attr is None:
            domain, _, name = qualified.partition("/")
            if domain == self.id.driver and name:
                attr = attrs.get(name)
        if not isinstance(attr, Mapping):
            return None
        for kind in ("int", "bool", "string", "version"):
            if kind in attr:
                return (kind, attr[kind])
        return None


@dataclass(slots=True)
class _Chosen:
    alt: _Alt
    dev: _Device


@dataclass
class _Search:
    """Per-call state of one allocation on one node."""

    node: Mapping[str, Any]
    devices: list[_Device]
    pools: list[Pool]
    all_lists: dict[tuple[int, int, int], list[_Device]] = field(default_factory=dict)
    chosen: list[list[_Chosen]] = field(default_factory=list)
    alt_index: dict[tuple[int, int], int] = field(default_factory=dict)
    # device -> claim indices holding it (non-admin / admin)
    taken: dict[DeviceID, int] = field(default_factory=dict)
    admin_taken: dict[DeviceID, set[int]] = field(default_factory=dict)
    constraints: list[list[_Constraint]] = field(default_factory=list)


# --------------------------------------------------------------- allocator


class Allocator:
    """Allocates devices for ``claims_to_allocate`` on one node at a time."""

    def __init__(
        self,
        claims_to_allocate: list[Obj],
        allocated_devices: AbstractSet[DeviceID],
        classes: Mapping[str, Mapping[str, Any]],
        slices: Iterable[Obj],
        features: Features = Features(),
        *,
        match_cache: DeviceMatchCache | None = None,
        pool_index: PoolIndex | None = None,
    ) -> None:
        """``pool_index``, when given, replaces ``slices`` (it must index the
        slices to allocate from; it is shared and memoizes per-node data)."""
        self.features = features
        self.allocated = allocated_devices
        self.classes = classes
        self.match_cache = match_cache
        self._pool_index = pool_index if pool_index is not None else PoolIndex(slices)
        self.slices = self._pool_index.slices
        self._memo: dict[tuple[int, int], tuple[bool, str]] = {}
        self._envs: dict[int, DeviceEnv] = {}
        self._alt_counter = 0
        self.cel_errors: dict[DeviceID, str] = {}
        self.claims = [self._prepare_claim(c) for c in claims_to_allocate]
        self._simple = self._simple_alt()

    @property
    def pool_index(self) -> PoolIndex:
        """The pool index this allocator allocates from."""
        return self._pool_index

    def shape_key(self) -> tuple[Any, ...] | None:
        """A key such that allocators with equal keys, on the same pool index
        and allocated devices, reach the same verdict (success, or failure
        with the same reason) on every node; None when not computable.

        It covers the claims' device requests and constraints, the selectors
        of their classes and the feature switches; claim names, UIDs and
        configs do not change which devices fit."""
        if self._simple is not None:
            alt = self._simple
            return ("simple", alt.sel_key, alt.count)
        specs = [(c.obj.get("spec") or {}).get("devices") or {} for c in self.claims]
        try:
            blob = orjson.dumps(specs, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return None
        sels = tuple(alt.sel_key for c in self.claims for r in c.requests for alt in r.alts)
        return ("general", self.features, blob, sels)

    def _simple_alt(self) -> _Alt | None:
        """The only request when the whole search is one ExactCount request of
        one claim without constraints or admin access: then the first ``count``
        free, matching devices in list order are exactly what the search finds."""
        if len(self.claims) != 1:
            return None
        claim = self.claims[0]
        if len(claim.requests) != 1 or claim.constraints or len(claim.requests[0].alts) != 1:
            return None
        alt = claim.requests[0].alts[0]
        if alt.mode != EXACT_COUNT or alt.admin or alt.count > RESULTS_MAX_SIZE:
            return None
        return alt

    # ---------------------------------------------------------- preparation

    def _prepare_claim(self, claim: Obj) -> _Claim:
        devices = (claim.get("spec") or {}).get("devices") or {}
        requests: list[_Request] = []
        min_total = 0
        for req in devices.get("requests") or ():
            name = req.get("name") or ""
            if req.get("firstAvailable"):
                if not self.features.prioritized_list:
                    raise AllocationError(f"claim {_cname(claim)}, request {name}: has subrequests, but the DRAPrioritizedList feature is disabled")
                alts = [self._prepare_alt(claim, f"{name}/{sub.get('name', '')}", name, sub, False) for sub in req["firstAvailable"]]
            elif req.get("exactly") is not None:
                alts = [self._prepare_alt(claim, name, name, req["exactly"], True)]
            else:
                raise AllocationError(f"claim {_cname(claim)}, request {name}: unsupported request type")
            min_total += min(a.count if a.mode == EXACT_COUNT else 1 for a in alts)
            requests.append(_Request(name, alts))
        if min_total > RESULTS_MAX_SIZE:
            raise AllocationError(
                f"claim {_cname(claim)}: number of requested devices {min_total} exceeds the claim limit of {RESULTS_MAX_SIZE}"
            )
        constraints: list[_Constraint] = []
        for c in devices.get("constraints") or ():
            attr = c.get("matchAttribute")
            if not attr:
                raise AllocationError(f"claim {_cname(claim)}: empty constraint (unsupported constraint type?)")
            constraints.append(_Constraint(frozenset(c.get("requests") or ()), attr))
        return _Claim(claim, requests, constraints, list(devices.get("config") or ()))

    def _prepare_alt(self, claim: Obj, result_name: str, parent: str, spec: Mapping[str, Any], allow_admin: bool) -> _Alt:
        where = f"claim {_cname(claim)}, request {result_name}"
        admin = spec.get("adminAccess")
        if admin is not None and not self.features.admin_access:
            raise AllocationError(f"{where}: admin access is requested, but the feature is disabled")
        class_name = spec.get("deviceClassName") or ""
        if not class_name:
            raise AllocationError(f"{where}: missing device class name (unsupported request type?)")
        dc = self.classes.get(class_name)
        if dc is None:
            raise AllocationError(f"{where}: could not retrieve device class {class_name}")
        selectors: list[CompiledSelector] = []
        for source, sels in (("class " + class_name, (dc.get("spec") or {}).get("selectors")), (where, spec.get("selectors"))):
            for sel in sels or ():
                expr = (sel.get("cel") or {}).get("expression")
                if not expr:
                    raise AllocationError(f"{source}: CEL expression empty (unsupported selector type?)")
                try:
                    selectors.append(compile_selector(expr))
                except CELCompileError as err:
                    raise AllocationError(f"{source}: selector #{len(selectors)}: CEL compile error: {err.message}") from None
        mode = spec.get("allocationMode") or EXACT_COUNT
        if mode == EXACT_COUNT:
            count = int(spec.get("count") or 1)
        elif mode == ALL:
            count = 0
        else:
            raise AllocationError(f"{where}: unsupported count mode {mode}")
        self._alt_counter += 1
        return _Alt(result_name, parent, class_name, dc, selectors, mode, count,
                    bool(admin) and allow_admin, spec.get("tolerations"), self._alt_counter,
                    tuple(sel.expression for sel in selectors))

    # ------------------------------------------------------------- selection

    def _node_device_list(self, node: Mapping[str, Any], pools: list[Pool]) -> list[_Device]:
        """The usable devices of ``pools``, memoized per node name in the pool index when possible."""
        index = self._pool_index
        if not index.per_node_name:
            return self._devices_for(pools)
        key = ("node-devices", (node.get("metadata") or {}).get("name") or "")
        devs = index.cache.get(key)
        if devs is None:
            devs = index.cache[key] = self._devices_for(pools)
        return devs

    def _devices_for(self, pools: list[Pool]) -> list[_Device]:
        out: list[_Device] = []
        # Slices are kept alive by the pool index, so their ids are stable.
        slice_cache = self._pool_index.cache
        for pool in pools:
            if pool.is_incomplete or pool.is_invalid:
                continue
            for s in pool.slices:
                ckey = ("slice-devices", id(s), pool.driver, pool.name)
                cached = slice_cache.get(ckey)
                if cached is None:
                    cached = []
                    meta = s.get("metadata") or {}
                    uid, rv = meta.get("uid"), meta.get("resourceVersion")
                    for d in (s.get("spec") or {}).get("devices") or ():
                        if d.get("consumesCounters"):
                            continue  # partitionable devices are not supported
                        did = DeviceID(pool.driver, pool.name, d.get("name") or "")
                        shared = (uid, rv, did.device) if uid and rv else None
                        cached.append(_Device(did, d, s, (id(s), did.device), shared))
                    slice_cache[ckey] = cached
                out.extend(cached)
        return out

    def _selectable(self, dev: _Device, alt: _Alt) -> bool:
        mc = self.match_cache
        if mc is not None and dev.shared_key is not None:
            ckey = (alt.sel_key, dev.shared_key)
            hit = mc.get_combined(ckey)
            if hit is None:
                hit = self._evaluate(dev, alt)
                mc.put_combined(ckey, hit)
        else:
            memo_key = (id(dev.obj), alt.memo_id)
            hit = self._memo.get(memo_key)
            if hit is None:
                hit = self._evaluate(dev, alt)
                self._memo[memo_key] = hit
        if not hit[0] and hit[1]:
            self.cel_errors.setdefault(dev.id, hit[1])
        return hit[0]

    def _env(self, dev: _Device) -> DeviceEnv:
        if self.match_cache is not None and dev.shared_key is not None:
            return self.match_cache.env(dev.shared_key, dev.id.driver, dev.obj)
        env = self._envs.get(id(dev.obj))
        if env is None:
            env = self._envs[id(dev.obj)] = DeviceEnv(dev.id.driver, dev.obj)
        return env

    def _evaluate(self, dev: _Device, alt: _Alt) -> tuple[bool, str]:
        env: DeviceEnv | None = None
        for sel in alt.selectors:
            shared = None
            if self.match_cache is not None and dev.shared_key is not None:
                shared = (sel.expression, dev.shared_key)
                cached = self.match_cache.get(shared)
                if cached is not None:
                    if not cached[0]:
                        return cached
                    continue
            if env is None:
                env = self._env(dev)
            try:
                verdict = (sel.matches(env), "")
            except CELRuntimeError as err:
                verdict = (False, f"device {dev.id}: CEL runtime error: {err.message}")
            if shared is not None:
                self.match_cache.put(shared, verdict)  # type: ignore[union-attr]
            if not verdict[0]:
                return verdict
        return (True, "")

    # ---------------------------------------------------------------- search

    def allocate(self, node: Mapping[str, Any]) -> list[AllocationResult] | None:
        """One result per claim (input order), or ``None`` when no solution exists.

        Raises :class:`AllocationError` (fatal) or :class:`NodeAllocationError`."""
        deferred = self.allocate_deferred(node)
        return None if deferred is None else deferred.results()

    def allocate_deferred(self, node: Mapping[str, Any]) -> "DeferredAllocation | None":
        """Like :meth:`allocate`, but the results are built on demand."""
        if not self.claims:
            return DeferredAllocation(self, None)
        pools = self._pool_index.pools_for_node(node)
        if self._simple is not None:
            return self._allocate_simple(node, pools, self._simple)
        search = _Search(node, self._node_device_list(node, pools), pools)
        search.chosen = [[] for _ in self.claims]
        search.constraints = [[_Constraint(c.requests, c.attribute) for c in cl.constraints] for cl in self.claims]
        for ci, claim in enumerate(self.claims):
            for ri, req in enumerate(claim.requests):
                for ai, alt in enumerate(req.alts):
                    if alt.mode == ALL:
                        search.all_lists[(ci, ri, ai)] = self._all_devices(pools, search, alt)
        if self._solve(search, 0, 0):
            return DeferredAllocation(self, search)
        bad = [p for p in pools if p.is_invalid]
        if bad:
            raise NodeAllocationError(
                "invalid resource pools were encountered: "
                + ", ".join(f"{p.driver}/{p.name}: {p.invalid_reason}" for p in bad)
            )
        return None

    def _matching(self, node: Mapping[str, Any], pools: list[Pool], alt: _Alt) -> tuple[list[_Device], list[tuple[DeviceID, str]]]:
        """Devices of the node matching ``alt``'s selectors, and CEL runtime
        errors, memoized in the pool index per node name when possible."""
        index = self._pool_index
        key = ("matching", alt.sel_key, (node.get("metadata") or {}).get("name") or "")
        if index.per_node_name:
            hit = index.cache.get(key)
            if hit is not None:
                return hit
        ok: list[_Device] = []
        errors: list[tuple[DeviceID, str]] = []
        saved = self.cel_errors
        self.cel_errors = {}
        try:
            for dev in self._node_device_list(node, pools):
                if self._selectable(dev, alt):
                    ok.append(dev)
            errors = list(self.cel_errors.items())
        finally:
            self.cel_errors = saved
        out = (ok, errors)
        if index.per_node_name:
            index.cache[key] = out
        return out

    def _allocate_simple(self, node: Mapping[str, Any], pools: list[Pool], alt: _Alt) -> "DeferredAllocation | None":
        matching, errors = self._matching(node, pools, alt)
        allocated = self.allocated
        picked: list[_Device] = []
        need = alt.count
        if need > 0:
            for dev in matching:
                if dev.id not in allocated:
                    picked.append(dev)
                    if len(picked) == need:
                        break
        if len(picked) == need:
            return DeferredAllocation(self, None, (node, pools, alt, picked))
        for did, msg in errors:
            if did not in allocated:
                self.cel_errors.setdefault(did, msg)
        bad = [p for p in pools if p.is_invalid]
        if bad:
            raise NodeAllocationError(
                "invalid resource pools were encountered: "
                + ", ".join(f"{p.driver}/{p.name}: {p.invalid_reason}" for p in bad)
            )
        return None

    def explain(self, node: Mapping[str, Any]) -> tuple[list[AllocationResult] | None, str]:
        """Like :meth:`allocate`, with the reason of a failure on this node
        (``NodeAllocationError`` becomes a reason; ``AllocationError`` propagates)."""
        deferred, reason = self.explain_deferred(node)
        return (None if deferred is None else deferred.results()), reason

    def explain_deferred(self, node: Mapping[str, Any]) -> tuple["DeferredAllocation | None", str]:
        """Like :meth:`explain`, the results built on demand."""
        self.cel_errors.clear()
        try:
            results = self.allocate_deferred(node)
        except NodeAllocationError as err:
            return None, str(err)
        if results is None:
            reason = REASON_CANNOT_ALLOCATE
            if self.cel_errors:
                reason += "; " + "; ".join(sorted(set(self.cel_errors.values()))[:3])
            return None, reason
        return results, ""

    def _all_devices(self, pools: list[Pool], search: _Search, alt: _Alt) -> list[_Device]:
        for p in pools:
            if p.is_incomplete:
                raise AllocationError(
                    f"request {alt.result_name}: asks for all devices, but resource pool {p.driver}/{p.name} is currently being updated"
                )
            if p.is_invalid:
                raise AllocationError(
                    f"request {alt.result_name}: asks for all devices, but resource pool {p.driver}/{p.name} is currently invalid"
                )
        return [d for d in search.devices if self._selectable(d, alt)]

    def _solve(self, s: _Search, ci: int, ri: int) -> bool:
        if ci == len(self.claims):
            return True
        claim = self.claims[ci]
        if ri == len(claim.requests):
            return self._solve(s, ci + 1, 0)
        for ai, alt in enumerate(claim.requests[ri].alts):
            s.alt_index[(ci, ri)] = ai
            if alt.mode == ALL:
                devs = s.all_lists[(ci, ri, ai)]
                if not devs or len(s.chosen[ci]) + len(devs) > RESULTS_MAX_SIZE:
                    continue
                if self._fill_all(s, ci, ri, alt, devs, 0):
                    return True
            else:
                if len(s.chosen[ci]) + alt.count > RESULTS_MAX_SIZE:
                    continue
                if self._fill(s, ci, ri, alt, 0, 0):
                    return True
        s.alt_index.pop((ci, ri), None)
        return False

    def _in_use(self, s: _Search, ci: int, alt: _Alt, dev: _Device) -> bool:
        if alt.admin:
            return ci in s.admin_taken.get(dev.id, ()) or s.taken.get(dev.id) == ci
        if dev.id in self.allocated or dev.id in s.taken:
            return True
        return ci in s.admin_taken.get(dev.id, ())

    def _take(self, s: _Search, ci: int, alt: _Alt, dev: _Device) -> bool:
        done: list[_Constraint] = []
        for c in s.constraints[ci]:
            if not c.add(alt, dev):
                for d in done:
                    d.remove(alt)
                return False
            done.append(c)
        if alt.admin:
            s.admin_taken.setdefault(dev.id, set()).add(ci)
        else:
            s.taken[dev.id] = ci
        s.chosen[ci].append(_Chosen(alt, dev))
        return True

    def _release(self, s: _Search, ci: int, alt: _Alt, dev: _Device) -> None:
        s.chosen[ci].pop()
        if alt.admin:
            holders = s.admin_taken.get(dev.id)
            if holders is not None:
                holders.discard(ci)
                if not holders:
                    del s.admin_taken[dev.id]
        else:
            s.taken.pop(dev.id, None)
        for c in s.constraints[ci]:
            c.remove(alt)

    def _fill(self, s: _Search, ci: int, ri: int, alt: _Alt, slot: int, start: int) -> bool:
        if slot == alt.count:
            return self._solve(s, ci, ri + 1)
        devices = s.devices
        # Slots of one request are interchangeable: choose devices in list order
        # (combinations, not permutations).
        for pos in range(start, len(devices)):
            dev = devices[pos]
            if self._in_use(s, ci, alt, dev) or not self._selectable(dev, alt):
                continue
            if not self._take(s, ci, alt, dev):
                continue
            if self._fill(s, ci, ri, alt, slot + 1, pos + 1):
                return True
            self._release(s, ci, alt, dev)
        return False

    def _fill_all(self, s: _Search, ci: int, ri: int, alt: _Alt, devs: list[_Device], slot: int) -> bool:
        if slot == len(devs):
            return self._solve(s, ci, ri + 1)
        dev = devs[slot]
        if self._in_use(s, ci, alt, dev):
            return False
        if not self._take(s, ci, alt, dev):
            raise AllocationError(
                f"claim {_cname(self.claims[ci].obj)}, request {alt.result_name}: cannot add device {dev.id} "
                "because a claim constraint would not be satisfied"
            )
        if self._fill_all(s, ci, ri, alt, devs, slot + 1):
            return True
        self._release(s, ci, alt, dev)
        return False

    # ---------------------------------------------------------------- result

    def _result(self, s: _Search, ci: int) -> AllocationResult:
        claim = self.claims[ci]
        results: list[Obj] = []
        class_requests: dict[str, list[str]] = {}
        class_objs: dict[str, Mapping[str, Any]] = {}
        node_local = False
        terms: list[tuple[str, Any]] = []
        for ch in s.chosen[ci]:
            r: Obj = {"request": ch.alt.result_name, "driver": ch.dev.id.driver, "pool": ch.dev.id.pool,
                      "device": ch.dev.id.device}
            if ch.alt.admin:
                r["adminAccess"] = True
            if ch.alt.tolerations:
                r["tolerations"] = copy.deepcopy(ch.alt.tolerations)
            results.append(r)
            spec = ch.dev.slice.get("spec") or {}
            if spec.get("nodeName"):
                node_local = True
            elif spec.get("nodeSelector"):
                for term in (spec["nodeSelector"].get("nodeSelectorTerms") or ())[:1]:
                    for kind in ("matchExpressions", "matchFields"):
                        for req in term.get(kind) or ():
                            terms.append((kind, req))
        for ri, req in enumerate(claim.requests):
            alt = req.alts[s.alt_index[(ci, ri)]]
            names = class_requests.setdefault(alt.class_name, [])
            if alt.result_name not in names:
                names.append(alt.result_name)
            class_objs[alt.class_name] = alt.device_class
        selected = {req.alts[s.alt_index[(ci, ri)]].result_name for ri, req in enumerate(claim.requests)}
        configs: list[Obj] = []
        for cname, names in class_requests.items():
            for cfg in (class_objs[cname].get("spec") or {}).get("config") or ():
                entry: Obj = {"source": "FromClass", "requests": list(names)}
                entry.update({k: copy.deepcopy(v) for k, v in cfg.items()})
                configs.append(entry)
        for cfg in claim.configs:
            reqs = list(cfg.get("requests") or ())
            if reqs and not any(r in selected or any(_parent(x) == r for x in selected) for r in reqs):
                continue
            entry = {"source": "FromClaim", "requests": reqs}
            entry.update({k: copy.deepcopy(v) for k, v in cfg.items() if k != "requests"})
            configs.append(entry)
        for entry in configs:
            if not entry["requests"] or len(entry["requests"]) == len(claim.requests):
                del entry["requests"]
        devices: Obj = {"results": results}
        if configs:
            devices["config"] = configs
        out: AllocationResult = {"devices": devices}
        node_name = (s.node.get("metadata") or {}).get("name") or ""
        if node_local:
            out["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}
        elif terms:
            merged: Obj = {}
            seen: set[tuple[Any, ...]] = set()
            for kind, req in terms:
                ident = (kind, req.get("key"), req.get("operator"), tuple(sorted(req.get("values") or ())))
                if ident in seen:
                    continue
                seen.add(ident)
                merged.setdefault(kind, []).append(copy.deepcopy(req))
            out["nodeSelector"] = {"nodeSelectorTerms": [merged]}
        return out


class DeferredAllocation:
    """A successful allocation on one node; :meth:`results` builds (once) one
    AllocationResult per claim, in the allocator's claim order."""

    __slots__ = ("_allocator", "_search", "_simple", "_results")

    def __init__(self, allocator: Allocator, search: _Search | None,
                 simple: tuple[Mapping[str, Any], list[Pool], _Alt, list[_Device]] | None = None) -> None:
        self._allocator = allocator
        self._search = search
        self._simple = simple  # (node, pools, alt, devices) of a single-request allocation
        self._results: list[AllocationResult] | None = None

    def __len__(self) -> int:
        return len(self._allocator.claims)

    def results(self) -> list[AllocationResult]:
        if self._results is None:
            if self._simple is not None:
                node, pools, alt, picked = self._simple
                self._search = _Search(node, [], pools)
                self._search.chosen = [[_Chosen(alt, dev) for dev in picked]]
                self._search.alt_index = {(0, 0): 0}
                self._simple = None
            s = self._search
            self._results = [] if s is None else [self._allocator._result(s, ci)
                                                  for ci in range(len(self._allocator.claims))]
        return self._results


def _parent(name: str) -> str:
    return name.partition("/")[0]


def _cname(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else meta.get("name", "")
