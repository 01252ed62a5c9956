"""The admission plugins of namespace policy: LimitRanger, Priority and
ResourceQuota, after upstream's ``plugin/pkg/admission/limitranger``,
``plugin/pkg/admission/priority`` and the apiserver's resourcequota plugin.

* LimitRanger fills a pod's missing container requests and limits from the
  ``Container`` defaults of its namespace's LimitRanges (mutating phase) and
  refuses pods and claims outside their min/max and maxLimitRequestRatio
  (validating phase).
* Priority resolves a pod's ``priorityClassName`` (or the global default
  class) to ``spec.priority`` and ``spec.preemptionPolicy``, and keeps a
  second PriorityClass from being marked ``globalDefault``.
* ResourceQuota, last of the chain, charges every create (and the updates that
  change usage) to the quotas of the namespace and refuses one that would
  exceed a quota with upstream's ``exceeded quota`` 403. The charge is written
  to the quota's ``status.used`` (compare-and-swap on its revision, retried)
  before the object is stored; the resource quota controller recounts it later.

As upstream's plugins read informers' listers, these read a copy of the
LimitRanges, PriorityClasses and ResourceQuotas kept by a watch of the store
(:class:`StoreCache`); a write of one of them through the registry returns
once the copy has it (:meth:`AdmissionPlugin.written`), so the next request
sees it. ResourceQuota reads the quotas themselves from storage when it
charges them (their ``status.used`` is the state it updates).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
from typing import Any, Callable, ClassVar

from kubeplane.api import errors
from kubeplane.api import quota as q
from kubeplane.api.meta import utcnow
from kubeplane.api.quantity import format_quantity, parse_quantity_with_format
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.registry.admission import CREATE, DELETE, UPDATE, AdmissionPlugin, Attributes
from kubeplane.storage.interface import CompactedError, RevisionConflictError, StorageError, Store

log = logging.getLogger(__name__)

Obj = dict[str, Any]

LIMIT_RANGES = resource("limitranges")
RESOURCE_QUOTAS = resource("resourcequotas")
PRIORITY_CLASSES = resource("priorityclasses", "scheduling.k8s.io")
PODS_KEY = ("", "pods")
PVCS_KEY = ("", "persistentvolumeclaims")

LIMIT_RANGER_ANNOTATION = "kubernetes.io/limit-ranger"

#: upstream's system priority classes, created when the API server starts
SYSTEM_PRIORITY_CLASSES: tuple[Obj, ...] = (
    {"name": "system-node-critical", "value": 2000001000,
     "description": "Used for system critical pods that must not be moved from their current node."},
    {"name": "system-cluster-critical", "value": 2000000000,
     "description": "Used for system critical pods that must run in the cluster, but can be moved to "
                    "another node if necessary."},
)
SYSTEM_PRIORITY_CLASS_NAMES = frozenset(c["name"] for c in SYSTEM_PRIORITY_CLASSES)

#: resources ResourceQuota never charges (upstream's ignored resources: not stored, or never quota'd)
QUOTA_IGNORED = frozenset({
    ("", "bindings"), ("", "componentstatuses"), ("", "events"), ("events.k8s.io", "events"),
    ("authentication.k8s.io", "tokenreviews"), ("authentication.k8s.io", "selfsubjectreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"), ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "localsubjectaccessreviews"), ("authorization.k8s.io", "selfsubjectrulesreviews"),
})


def forbidden(attrs: Attributes, message: str, *, validating: bool = False) -> errors.StatusError:
    """upstream's admission.NewForbidden: names the object and the resource.
    A name generated from ``generateName`` is known in the validating phase
    only (upstream generates it between the two): the mutating phase names
    the ``generateName``."""
    res = attrs.resource
    md = (attrs.obj or {}).get("metadata") or {} if isinstance(attrs.obj, dict) else {}
    name = attrs.name
    gen = md.get("generateName")
    if (not validating and isinstance(gen, str) and gen and name.startswith(gen[:58])
            and len(name) == len(gen[:58]) + 5):
        name = gen
    what = f'{res.qualified} "{name}"' if name else res.qualified
    return errors.StatusError(403, "Forbidden", f"{what} is forbidden: {message}", name=name,
                              group=res.group, kind=res.plural)


def _aggregate(messages: list[str]) -> str:
    """upstream's utilerrors.NewAggregate text: one message as it is, several in brackets."""
    return messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"


class StoreCache:
    """The objects of one resource, kept by a list and a watch of the store,
    grouped by namespace (upstream's informer lister, for an admission plugin)."""

    def __init__(self, store: Store, res: ResourceInfo) -> None:
        self.store = store
        self.res = res
        self.prefix = res.storage_prefix()
        #: namespace ("" when cluster-scoped) -> key -> object
        self._objects: dict[str, dict[str, Obj]] = {}
        self._revision = 0
        self._synced = False
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None
        self._advanced: asyncio.Condition | None = None
        self._closed = False

    def _namespace(self, key: str) -> str:
        rest = key[len(self.prefix):]
        return rest.split("/", 1)[0] if self.res.namespaced and "/" in rest else ""

    def _start(self) -> None:
        if self._ready is None:
            self._ready = asyncio.Event()
            self._advanced = asyncio.Condition()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.res.plural}-cache")

    async def _list(self) -> int:
        result = await self.store.list(self.prefix)
        objects: dict[str, dict[str, Obj]] = {}
        for kv in result.items:
            objects.setdefault(self._namespace(kv.key), {})[kv.key] = kv.value
        self._objects = objects
        self._synced = True
        return result.revision

    async def _run(self) -> None:
        assert self._ready is not None
        backoff = 0.05
        while not self._closed:
            try:
                rev = await self._list()
                await self._advance(rev)
                self._ready.set()
                watch = self.store.watch(self.prefix, rev)
                try:
                    while True:
                        batch = await watch.next_batch(None)
                        if batch is None:
                            return  # the store is closing
                        for ev in batch:
                            bucket = self._objects.setdefault(self._namespace(ev.key), {})
                            if ev.type == "DELETED":
                                bucket.pop(ev.key, None)
                            else:
                                bucket[ev.key] = ev.value
                        if batch:
                            await self._advance(batch[-1].revision)
                        backoff = 0.05
                finally:
                    watch.close()
            except asyncio.CancelledError:
                raise
            except (CompactedError, StorageError) as exc:
                log.info("%s watch restarts: %s", self.res.plural, exc)
            except Exception:  # noqa: BLE001 - keep serving the last copy; retry
                log.exception("%s watch failed", self.res.plural)
            self._ready.set()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _advance(self, revision: int) -> None:
        assert self._advanced is not None
        async with self._advanced:
            if revision > self._revision:
                self._revision = revision
            self._advanced.notify_all()

    async def caught_up(self, revision: int, timeout: float = 2.0) -> bool:
        """Wait until the copy reflects ``revision`` (bounded)."""
        if self._synced and self._revision >= revision:
            return True
        if self._ready is None:
            return True  # not started: readers read storage itself
        assert self._advanced is not None
        try:
            async with asyncio.timeout(timeout):
                async with self._advanced:
                    await self._advanced.wait_for(lambda: self._synced and self._revision >= revision)
            return True
        except TimeoutError:
            log.warning("the %s copy did not reach revision %d in time", self.res.plural, revision)
            return False

    async def list(self, namespace: str | None = None) -> list[Obj]:
        """The objects of ``namespace`` (all of a cluster-scoped resource), in key order."""
        if not self._synced:
            # the copy is being made (or its list failed): read storage itself
            # meanwhile, and do not wait for it (the request stays as quick)
            self._start()
            result = await self.store.list(self.res.storage_prefix(namespace))
            return [kv.value for kv in result.items]
        bucket = self._objects.get(namespace or "") or {}
        return [bucket[k] for k in sorted(bucket)]

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class _CachingPlugin(AdmissionPlugin):
    """A plugin reading one resource through a :class:`StoreCache`."""

    cached: ClassVar[ResourceInfo]

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cache = StoreCache(store, self.cached)

    async def written(self, res: ResourceInfo, revision: int) -> None:
        if res.key == self.cached.key:
            await self.cache.caught_up(revision)

    async def close(self) -> None:
        await self.cache.close()


# ------------------------------------------------------------------ LimitRanger


def _qstr(raw: Any) -> str:
    value, fmt = parse_quantity_with_format(raw)
    return format_quantity(value, fmt)


def _enforced_values(req: Any, lim: Any, enforced: Any) -> tuple[int, int, int]:
    """Requests, limits and the enforced value compared in milli-units
    (whole units when one of them is too large), as upstream does."""
    from kubeplane.api.quantity import int_value, milli_value

    r, l, e = (int_value(x) if x is not None else 0 for x in (req, lim, enforced))
    top = 2**63 // 1000
    if r <= top and l <= top and e <= top:
        r, l, e = (milli_value(x) if x is not None else 0 for x in (req, lim, enforced))
    return r, l, e


def _min_constraint(kind: str, name: str, enforced: Any, requests: Obj, limits: Obj) -> str | None:
    req, lim = requests.get(name), limits.get(name)
    r, l, e = _enforced_values(req, lim, enforced)
    if req is None:
        return f"minimum {name} usage per {kind} is {_qstr(enforced)}.  No request is specified"
    if r < e:
        return f"minimum {name} usage per {kind} is {_qstr(enforced)}, but request is {_qstr(req)}"
    if lim is not None and l < e:
        return f"minimum {name} usage per {kind} is {_qstr(enforced)}, but limit is {_qstr(lim)}"
    return None


def _max_request_constraint(kind: str, name: str, enforced: Any, requests: Obj) -> str | None:
    req = requests.get(name)
    r, _, e = _enforced_values(req, None, enforced)
    if req is None:
        return f"maximum {name} usage per {kind} is {_qstr(enforced)}.  No request is specified"
    if r > e:
        return f"maximum {name} usage per {kind} is {_qstr(enforced)}, but request is {_qstr(req)}"
    return None


def _max_constraint(kind: str, name: str, enforced: Any, requests: Obj, limits: Obj) -> str | None:
    req, lim = requests.get(name), limits.get(name)
    r, l, e = _enforced_values(req, lim, enforced)
    if lim is None:
        return f"maximum {name} usage per {kind} is {_qstr(enforced)}.  No limit is specified"
    if l > e:
        return f"maximum {name} usage per {kind} is {_qstr(enforced)}, but limit is {_qstr(lim)}"
    if req is not None and r > e:
        return f"maximum {name} usage per {kind} is {_qstr(enforced)}, but request is {_qstr(req)}"
    return None


def _ratio_constraint(kind: str, name: str, enforced: Any, requests: Obj, limits: Obj) -> str | None:
    from kubeplane.api.quantity import int_value, milli_value

    req, lim = requests.get(name), limits.get(name)
    r, l, _ = _enforced_values(req, lim, enforced)
    shown = _qstr(enforced)
    if req is None or r == 0:
        return (f"{name} max limit to request ratio per {kind} is {shown}, "
                "but no request is specified or request is 0")
    if lim is None or l == 0:
        return (f"{name} max limit to request ratio per {kind} is {shown}, "
                "but no limit is specified or limit is 0")
    observed = l / r
    displayed = observed
    allowed = float(int_value(enforced))
    if int_value(enforced) <= 2**63 // 1000:
        observed *= 1000
        allowed = float(milli_value(enforced))
    if observed > allowed:
        return f"{name} max limit to request ratio per {kind} is {shown}, but provided ratio is {displayed:f}"
    return None


def _items(limit_range: Obj) -> list[Obj]:
    limits = (limit_range.get("spec") or {}).get("limits")
    return [i for i in limits if isinstance(i, dict)] if isinstance(limits, list) else []


def _rl(raw: Any) -> Obj:
    """A resource map whose values parse (the others are validation's business)."""
    out: Obj = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            try:
                parse_quantity_with_format(v)
            except (TypeError, ValueError):
                continue
            out[k] = v
    return out


def _containers(spec: Obj, field: str) -> list[Obj]:
    items = spec.get(field)
    return [c for c in items if isinstance(c, dict)] if isinstance(items, list) else []


def _raw_from(rl: q.ResourceList) -> Obj:
    return {n: q.fmt(v) for n, v in rl.items()}


class LimitRanger(_CachingPlugin):
    """Defaults and bounds from the namespace's LimitRanges."""

    name = "LimitRanger"
    watched_groups = frozenset({""})
    cached = LIMIT_RANGES

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        if res.key == PODS_KEY:
            return operation == CREATE
        return res.key == PVCS_KEY and operation in (CREATE, UPDATE)

    def _applies(self, attrs: Attributes) -> bool:
        if attrs.subresource or not isinstance(attrs.obj, dict):
            return False
        old_md = (attrs.old_obj or {}).get("metadata") or {}
        return not old_md.get("deletionTimestamp")

    async def admit(self, attrs: Attributes) -> None:
        if attrs.resource.key != PODS_KEY or not self._applies(attrs):
            return
        changed = False
        for lr in await self.cache.list(attrs.namespace):
            changed = self._default_pod(attrs.obj, lr) or changed
        status = attrs.obj.get("status")
        if changed and isinstance(status, dict) and "qosClass" in status:
            # the strategy classed the pod before its defaults were known
            from kubeplane.api.qos import pod_qos_class

            status["qosClass"] = pod_qos_class(attrs.obj.get("spec") or {})

    @staticmethod
    def _default_pod(pod: Obj, limit_range: Obj) -> bool:
        """Fill the defaults of one LimitRange in; whether any was missing."""
        requests: Obj = {}
        limits: Obj = {}
        for item in _items(limit_range):
            if item.get("type") == "Container":
                requests.update(_rl(item.get("defaultRequest")))
                limits.update(_rl(item.get("default")))
        if not requests and not limits:
            return False
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return False
        notes: list[str] = []
        for field, what in (("containers", "container"), ("initContainers", "init container")):
            for c in _containers(spec, field):
                res = c.get("resources")
                if not isinstance(res, dict):
                    res = c["resources"] = {}
                set_limits = LimitRanger._merge(res, "limits", limits)
                set_requests = LimitRanger._merge(res, "requests", requests)
                name = c.get("name", "")
                if set_requests:
                    notes.append(f"{', '.join(sorted(set_requests))} request for {what} {name}")
                if set_limits:
                    notes.append(f"{', '.join(sorted(set_limits))} limit for {what} {name}")
        if notes:
            md = pod.setdefault("metadata", {})
            ann = md.get("annotations")
            if not isinstance(ann, dict):
                ann = md["annotations"] = {}
            ann[LIMIT_RANGER_ANNOTATION] = "LimitRanger plugin set: " + "; ".join(notes)
        return bool(notes)

    @staticmethod
    def _merge(res: Obj, key: str, defaults: Obj) -> list[str]:
        current = res.get(key)
        if not isinstance(current, dict):
            current = {}
        added = [k for k in defaults if k not in current]
        if added:
            res[key] = {**current, **{k: defaults[k] for k in added}}
        return added

    async def validate(self, attrs: Attributes) -> None:
        if not self._applies(attrs):
            return
        for lr in await self.cache.list(attrs.namespace):
            found = (self._check_pod(attrs.obj, lr) if attrs.resource.key == PODS_KEY
                     else self._check_claim(attrs.obj, lr))
            if found:
                raise forbidden(attrs, _aggregate(found), validating=True)

    @staticmethod
    def _check_claim(pvc: Obj, limit_range: Obj) -> list[str]:
        requests = _rl(((pvc.get("spec") or {}).get("resources") or {}).get("requests"))
        out: list[str] = []
        for item in _items(limit_range):
            kind = item.get("type")
            if kind != "PersistentVolumeClaim":
                continue
            for name, v in _rl(item.get("min")).items():
                if (m := _min_constraint(kind, name, v, requests, {})) is not None:
                    out.append(m)
            for name, v in _rl(item.get("max")).items():
                if (m := _max_request_constraint(kind, name, v, requests)) is not None:
                    out.append(m)
        return out

    @staticmethod
    def _check_pod(pod: Obj, limit_range: Obj) -> list[str]:
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        out: list[str] = []

        def check(kind: str, item: Obj, requests: Obj, limits: Obj) -> None:
            for name, v in _rl(item.get("min")).items():
                if (m := _min_constraint(kind, name, v, requests, limits)) is not None:
                    out.append(m)
            for name, v in _rl(item.get("max")).items():
                if (m := _max_constraint(kind, name, v, requests, limits)) is not None:
                    out.append(m)
            for name, v in _rl(item.get("maxLimitRequestRatio")).items():
                if (m := _ratio_constraint(kind, name, v, requests, limits)) is not None:
                    out.append(m)

        for item in _items(limit_range):
            kind = item.get("type")
            if kind == "Container":
                for c in _containers(spec, "containers") + _containers(spec, "initContainers"):
                    res = c.get("resources") if isinstance(c.get("resources"), dict) else {}
                    check(kind, item, _rl(res.get("requests")), _rl(res.get("limits")))
            elif kind == "Pod":
                check(kind, item, _raw_from(q.pod_aggregate(spec, "requests")),
                      _raw_from(q.pod_aggregate(spec, "limits")))
        return out


# --------------------------------------------------------------------- Priority


class Priority(_CachingPlugin):
    """A pod's priority from its PriorityClass; one global default at most."""

    name = "Priority"
    watched_groups = frozenset({"scheduling.k8s.io"})
    cached = PRIORITY_CLASSES

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        if res.key == PODS_KEY:
            return operation in (CREATE, UPDATE)
        return res.key == PRIORITY_CLASSES.key and operation in (CREATE, UPDATE, DELETE)

    async def _default_class(self) -> Obj | None:
        """The globalDefault class of the lowest value (when a race left several)."""
        best: Obj | None = None
        for pc in await self.cache.list():
            if pc.get("globalDefault") is True:
                if best is None or _int(pc.get("value")) < _int(best.get("value")):
                    best = pc
        return best

    async def admit(self, attrs: Attributes) -> None:
        if attrs.resource.key != PODS_KEY or attrs.subresource or not isinstance(attrs.obj, dict):
            return
        spec = attrs.obj.get("spec")
        if not isinstance(spec, dict):
            return
        if attrs.operation == UPDATE:
            # set on create; validation refuses any change, so only carry it over
            old = (attrs.old_obj or {}).get("spec") or {}
            for key in ("priority", "preemptionPolicy"):
                if spec.get(key) is None and old.get(key) is not None:
                    spec[key] = old[key]
            return
        name = spec.get("priorityClassName")
        if not name:
            pc = await self._default_class()
            if pc is not None:
                name, value, policy = (pc.get("metadata") or {}).get("name", ""), _int(pc.get("value")), \
                    pc.get("preemptionPolicy")
                spec["priorityClassName"] = name
            else:
                value, policy = 0, "PreemptLowerPriority"
        else:
            pc = next((c for c in await self.cache.list() if (c.get("metadata") or {}).get("name") == name), None)
            if pc is None:
                raise forbidden(attrs, f"no PriorityClass with name {name} was found")
            value, policy = _int(pc.get("value")), pc.get("preemptionPolicy")
        given = spec.get("priority")
        if given is not None and given != value:
            raise forbidden(attrs, f"the integer value of priority ({given}) must not be provided in pod spec; "
                                   f"priority admission controller computed {value} from the given PriorityClass name")
        spec["priority"] = value
        if policy:
            given_policy = spec.get("preemptionPolicy")
            if given_policy is not None and given_policy != policy:
                raise forbidden(attrs, f"the string value of PreemptionPolicy ({given_policy}) must not be provided "
                                       f"in pod spec; priority admission controller computed {policy} from the given "
                                       "PriorityClass name")
            spec["preemptionPolicy"] = policy

    async def validate(self, attrs: Attributes) -> None:
        if attrs.resource.key != PRIORITY_CLASSES.key or attrs.subresource:
            return
        if attrs.operation == DELETE:
            # upstream's PriorityClass storage keeps the system classes
            if attrs.name in SYSTEM_PRIORITY_CLASS_NAMES:
                raise forbidden(attrs, "this is a system priority class and cannot be deleted", validating=True)
            return
        pc = attrs.obj if isinstance(attrs.obj, dict) else {}
        if pc.get("globalDefault") is not True:
            return
        current = await self._default_class()
        if current is None:
            return
        current_name = (current.get("metadata") or {}).get("name", "")
        if attrs.operation == CREATE or current_name != attrs.name:
            raise forbidden(attrs, f"PriorityClass {current_name} is already marked as default. "
                                   "Only one default can exist", validating=True)


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


async def ensure_system_priority_classes(registry: Any) -> None:
    """Create upstream's system PriorityClasses where they are missing (the
    API server's ``scheduling/bootstrap-system-priority-classes`` hook)."""
    for c in SYSTEM_PRIORITY_CLASSES:
        if await registry.store.get(PRIORITY_CLASSES.storage_key(c["name"])) is not None:
            continue
        obj = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": c["name"]},
               "value": c["value"], "description": c["description"]}
        try:
            await registry.create(PRIORITY_CLASSES, obj)
        except errors.StatusError as err:
            if err.code != 409:
                raise


# ---------------------------------------------------------------- ResourceQuota


class ResourceQuota(_CachingPlugin):
    """Every charge within the namespace's quotas, recorded in their status."""

    name = "ResourceQuota"
    watched_groups = frozenset({""})
    cached = RESOURCE_QUOTAS
    #: how often a charge is tried again when a quota changed underneath it
    RETRIES = 3

    def __init__(self, store: Store, *, clock: Callable[[], _dt.datetime] = utcnow) -> None:
        super().__init__(store)
        self.clock = clock
        # one evaluation at a time per namespace: the quotas' status is the shared state
        self._locks: dict[str, asyncio.Lock] = {}

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return operation in (CREATE, UPDATE) and res.namespaced and res.key not in QUOTA_IGNORED

    async def validate(self, attrs: Attributes) -> None:
        namespace = attrs.namespace
        if not namespace or not isinstance(attrs.obj, dict):
            return
        res = attrs.resource
        ev = q.evaluator_for(res.group, res.plural)
        if not ev.handles(attrs.operation, attrs.obj, attrs.old_obj, attrs.subresource):
            return
        if not await self.cache.list(namespace):
            return  # no quota here (the copy says so; charging reads storage itself)
        lock = self._locks.get(namespace)
        if lock is None:
            lock = self._locks[namespace] = asyncio.Lock()
        async with lock:
            for _attempt in range(self.RETRIES + 1):
                quotas = await self._quotas(namespace)
                if not quotas:
                    return
                changed = self.check(quotas, attrs, ev)
                if not changed or attrs.dry_run:
                    return
                try:
                    for kv_rev, new in changed:
                        await self.store.update(RESOURCE_QUOTAS.storage_key(
                            new["metadata"]["name"], namespace), new, expected_revision=kv_rev)
                    return
                except RevisionConflictError:
                    continue
        raise errors.StatusError(409, "Conflict", "Operation cannot be fulfilled on resourcequotas: the quota "
                                 "changed while this request was being charged; please try again")

    async def _quotas(self, namespace: str) -> list[tuple[int, Obj]]:
        result = await self.store.list(RESOURCE_QUOTAS.storage_prefix(namespace))
        return [(kv.mod_revision, kv.value) for kv in result.items]

    def check(self, quotas: list[tuple[int, Obj]], attrs: Attributes, ev: q.Evaluator) -> list[tuple[int, Obj]]:
        """The quotas whose ``status.used`` the request changes (new objects,
        with the revision each was read at); raises the 403 when one would be exceeded."""
        obj = attrs.obj or {}
        now = self.clock()

        def deny(message: str) -> errors.StatusError:
            return forbidden(attrs, message, validating=True)

        interesting: list[tuple[int, Obj, q.ResourceList, q.ResourceList]] = []
        for rev, rq in quotas:
            status = rq.get("status") or {}
            hard = q.parse_list(status.get("hard"))
            if not q.matches(ev, rq, obj):
                continue
            restricted = ev.matching_resources(hard)
            problem = ev.constraints(restricted, obj)
            if problem:
                raise deny(f"failed quota: {rq['metadata']['name']}: {problem}")
            used = q.parse_list(status.get("used"))
            missing = [n for n in restricted if n not in used]
            if missing:
                raise deny(f"status unknown for quota: {rq['metadata']['name']}, resources: "
                                       f"{','.join(sorted(restricted))}")
            interesting.append((rev, rq, hard, used))
        if not interesting:
            return []
        usage = ev.usage(obj, now)
        negative = sorted(n for n, v in usage.items() if v[0] < 0)
        if negative:
            raise deny(f"quota usage is negative for resource(s): {','.join(negative)}")
        deltas = [usage] * len(interesting)
        if attrs.operation == UPDATE:
            old = attrs.old_obj
            if old is None:
                raise deny("unable to get previous usage since prior version of object was not found")
            if (old.get("metadata") or {}).get("resourceVersion"):
                delta = q.subtract_non_negative(usage, ev.usage(old, now))
                deltas = [delta if q.matches(ev, rq, old) else usage for _r, rq, _h, _u in interesting]
        out: list[tuple[int, Obj]] = []
        for (rev, rq, hard, used), delta in zip(interesting, deltas):
            delta = q.remove_zeros(delta)
            if not delta:
                continue
            requested = q.mask(delta, hard)
            new_used = q.add(used, requested)
            if attrs.subresource != "status":
                allowed, exceeded = q.less_or_equal(q.mask(new_used, requested), hard)
                if not allowed:
                    raise deny(f"exceeded quota: {rq['metadata']['name']}, "
                                           f"requested: {q.pretty(q.mask(requested, exceeded))}, "
                                           f"used: {q.pretty(q.mask(used, exceeded))}, "
                                           f"limited: {q.pretty(q.mask(hard, exceeded))}")
            if q.equal_values(new_used, used):
                continue
            status = dict(rq.get("status") or {})
            status["used"] = q.to_raw(new_used)
            out.append((rev, {**rq, "status": status}))
        return out


__all__ = [
    "LIMIT_RANGER_ANNOTATION",
    "LimitRanger",
    "Priority",
    "ResourceQuota",
    "SYSTEM_PRIORITY_CLASSES",
    "SYSTEM_PRIORITY_CLASS_NAMES",
    "ensure_system_priority_classes",
    "forbidden",
]
