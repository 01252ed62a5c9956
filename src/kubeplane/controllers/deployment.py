"""The Deployment controller, after upstream's ``pkg/controller/deployment``.

A Deployment owns ReplicaSets; the one whose pod template equals the
Deployment's (ignoring the ``pod-template-hash`` label) is the *new* one,
named ``<deployment>-<hash>``. A sync:

* claims ReplicaSets (adopt matching orphans, release non-matching ones);
* paused, or ``spec.replicas`` changed (a scaling event): scales the
  ReplicaSets proportionally and writes status only;
* otherwise rolls out: ``RollingUpdate`` (bounded by maxSurge and
  maxUnavailable) or ``Recreate`` (old pods gone before new ones start);
* keeps ``revisionHistoryLimit`` old ReplicaSets, and writes status with
  the Available and Progressing conditions ``kubectl rollout status`` reads.

Pod template hash: upstream hashes the Go struct dump of the template
(go-spew) with FNV-32a. That dump cannot be reproduced outside Go, so
:func:`compute_hash` applies the same FNV-32a (plus the little-endian
collisionCount suffix) and the same ``SafeEncodeString`` alphabet to the
template's canonical JSON, in a normalised form (:func:`normalized_template`)
so that templates upstream considers equal hash equally. Names have the
upstream shape but differ from the ones a real cluster would pick for the
same template.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import struct
from typing import Any, Callable

import orjson

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, format_time, parse_time, utcnow
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.replicaset import (
    CONTROLLER_UID_INDEX,
    NAMESPACE_INDEX,
    add_indexers,
    controller_ref,
    controller_uid_index,
    find_condition,
    key_of,
    md_of,
    name_of,
    namespace_index,
    new_controller_ref,
    ns_of,
    remove_condition,
    selector_of,
    spec_replicas,
    uid_of,
)

log = logging.getLogger(__name__)

PODS = resource("pods")
REPLICASETS = resource("replicasets")
DEPLOYMENTS = resource("deployments")

POD_TEMPLATE_HASH = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
REVISION_HISTORY = "deployment.kubernetes.io/revision-history"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ROLLBACK_TO = "deprecated.deployment.rollback.to"
_NOT_COPIED = {LAST_APPLIED, REVISION, REVISION_HISTORY, DESIRED_REPLICAS, MAX_REPLICAS, ROLLBACK_TO}

# Condition reasons (upstream deploymentutil).
NEW_RS_REASON = "NewReplicaSetCreated"
FOUND_NEW_RS_REASON = "FoundNewReplicaSet"
RS_UPDATED_REASON = "ReplicaSetUpdated"
NEW_RS_AVAILABLE_REASON = "NewReplicaSetAvailable"
TIMED_OUT_REASON = "ProgressDeadlineExceeded"
FAILED_RS_CREATE_REASON = "ReplicaSetCreateError"
PAUSED_REASON = "DeploymentPaused"
RESUMED_REASON = "DeploymentResumed"
MIN_AVAILABLE_REASON = "MinimumReplicasAvailable"
MIN_UNAVAILABLE_REASON = "MinimumReplicasUnavailable"

_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# --------------------------------------------------------------- hashing


def fnv32a(data: bytes, h: int = 0x811C9DC5) -> int:
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def safe_encode_string(s: str) -> str:
    """Upstream ``rand.SafeEncodeString``: each character mapped into the
    vowel-free alphabet by code point modulo its length."""
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in s)


# Map fields of a pod template that Go omits when empty (omitempty maps): an
# empty one equals an absent one. Other empty objects (emptyDir: {},
# securityContext: {}) are pointers to structs and mean something.
_OMITTED_EMPTY_MAPS = frozenset({
    "labels", "annotations", "nodeSelector", "limits", "requests", "overhead", "matchLabels",
})


def _typed_equal_form(value: Any, key: str = "") -> tuple[Any, bool]:
    """The value as a decode into upstream's typed objects and back would give
    it: nulls, empty lists and empty omitempty maps dropped. Returns
    ``(value, keep)``."""
    if value is None:
        return None, False
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            v2, keep = _typed_equal_form(v, k)
            if keep:
                out[k] = v2
        return out, bool(out) or key not in _OMITTED_EMPTY_MAPS
    if isinstance(value, list):
        items = [_typed_equal_form(v)[0] for v in value]
        return items, bool(items)
    return value, True


def normalized_template(template: Obj | None) -> Obj:
    """A pod template in the form two equal templates share: what kubectl's
    ``rollout undo`` patch adds (``metadata.creationTimestamp: null``, empty
    maps and lists) removed and the API server's defaults filled in, so that a
    template written back from an older ReplicaSet hashes and compares equal
    to it (upstream hashes and compares the decoded Go structs)."""
    from kubeplane.registry.strategies import default_pod_spec

    out, _ = _typed_equal_form(template or {})
    if not isinstance(out, dict):
        return {}
    spec = out.get("spec")
    if isinstance(spec, dict):
        default_pod_spec(spec)
    if out.get("metadata") == {}:
        del out["metadata"]
    return out


def compute_hash(template: Obj, collision_count: int | None = None) -> str:
    """``pod-template-hash`` of a pod template (see the module docstring)."""
    data = orjson.dumps(normalized_template(template), option=orjson.OPT_SORT_KEYS)
    h = fnv32a(data)
    if collision_count is not None:
        h = fnv32a(struct.pack("<I", collision_count & 0xFFFFFFFF) + b"\0\0\0\0", h)
    return safe_encode_string(str(h))


def equal_ignore_hash(a: Obj | None, b: Obj | None) -> bool:
    """Two pod templates are equal apart from the pod-template-hash label
    (compared in their :func:`normalized_template` form)."""
    a1, b1 = normalized_template(a), normalized_template(b)
    for t in (a1, b1):
        labels = (t.get("metadata") or {}).get("labels")
        if labels is not None:
            labels.pop(POD_TEMPLATE_HASH, None)
            if not labels:
                t["metadata"].pop("labels")
        if t.get("metadata") == {}:
            t.pop("metadata")
    return bool(a1 == b1)


# ------------------------------------------------------------ arithmetic


def scaled_value(value: Any, total: int, round_up: bool) -> int:
    """Upstream ``GetScaledValueFromIntOrPercent``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    s = str(value)
    if not s.endswith("%"):
        try:
            return int(s)
        except ValueError:
            raise ValueError(f"invalid value for IntOrString: {value!r}") from None
    pct = int(s[:-1])
    v = pct * total / 100
    return math.ceil(v) if round_up else math.floor(v)


def _rolling(d: Obj) -> Obj | None:
    strategy = (d.get("spec") or {}).get("strategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return None
    return strategy.get("rollingUpdate") or {}


def resolve_fenceposts(max_surge: Any, max_unavailable: Any, desired: int) -> tuple[int, int]:
    surge = scaled_value("25%" if max_surge is None else max_surge, desired, True)
    unavailable = scaled_value("25%" if max_unavailable is None else max_unavailable, desired, False)
    if surge == 0 and unavailable == 0:
        # Both zero would block the rollout forever.
        unavailable = 1
    return surge, unavailable


def max_surge(d: Obj) -> int:
    ru = _rolling(d)
    if ru is None:
        return 0
    return resolve_fenceposts(ru.get("maxSurge"), ru.get("maxUnavailable"), spec_replicas(d))[0]


def max_unavailable(d: Obj) -> int:
    ru = _rolling(d)
    replicas = spec_replicas(d)
    if ru is None or replicas == 0:
        return 0
    mu = resolve_fenceposts(ru.get("maxSurge"), ru.get("maxUnavailable"), replicas)[1]
    return min(mu, replicas)


def _round_half_away(x: float) -> int:
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def _st(obj: Obj, field: str) -> int:
    try:
        return int((obj.get("status") or {}).get(field) or 0)
    except (TypeError, ValueError):
        return 0


def replica_count(rss: list[Obj]) -> int:
    return sum(spec_replicas(rs) for rs in rss)


def actual_count(rss: list[Obj]) -> int:
    return sum(_st(rs, "replicas") for rs in rss)


def available_count(rss: list[Obj]) -> int:
    return sum(_st(rs, "availableReplicas") for rs in rss)


def ready_count(rss: list[Obj]) -> int:
    return sum(_st(rs, "readyReplicas") for rs in rss)


def _ann(obj: Obj) -> dict[str, str]:
    return md_of(obj).get("annotations") or {}


def _int_ann(obj: Obj, key: str) -> int | None:
    try:
        return int(_ann(obj)[key])
    except (KeyError, TypeError, ValueError):
        return None


def revision_of(rs: Obj) -> int:
    return _int_ann(rs, REVISION) or 0


def _created(obj: Obj) -> tuple[str, str]:
    return (md_of(obj).get("creationTimestamp") or "", name_of(obj))


def by_creation(rss: list[Obj]) -> list[Obj]:
    return sorted(rss, key=_created)


def active(rss: list[Obj]) -> list[Obj]:
    return [rs for rs in rss if rs is not None and spec_replicas(rs) > 0]


def new_rs_new_replicas(d: Obj, all_rss: list[Obj], new_rs: Obj) -> int:
    """How big the new ReplicaSet may be now (upstream ``NewRSNewReplicas``)."""
    if _rolling(d) is None:
        return spec_replicas(d)
    replicas = spec_replicas(d)
    current = replica_count(all_rss)
    max_total = replicas + max_surge(d)
    if current >= max_total:
        return spec_replicas(new_rs)
    scale_up = min(max_total - current, replicas - spec_replicas(new_rs))
    return spec_replicas(new_rs) + scale_up


def deployment_complete(d: Obj, status: Obj) -> bool:
    replicas = spec_replicas(d)
    return (status.get("updatedReplicas", 0) == replicas and status.get("replicas", 0) == replicas
            and status.get("availableReplicas", 0) == replicas
            and status.get("observedGeneration", 0) >= (md_of(d).get("generation") or 0))


def deployment_progressing(d: Obj, status: Obj) -> bool:
    old = d.get("status") or {}
    old_old = old.get("replicas", 0) - old.get("updatedReplicas", 0)
    new_old = status.get("replicas", 0) - status.get("updatedReplicas", 0)
    return (status.get("updatedReplicas", 0) > old.get("updatedReplicas", 0) or new_old < old_old
            or status.get("readyReplicas", 0) > old.get("readyReplicas", 0)
            or status.get("availableReplicas", 0) > old.get("availableReplicas", 0))


def progress_deadline(d: Obj) -> int | None:
    v = (d.get("spec") or {}).get("progressDeadlineSeconds")
    if v is None or v == 2**31 - 1:
        return None
    return int(v)


def deployment_timed_out(d: Obj, status: Obj, now: _dt.datetime) -> bool:
    deadline = progress_deadline(d)
    if deadline is None:
        return False
    cond = find_condition(status, "Progressing")
    if cond is None or cond.get("reason") == NEW_RS_AVAILABLE_REASON:
        return False
    if cond.get("reason") == TIMED_OUT_REASON:
        return True
    try:
        since = parse_time(cond.get("lastUpdateTime") or "")
    except ValueError:
        return False
    return since + _dt.timedelta(seconds=deadline) < now


def new_condition(type_: str, status: str, reason: str, message: str, now: _dt.datetime | None = None) -> Obj:
    now = format_time(now or utcnow())
    return {"type": type_, "status": status, "lastUpdateTime": now, "lastTransitionTime": now,
            "reason": reason, "message": message}


def set_condition(status: Obj, cond: Obj) -> None:
    """Upstream ``SetDeploymentCondition``: same status and reason is a no-op;
    same status keeps the transition time."""
    current = find_condition(status, cond["type"])
    if current is not None and current.get("status") == cond["status"] and current.get("reason") == cond["reason"]:
        return
    if current is not None and current.get("status") == cond["status"]:
        cond = {**cond, "lastTransitionTime": current.get("lastTransitionTime", cond["lastTransitionTime"])}
    conds = [c for c in status.get("conditions") or [] if c.get("type") != cond["type"]]
    conds.append(cond)
    status["conditions"] = conds


def _compact(status: Obj) -> Obj:
    """Drop zero counters, as the API's omitempty does."""
    return {k: v for k, v in status.items() if not (isinstance(v, int) and v == 0 and k != "observedGeneration")}


# ------------------------------------------------------------ controller


class DeploymentController(Controller):
    """Rolls Deployments out through ReplicaSets."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 1,
        name: str = "deployment-controller",
        clock: Callable[[], _dt.datetime] = utcnow,
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        #: the time progress deadlines and condition timestamps are read from
        self.clock = clock
        self.d_informer = self.factory.informer_for(DEPLOYMENTS)
        self.rs_informer = self.factory.informer_for(REPLICASETS)
        self.pod_informer = self.factory.informer_for(PODS)
        for inf in (self.d_informer, self.rs_informer, self.pod_informer):
            add_indexers(inf, {NAMESPACE_INDEX: namespace_index})
        for inf in (self.rs_informer, self.pod_informer):
            add_indexers(inf, {CONTROLLER_UID_INDEX: controller_uid_index})
        self.deployments = self.add_queue("deployments", self.sync)
        self.d_informer.add_event_handler(
            self._enqueue, lambda old, new: self._enqueue(new), lambda d: self._enqueue(unwrap_deleted(d)))
        self.rs_informer.add_event_handler(self._rs_added, self._rs_updated, self._rs_deleted)
        self.pod_informer.add_event_handler(None, None, self._pod_deleted)

    def _new_condition(self, type_: str, status: str, reason: str, message: str) -> Obj:
        return new_condition(type_, status, reason, message, self.clock())

    # ------------------------------------------------------------- handlers

    def _enqueue(self, d: Obj) -> None:
        self.deployments.add(key_of(d))

    def _resolve(self, namespace: str, ref: Obj | None) -> Obj | None:
        if not ref or ref.get("kind") != "Deployment":
            return None
        d = self.d_informer.indexer.get_by_key(f"{namespace}/{ref.get('name', '')}")
        if d is None or uid_of(d) != ref.get("uid"):
            return None
        return d

    def _deployments_for_orphan(self, rs: Obj) -> list[Obj]:
        labels = md_of(rs).get("labels") or {}
        if not labels:
            return []
        return [d for d in self.d_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(rs))
                if selector_of(d).matches(labels)]

    def _rs_added(self, rs: Obj) -> None:
        if md_of(rs).get("deletionTimestamp"):
            self._rs_deleted(rs)
            return
        ref = controller_ref(rs)
        if ref is not None:
            d = self._resolve(ns_of(rs), ref)
            if d is not None:
                self._enqueue(d)
            return
        for d in self._deployments_for_orphan(rs):
            self._enqueue(d)

    def _rs_updated(self, old: Obj, new: Obj) -> None:
        old_ref, new_ref = controller_ref(old), controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            d = self._resolve(ns_of(old), old_ref)
            if d is not None:
                self._enqueue(d)
        if new_ref is not None:
            d = self._resolve(ns_of(new), new_ref)
            if d is not None:
                self._enqueue(d)
            return
        if (md_of(old).get("labels") != md_of(new).get("labels")) or old_ref is not None:
            for d in self._deployments_for_orphan(new):
                self._enqueue(d)

    def _rs_deleted(self, rs: Obj) -> None:
        rs = unwrap_deleted(rs)
        d = self._resolve(ns_of(rs), controller_ref(rs))
        if d is not None:
            self._enqueue(d)

    def _pod_deleted(self, pod: Obj) -> None:
        """Recreate waits for old pods to be gone."""
        pod = unwrap_deleted(pod)
        ref = controller_ref(pod)
        if not ref or ref.get("kind") != "ReplicaSet":
            return
        rs = self.rs_informer.indexer.get_by_key(f"{ns_of(pod)}/{ref.get('name', '')}")
        if rs is None or uid_of(rs) != ref.get("uid"):
            return
        d = self._resolve(ns_of(rs), controller_ref(rs))
        if d is not None and _rolling(d) is None:
            self._enqueue(d)

    # ----------------------------------------------------------------- sync

    async def sync(self, key: str) -> None:
        d = self.d_informer.indexer.get_by_key(key)
        if d is None:
            return
        d = deep_copy(d)
        selector = selector_of(d)
        if selector.empty:
            self.recorder.event(d, "Warning", "SelectingAll",
                                      "This deployment is selecting all pods. A non-empty selector is required.")
            gen = md_of(d).get("generation") or 0
            if (d.get("status") or {}).get("observedGeneration", 0) < gen:
                d.setdefault("status", {})["observedGeneration"] = gen
                await self.client.update(DEPLOYMENTS, d, subresource="status")
            return
        rs_list = await self.claim_replicasets(d)
        if md_of(d).get("deletionTimestamp"):
            new_rs, old_rss = await self.get_all_replicasets(d, rs_list, create=False)
            await self.sync_deployment_status(old_rss + ([new_rs] if new_rs else []), new_rs, d)
            return
        await self.check_paused_conditions(d)
        if (d.get("spec") or {}).get("paused"):
            await self.sync_scale(d, rs_list)
            return
        if await self.is_scaling_event(d, rs_list):
            await self.sync_scale(d, rs_list)
            return
        if _rolling(d) is None:
            await self.rollout_recreate(d, rs_list)
        else:
            await self.rollout_rolling(d, rs_list)

    async def claim_replicasets(self, d: Obj) -> list[Obj]:
        """Adopt matching orphan ReplicaSets and release owned ones that no
        longer match; returns the ReplicaSets the Deployment controls."""
        selector = selector_of(d)
        uid = uid_of(d)
        deleting = bool(md_of(d).get("deletionTimestamp"))
        owned: list[Obj] = []
        for rs in self.rs_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(d)):
            ref = controller_ref(rs)
            matches = selector.matches(md_of(rs).get("labels") or {})
            if ref is not None:
                if ref.get("uid") != uid:
                    continue
                if matches:
                    owned.append(rs)
                elif not deleting:
                    new = deep_copy(rs)
                    refs = [r for r in md_of(new).get("ownerReferences") or [] if r.get("uid") != uid]
                    new["metadata"]["ownerReferences"] = refs
                    await self._ignore_gone(self.client.update(REPLICASETS, new))
                continue
            if not matches or deleting or md_of(rs).get("deletionTimestamp"):
                continue
            fresh = await self.client.get(DEPLOYMENTS, name_of(d), ns_of(d))
            if uid_of(fresh) != uid or md_of(fresh).get("deletionTimestamp"):
                continue
            new = deep_copy(rs)
            new["metadata"].setdefault("ownerReferences", []).append(new_controller_ref(d, "apps/v1", "Deployment"))
            adopted = await self._ignore_gone(self.client.update(REPLICASETS, new))
            if adopted is not None:
                owned.append(adopted)
        return owned

    async def _ignore_gone(self, coro: Any) -> Obj | None:
        try:
            return await coro
        except StatusError as err:
            if err.code in (404, 409):
                return None
            raise

    # ------------------------------------------------------ new replica set

    def find_new_replicaset(self, d: Obj, rs_list: list[Obj]) -> Obj | None:
        tmpl = (d.get("spec") or {}).get("template")
        for rs in by_creation(rs_list):
            if equal_ignore_hash((rs.get("spec") or {}).get("template"), tmpl):
                return rs
        return None

    async def get_all_replicasets(self, d: Obj, rs_list: list[Obj], *, create: bool) -> tuple[Obj | None, list[Obj]]:
        """``(new, old)`` ReplicaSets; syncs revision annotations and, when
        ``create``, creates the new ReplicaSet."""
        existing = self.find_new_replicaset(d, rs_list)
        old = [rs for rs in rs_list if existing is None or uid_of(rs) != uid_of(existing)]
        new_rs = await self.get_new_replicaset(d, existing, old, create)
        return new_rs, old

    async def get_new_replicaset(self, d: Obj, existing: Obj | None, old_rss: list[Obj],
                                 create: bool) -> Obj | None:
        new_revision = str(max((revision_of(rs) for rs in old_rss), default=0) + 1)
        if existing is not None:
            rs = deep_copy(existing)
            changed = self._set_new_rs_annotations(d, rs, new_revision, exists=True)
            min_ready = (d.get("spec") or {}).get("minReadySeconds") or 0
            if changed or ((rs.get("spec") or {}).get("minReadySeconds") or 0) != min_ready:
                rs["spec"]["minReadySeconds"] = min_ready
                return await self.client.update(REPLICASETS, rs)
            await self._set_deployment_revision(d, _ann(rs).get(REVISION, ""))
            status = d.setdefault("status", {})
            if progress_deadline(d) is not None and find_condition(status, "Progressing") is None:
                set_condition(status, self._new_condition("Progressing", "True", FOUND_NEW_RS_REASON,
                                                    f'Found new replica set "{name_of(rs)}"'))
                d.update(await self.client.update(DEPLOYMENTS, d, subresource="status"))
            return existing
        if not create:
            return None
        spec = d.get("spec") or {}
        collision = (d.get("status") or {}).get("collisionCount")
        template = deep_copy(spec.get("template") or {})
        pod_hash = compute_hash(template, collision)
        template.setdefault("metadata", {}).setdefault("labels", {})[POD_TEMPLATE_HASH] = pod_hash
        selector = deep_copy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[POD_TEMPLATE_HASH] = pod_hash
        name = f"{name_of(d)}-{pod_hash}"
        rs: Obj = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": ns_of(d),
                         "labels": dict(template["metadata"]["labels"]),
                         "ownerReferences": [new_controller_ref(d, "apps/v1", "Deployment")]},
            "spec": {"replicas": 0, "minReadySeconds": spec.get("minReadySeconds") or 0,
                     "selector": selector, "template": template},
        }
        replicas = new_rs_new_replicas(d, old_rss, rs)
        rs["spec"]["replicas"] = replicas
        self._set_new_rs_annotations(d, rs, new_revision, exists=False)
        already_exists = False
        try:
            created = await self.client.create(REPLICASETS, rs, ns_of(d))
        except StatusError as err:
            if err.code != 409 or err.reason != "AlreadyExists":
                status = d.setdefault("status", {})
                if progress_deadline(d) is not None:
                    set_condition(status, self._new_condition("Progressing", "False", FAILED_RS_CREATE_REASON,
                                                        f'Failed to create new replica set "{name}": {err.message}'))
                    await self.client.update(DEPLOYMENTS, d, subresource="status")
                self.recorder.event(d, "Warning", "FailedCreate",
                                          f'Failed to create new replica set "{name}": {err.message}')
                raise
            live = await self.client.get(REPLICASETS, name, ns_of(d))
            ref = controller_ref(live)
            if (ref is not None and ref.get("uid") == uid_of(d)
                    and equal_ignore_hash((live.get("spec") or {}).get("template"), spec.get("template"))):
                created, already_exists = live, True
            else:
                # A hash collision: bump collisionCount and retry with a new name.
                status = d.setdefault("status", {})
                status["collisionCount"] = int(status.get("collisionCount") or 0) + 1
                await self.client.update(DEPLOYMENTS, d, subresource="status")
                raise RuntimeError(f"hash collision creating replica set {name!r}; collisionCount bumped") from err
        if not already_exists and replicas > 0:
            self.recorder.event(d, "Normal", "ScalingReplicaSet",
                                      f"Scaled up replica set {name} to {replicas} from 0")
        await self._set_deployment_revision(d, new_revision)
        if not already_exists and progress_deadline(d) is not None:
            status = d.setdefault("status", {})
            set_condition(status, self._new_condition("Progressing", "True", NEW_RS_REASON,
                                                f'Created new replica set "{name}"'))
            d.update(await self.client.update(DEPLOYMENTS, d, subresource="status"))
        return created

    def _set_new_rs_annotations(self, d: Obj, rs: Obj, new_revision: str, *, exists: bool) -> bool:
        md = rs.setdefault("metadata", {})
        anns = md.setdefault("annotations", {})
        changed = False
        for k, v in _ann(d).items():
            if k in _NOT_COPIED or anns.get(k) == v:
                continue
            anns[k] = v
            changed = True
        old_revision = anns.get(REVISION, "")
        try:
            old_int = int(old_revision) if old_revision else 0
        except ValueError:
            return False
        if old_int < int(new_revision):
            anns[REVISION] = new_revision
            changed = True
            if old_revision:
                history = anns.get(REVISION_HISTORY)
                anns[REVISION_HISTORY] = f"{history},{old_revision}" if history else old_revision
        if not exists and self._set_replicas_annotations(rs, d):
            changed = True
        if not anns:
            md.pop("annotations")
        return changed

    @staticmethod
    def _set_replicas_annotations(rs: Obj, d: Obj) -> bool:
        anns = rs.setdefault("metadata", {}).setdefault("annotations", {})
        desired = str(spec_replicas(d))
        maximum = str(spec_replicas(d) + max_surge(d))
        changed = anns.get(DESIRED_REPLICAS) != desired or anns.get(MAX_REPLICAS) != maximum
        anns[DESIRED_REPLICAS] = desired
        anns[MAX_REPLICAS] = maximum
        return changed

    async def _set_deployment_revision(self, d: Obj, revision: str) -> None:
        if not revision or _ann(d).get(REVISION) == revision:
            return
        # an update, as upstream's controller (its role may update deployments, not patch them)
        md = dict(d.get("metadata") or {})
        md["annotations"] = {**(md.get("annotations") or {}), REVISION: revision}
        updated = await self.client.update(DEPLOYMENTS, {**d, "metadata": md})
        d["metadata"] = updated["metadata"]

    # -------------------------------------------------------------- scaling

    async def scale_replicaset(self, rs: Obj, new_scale: int, d: Obj, operation: str) -> tuple[bool, Obj]:
        """Set replicas and the desired/max annotations; event on a size change."""
        old_scale = spec_replicas(rs)
        size_changed = old_scale != new_scale
        anns = _ann(rs)
        ann_changed = (anns.get(DESIRED_REPLICAS) != str(spec_replicas(d))
                       or anns.get(MAX_REPLICAS) != str(spec_replicas(d) + max_surge(d)))
        if not size_changed and not ann_changed:
            return False, rs
        new = deep_copy(rs)
        new["spec"]["replicas"] = new_scale
        self._set_replicas_annotations(new, d)
        updated = await self.client.update(REPLICASETS, new)
        if size_changed:
            self.recorder.event(d, "Normal", "ScalingReplicaSet",
                                      f"Scaled {operation} replica set {name_of(rs)} to {new_scale} from {old_scale}")
        return size_changed, updated

    async def scale_and_record(self, rs: Obj, new_scale: int, d: Obj) -> tuple[bool, Obj]:
        if spec_replicas(rs) == new_scale:
            return False, rs
        op = "up" if spec_replicas(rs) < new_scale else "down"
        return await self.scale_replicaset(rs, new_scale, d, op)

    async def is_scaling_event(self, d: Obj, rs_list: list[Obj]) -> bool:
        new_rs, old_rss = await self.get_all_replicasets(d, rs_list, create=False)
        for rs in active(old_rss + ([new_rs] if new_rs else [])):
            desired = _int_ann(rs, DESIRED_REPLICAS)
            if desired is not None and desired != spec_replicas(d):
                return True
        return False

    async def sync_scale(self, d: Obj, rs_list: list[Obj]) -> None:
        """Scaling event or paused deployment: scale, clean up, write status."""
        new_rs, old_rss = await self.get_all_replicasets(d, rs_list, create=False)
        await self.scale(d, new_rs, old_rss)
        if (d.get("spec") or {}).get("paused"):
            await self.cleanup(d, old_rss)
        await self.sync_deployment_status(old_rss + ([new_rs] if new_rs else []), new_rs, d)

    async def scale(self, d: Obj, new_rs: Obj | None, old_rss: list[Obj]) -> None:
        """Upstream ``scale``: one active ReplicaSet takes the whole size;
        during a rollout, extra or missing replicas are spread proportionally."""
        replicas = spec_replicas(d)
        target = self._active_or_latest(new_rs, old_rss)
        if target is not None:
            if spec_replicas(target) != replicas:
                await self.scale_and_record(target, replicas, d)
            return
        if self._is_saturated(d, new_rs):
            for rs in active(old_rss):
                await self.scale_and_record(rs, 0, d)
            return
        if _rolling(d) is None:
            return
        all_rss = active(old_rss + ([new_rs] if new_rs else []))
        allowed = replicas + max_surge(d) if replicas > 0 else 0
        to_add = allowed - replica_count(all_rss)
        if to_add > 0:
            all_rss.sort(key=lambda rs: _created(rs), reverse=True)
            all_rss.sort(key=lambda rs: spec_replicas(rs), reverse=True)
            operation = "up"
        elif to_add < 0:
            all_rss.sort(key=_created)
            all_rss.sort(key=lambda rs: spec_replicas(rs), reverse=True)
            operation = "down"
        else:
            return
        added = 0
        sizes: dict[str, int] = {}
        for rs in all_rss:
            proportion = self._proportion(rs, d, to_add, added)
            sizes[name_of(rs)] = spec_replicas(rs) + proportion
            added += proportion
        if all_rss:
            leftover = to_add - added
            first = name_of(all_rss[0])
            sizes[first] = max(sizes[first] + leftover, 0)
        for rs in all_rss:
            await self.scale_replicaset(rs, sizes[name_of(rs)], d, operation)

    def _proportion(self, rs: Obj, d: Obj, to_add: int, added: int) -> int:
        if spec_replicas(rs) == 0 or to_add == 0 or to_add == added:
            return 0
        fraction = self._fraction(rs, d)
        allowed = to_add - added
        return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)

    def _fraction(self, rs: Obj, d: Obj) -> int:
        if spec_replicas(d) == 0:
            return -spec_replicas(rs)
        deployment_replicas = spec_replicas(d) + max_surge(d)
        annotated = _int_ann(rs, MAX_REPLICAS)
        if annotated is None:
            annotated = int((d.get("status") or {}).get("replicas") or 0)
        if annotated == 0:
            return 0
        return _round_half_away(spec_replicas(rs) * deployment_replicas / annotated) - spec_replicas(rs)

    @staticmethod
    def _active_or_latest(new_rs: Obj | None, old_rss: list[Obj]) -> Obj | None:
        if new_rs is None and not old_rss:
            return None
        olds = sorted(old_rss, key=_created, reverse=True)
        live = active(([new_rs] if new_rs else []) + olds)
        if not live:
            return new_rs if new_rs is not None else olds[0]
        if len(live) == 1:
            return live[0]
        return None

    @staticmethod
    def _is_saturated(d: Obj, rs: Obj | None) -> bool:
        if rs is None:
            return False
        desired = _int_ann(rs, DESIRED_REPLICAS)
        return (desired == spec_replicas(d) and spec_replicas(rs) == spec_replicas(d)
                and _st(rs, "availableReplicas") == spec_replicas(d))

    # -------------------------------------------------------------- rollout

    async def rollout_rolling(self, d: Obj, rs_list: list[Obj]) -> None:
        new_rs, old_rss = await self.get_all_replicasets(d, rs_list, create=True)
        assert new_rs is not None
        all_rss = old_rss + [new_rs]
        scaled_up, new_rs = await self.reconcile_new_replicaset(all_rss, new_rs, d)
        all_rss = old_rss + [new_rs]
        if scaled_up:
            await self.sync_rollout_status(all_rss, new_rs, d)
            return
        if await self.reconcile_old_replicasets(all_rss, active(old_rss), new_rs, d):
            await self.sync_rollout_status(all_rss, new_rs, d)
            return
        if deployment_complete(d, d.get("status") or {}):
            await self.cleanup(d, old_rss)
        await self.sync_rollout_status(all_rss, new_rs, d)

    async def reconcile_new_replicaset(self, all_rss: list[Obj], new_rs: Obj, d: Obj) -> tuple[bool, Obj]:
        replicas = spec_replicas(d)
        if spec_replicas(new_rs) == replicas:
            return False, new_rs
        if spec_replicas(new_rs) > replicas:
            return await self.scale_and_record(new_rs, replicas, d)
        count = new_rs_new_replicas(d, all_rss, new_rs)
        return await self.scale_and_record(new_rs, count, d)

    async def reconcile_old_replicasets(self, all_rss: list[Obj], old_rss: list[Obj], new_rs: Obj,
                                        d: Obj) -> bool:
        if replica_count(old_rss) == 0:
            return False
        min_available = spec_replicas(d) - max_unavailable(d)
        new_unavailable = spec_replicas(new_rs) - _st(new_rs, "availableReplicas")
        max_scaled_down = replica_count(all_rss) - min_available - new_unavailable
        if max_scaled_down <= 0:
            return False
        old_rss, cleaned = await self._cleanup_unhealthy(old_rss, d, max_scaled_down)
        all_rss = old_rss + [new_rs]
        scaled = await self._scale_down_old_for_rolling(all_rss, old_rss, d)
        return cleaned + scaled > 0

    async def _cleanup_unhealthy(self, old_rss: list[Obj], d: Obj, max_cleanup: int) -> tuple[list[Obj], int]:
        """Scale down old ReplicaSets' unavailable replicas first."""
        total = 0
        result: list[Obj] = []
        for rs in by_creation(old_rss):
            if total >= max_cleanup or spec_replicas(rs) == 0 or spec_replicas(rs) == _st(rs, "availableReplicas"):
                result.append(rs)
                continue
            down = min(max_cleanup - total, spec_replicas(rs) - _st(rs, "availableReplicas"))
            _, rs = await self.scale_and_record(rs, spec_replicas(rs) - down, d)
            total += down
            result.append(rs)
        return result, total

    async def _scale_down_old_for_rolling(self, all_rss: list[Obj], old_rss: list[Obj], d: Obj) -> int:
        min_available = spec_replicas(d) - max_unavailable(d)
        available = available_count(all_rss)
        if available <= min_available:
            return 0
        total_down = available - min_available
        total = 0
        for rs in by_creation(old_rss):
            if total >= total_down:
                break
            if spec_replicas(rs) == 0:
                continue
            down = min(spec_replicas(rs), total_down - total)
            await self.scale_and_record(rs, spec_replicas(rs) - down, d)
            total += down
        return total

    async def rollout_recreate(self, d: Obj, rs_list: list[Obj]) -> None:
        new_rs, old_rss = await self.get_all_replicasets(d, rs_list, create=False)
        all_rss = old_rss + ([new_rs] if new_rs else [])
        scaled_down = False
        for rs in active(old_rss):
            changed, _ = await self.scale_and_record(rs, 0, d)
            scaled_down = scaled_down or changed
        if scaled_down:
            await self.sync_rollout_status(all_rss, new_rs, d)
            return
        if self._old_pods_running(new_rs, old_rss):
            await self.sync_rollout_status(all_rss, new_rs, d)
            return
        if new_rs is None:
            new_rs, old_rss = await self.get_all_replicasets(d, rs_list, create=True)
            assert new_rs is not None
            all_rss = old_rss + [new_rs]
        _, new_rs = await self.scale_and_record(new_rs, spec_replicas(d), d)
        all_rss = old_rss + [new_rs]
        if deployment_complete(d, d.get("status") or {}):
            await self.cleanup(d, old_rss)
        await self.sync_rollout_status(all_rss, new_rs, d)

    def _old_pods_running(self, new_rs: Obj | None, old_rss: list[Obj]) -> bool:
        if actual_count(old_rss) > 0:
            return True
        for rs in old_rss:
            if new_rs is not None and uid_of(rs) == uid_of(new_rs):
                continue
            for pod in self.pod_informer.indexer.by_index(CONTROLLER_UID_INDEX, uid_of(rs)):
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    return True
        return False

    # -------------------------------------------------------------- cleanup

    async def cleanup(self, d: Obj, old_rss: list[Obj]) -> None:
        """Keep at most ``revisionHistoryLimit`` old, scaled-down ReplicaSets."""
        limit = (d.get("spec") or {}).get("revisionHistoryLimit")
        if limit is None:
            return
        alive = [rs for rs in old_rss if not md_of(rs).get("deletionTimestamp")]
        diff = len(alive) - int(limit)
        if diff <= 0:
            return
        alive.sort(key=lambda rs: (revision_of(rs), _created(rs)))
        for rs in alive[:diff]:
            if (_st(rs, "replicas") != 0 or spec_replicas(rs) != 0
                    or (md_of(rs).get("generation") or 0) > _st(rs, "observedGeneration")):
                continue
            try:
                await self.client.delete(REPLICASETS, name_of(rs), ns_of(rs), preconditions={"uid": uid_of(rs)})
            except StatusError as err:
                if err.code != 404:
                    raise

    # --------------------------------------------------------------- status

    def calculate_status(self, all_rss: list[Obj], new_rs: Obj | None, d: Obj) -> Obj:
        available = available_count(all_rss)
        total = replica_count(all_rss)
        old = d.get("status") or {}
        status: Obj = {
            "observedGeneration": md_of(d).get("generation") or 0,
            "replicas": actual_count(all_rss),
            "updatedReplicas": actual_count([new_rs]) if new_rs else 0,
            "readyReplicas": ready_count(all_rss),
            "availableReplicas": available,
            "unavailableReplicas": max(total - available, 0),
        }
        if old.get("collisionCount") is not None:
            status["collisionCount"] = old["collisionCount"]
        if old.get("conditions"):
            status["conditions"] = deep_copy(old["conditions"])
        if available >= spec_replicas(d) - max_unavailable(d):
            set_condition(status, self._new_condition("Available", "True", MIN_AVAILABLE_REASON,
                                                "Deployment has minimum availability."))
        else:
            set_condition(status, self._new_condition("Available", "False", MIN_UNAVAILABLE_REASON,
                                                "Deployment does not have minimum availability."))
        return status

    async def sync_deployment_status(self, all_rss: list[Obj], new_rs: Obj | None, d: Obj) -> None:
        status = _compact(self.calculate_status(all_rss, new_rs, d))
        await self._write_status(d, status)

    async def sync_rollout_status(self, all_rss: list[Obj], new_rs: Obj | None, d: Obj) -> None:
        status = self.calculate_status(all_rss, new_rs, d)
        deadline = progress_deadline(d)
        if deadline is None:
            remove_condition(status, "Progressing")
        current = find_condition(d.get("status") or {}, "Progressing")
        complete = (status["replicas"] == status["updatedReplicas"] and current is not None
                    and current.get("reason") == NEW_RS_AVAILABLE_REASON)
        what = f'ReplicaSet "{name_of(new_rs)}"' if new_rs else f'Deployment "{name_of(d)}"'
        if deadline is not None and not complete:
            if deployment_complete(d, status):
                set_condition(status, self._new_condition("Progressing", "True", NEW_RS_AVAILABLE_REASON,
                                                    f"{what} has successfully progressed."))
            elif deployment_progressing(d, status):
                cond = self._new_condition("Progressing", "True", RS_UPDATED_REASON, f"{what} is progressing.")
                if current is not None and current.get("status") == "True":
                    cond["lastTransitionTime"] = current.get("lastTransitionTime", cond["lastTransitionTime"])
                remove_condition(status, "Progressing")
                set_condition(status, cond)
            elif deployment_timed_out(d, status, self.clock()):
                set_condition(status, self._new_condition("Progressing", "False", TIMED_OUT_REASON,
                                                    f"{what} has timed out progressing."))
        failures = [find_condition(rs.get("status") or {}, "ReplicaFailure") for rs in all_rss]
        failure = next((c for c in failures if c is not None), None)
        if failure is not None:
            set_condition(status, {"type": "ReplicaFailure", "status": failure.get("status", "True"),
                                   "lastUpdateTime": failure.get("lastTransitionTime", format_time(self.clock())),
                                   "lastTransitionTime": failure.get("lastTransitionTime", format_time(self.clock())),
                                   "reason": failure.get("reason", ""), "message": failure.get("message", "")})
        else:
            remove_condition(status, "ReplicaFailure")
        status = _compact(status)
        if not await self._write_status(d, status):
            self._requeue_stuck(d, status)

    async def _write_status(self, d: Obj, status: Obj) -> bool:
        """Write ``status`` unless unchanged; returns whether it was written."""
        if status == (d.get("status") or {}):
            return False
        new = deep_copy(d)
        new["status"] = status
        try:
            updated = await self.client.update(DEPLOYMENTS, new, subresource="status")
        except StatusError as err:
            if err.code == 404:
                return False
            raise
        d.update(updated)
        return True

    def _requeue_stuck(self, d: Obj, status: Obj) -> None:
        """Check the progress deadline again when it would expire."""
        deadline = progress_deadline(d)
        cond = find_condition(status, "Progressing")
        if deadline is None or cond is None:
            return
        if cond.get("reason") in (NEW_RS_AVAILABLE_REASON, TIMED_OUT_REASON) or deployment_complete(d, status):
            return
        try:
            since = parse_time(cond.get("lastUpdateTime") or "")
        except ValueError:
            return
        after = (since + _dt.timedelta(seconds=deadline) - self.clock()).total_seconds()
        if after < 1:
            self.deployments.add_after(key_of(d), 1.0)
        else:
            self.deployments.add_after(key_of(d), after)

    async def check_paused_conditions(self, d: Obj) -> None:
        if progress_deadline(d) is None:
            return
        status = d.setdefault("status", {})
        cond = find_condition(status, "Progressing")
        if cond is not None and cond.get("reason") == TIMED_OUT_REASON:
            return
        paused = bool((d.get("spec") or {}).get("paused"))
        paused_cond = cond is not None and cond.get("reason") == PAUSED_REASON
        if paused and not paused_cond:
            set_condition(status, self._new_condition("Progressing", "Unknown", PAUSED_REASON, "Deployment is paused"))
        elif not paused and paused_cond:
            set_condition(status, self._new_condition("Progressing", "Unknown", RESUMED_REASON, "Deployment is resumed"))
        else:
            return
        d.update(await self.client.update(DEPLOYMENTS, d, subresource="status"))


__all__ = [
    "DeploymentController", "compute_hash", "equal_ignore_hash", "fnv32a", "max_surge", "max_unavailable",
    "resolve_fenceposts", "safe_encode_string", "scaled_value",
]
