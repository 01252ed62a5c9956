"""The ReplicaSet controller, after upstream's ``pkg/controller/replicaset``.

One queue of ReplicaSet keys (``namespace/name``). A sync:

* claims pods: adopts orphans matching the selector (controller
  ownerReference) and releases owned pods that no longer match;
* when the expectations for the key are satisfied (no creations or
  deletions still in flight), creates or deletes pods to reach
  ``spec.replicas`` — creations in slow-start batches (1, 2, 4, ...),
  deletions of the least valuable pods first;
* writes ``status`` (replicas, fullyLabeledReplicas, readyReplicas,
  availableReplicas, observedGeneration, the ReplicaFailure condition).

Terminating pods (``deletionTimestamp`` set) and finished pods
(Succeeded/Failed) do not count as replicas.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import math
import time
from typing import Any, Callable, Iterable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, format_time, parse_time, utcnow
from kubeplane.api.resources import resource
from kubeplane.api.selectors import LabelSelector, label_selector_from_dict
from kubeplane.client.informer import SharedInformer, SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

PODS = resource("pods")
REPLICASETS = resource("replicasets")

#: Informer index on pods (and replica sets): uid of the controlling owner.
CONTROLLER_UID_INDEX = "controller-uid"
#: Informer index: namespace.
NAMESPACE_INDEX = "namespace"

#: Upstream's ``ExpectationsTimeout``: stale expectations stop blocking after this.
EXPECTATIONS_TIMEOUT = 300.0
#: Upstream's ``BurstReplicas``: most creations/deletions in one sync.
BURST_REPLICAS = 500
#: Slow start: the first create batch has this many pods.
SLOW_START_INITIAL_BATCH_SIZE = 1

POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


# ------------------------------------------------------------ small helpers


def md_of(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def name_of(obj: Obj) -> str:
    return md_of(obj).get("name", "")


def ns_of(obj: Obj) -> str:
    return md_of(obj).get("namespace", "")


def uid_of(obj: Obj) -> str:
    return md_of(obj).get("uid", "")


def key_of(obj: Obj) -> str:
    return f"{ns_of(obj)}/{name_of(obj)}"


def controller_ref(obj: Obj) -> Obj | None:
    """The ownerReference with ``controller: true``, if any."""
    for ref in md_of(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def controller_uid_index(obj: Obj) -> list[str]:
    ref = controller_ref(obj)
    return [ref["uid"]] if ref and ref.get("uid") else []


def namespace_index(obj: Obj) -> list[str]:
    return [ns_of(obj)]


def add_indexers(informer: SharedInformer, indexers: dict[str, Callable[[Obj], list[str]]]) -> None:
    """Add indexers a shared informer may already have (same name, same meaning)."""
    for name, fn in indexers.items():
        try:
            informer.add_indexers({name: fn})
        except ValueError:
            pass


def new_controller_ref(owner: Obj, api_version: str, kind: str) -> Obj:
    return {
        "apiVersion": api_version, "kind": kind, "name": name_of(owner), "uid": uid_of(owner),
        "controller": True, "blockOwnerDeletion": True,
    }


def selector_of(obj: Obj) -> LabelSelector:
    """The compiled ``spec.selector`` (a malformed one matches nothing)."""
    try:
        return label_selector_from_dict((obj.get("spec") or {}).get("selector"))
    except StatusError:
        return label_selector_from_dict(None)


def pod_condition(pod: Obj, type_: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_pod_active(pod: Obj) -> bool:
    """Not finished and not terminating (upstream ``IsPodActive``)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not md_of(pod).get("deletionTimestamp")


def is_pod_ready(pod: Obj) -> bool:
    c = pod_condition(pod, "Ready")
    return c is not None and c.get("status") == "True"


def _ts(value: str | None) -> _dt.datetime | None:
    if not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def is_pod_available(pod: Obj, min_ready_seconds: int, now: _dt.datetime) -> bool:
    """Ready for at least ``min_ready_seconds``."""
    if not is_pod_ready(pod):
        return False
    if min_ready_seconds <= 0:
        return True
    c = pod_condition(pod, "Ready") or {}
    since = _ts(c.get("lastTransitionTime"))
    return since is not None and since + _dt.timedelta(seconds=min_ready_seconds) < now


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def spec_replicas(obj: Obj) -> int:
    r = (obj.get("spec") or {}).get("replicas")
    return 1 if r is None else _int(r, 1)


def find_condition(status: Obj, type_: str) -> Obj | None:
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def remove_condition(status: Obj, type_: str) -> None:
    conds = [c for c in status.get("conditions") or [] if c.get("type") != type_]
    if conds:
        status["conditions"] = conds
    else:
        status.pop("conditions", None)


# ------------------------------------------------------------- expectations


class Expectations:
    """Creations and deletions a controller has asked for but not yet seen
    through its informer (upstream ``UIDTrackingControllerExpectations``).

    Deletions are tracked by pod key so that a pod seen deleted twice (its
    ``deletionTimestamp`` appears, then it is removed) counts once.
    """

    def __init__(self, timeout: float = EXPECTATIONS_TIMEOUT, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._adds: dict[str, int] = {}
        self._dels: dict[str, set[str]] = {}
        self._stamp: dict[str, float] = {}

    def satisfied(self, key: str) -> bool:
        if key not in self._stamp:
            return True
        if self._adds.get(key, 0) <= 0 and not self._dels.get(key):
            return True
        return self._clock() - self._stamp[key] > self.timeout

    def expect_creations(self, key: str, count: int) -> None:
        self._adds[key] = count
        self._dels[key] = set()
        self._stamp[key] = self._clock()

    def expect_deletions(self, key: str, pod_keys: Iterable[str]) -> None:
        self._adds[key] = 0
        self._dels[key] = set(pod_keys)
        self._stamp[key] = self._clock()

    def creation_observed(self, key: str, count: int = 1) -> None:
        if key in self._adds:
            self._adds[key] -= count

    def deletion_observed(self, key: str, pod_key: str) -> None:
        dels = self._dels.get(key)
        if dels is not None:
            dels.discard(pod_key)

    def pending(self, key: str) -> tuple[int, int]:
        """``(creations, deletions)`` still expected."""
        return max(self._adds.get(key, 0), 0), len(self._dels.get(key) or ())

    def delete(self, key: str) -> None:
        self._adds.pop(key, None)
        self._dels.pop(key, None)
        self._stamp.pop(key, None)


# ------------------------------------------------------- deletion ranking


def _log2_bucket(t: _dt.datetime | None, now: _dt.datetime) -> int:
    """Upstream's logarithmic scale-down: compare ages by power-of-two buckets."""
    if t is None:
        return -1
    age = (now - t).total_seconds()
    return int(math.log2(age)) if age >= 1 else 0


def pod_deletion_rank(pod: Obj, co_located: int, now: _dt.datetime) -> tuple[Any, ...]:
    """Sort key: pods that sort first are deleted first (upstream
    ``ActivePodsWithRanks``): unscheduled, pending < unknown < running, not
    ready, lower deletion cost, more pods of the family on the same node,
    ready for less time, more restarts, created more recently."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    scheduled = 1 if spec.get("nodeName") else 0
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}.get(status.get("phase") or "Pending", 0)
    ready = is_pod_ready(pod)
    cost = _int((md_of(pod).get("annotations") or {}).get(POD_DELETION_COST), 0)
    ready_since = _ts((pod_condition(pod, "Ready") or {}).get("lastTransitionTime")) if ready else None
    # Longer ready (older bucket) is more valuable: negate so newer sorts first.
    ready_bucket = -_log2_bucket(ready_since, now) if ready_since else 0
    restarts = max((_int(c.get("restartCount")) for c in status.get("containerStatuses") or []), default=0)
    created = _ts(md_of(pod).get("creationTimestamp"))
    created_bucket = -_log2_bucket(created, now) if created else 0
    return (scheduled, phase_rank, 1 if ready else 0, cost, -co_located, ready_bucket, -restarts,
            created_bucket, name_of(pod))


def pods_to_delete(pods: list[Obj], related: list[Obj], count: int, now: _dt.datetime | None = None) -> list[Obj]:
    """The ``count`` pods to delete first; ``related`` pods (the whole
    family, e.g. all replica sets of a deployment) rank co-location."""
    now = now or utcnow()
    per_node: dict[str, int] = {}
    for p in related:
        node = (p.get("spec") or {}).get("nodeName")
        if node and is_pod_active(p):
            per_node[node] = per_node.get(node, 0) + 1

    def rank(p: Obj) -> tuple[Any, ...]:
        node = (p.get("spec") or {}).get("nodeName")
        return pod_deletion_rank(p, per_node.get(node, 0) if node else 0, now)

    return sorted(pods, key=rank)[:count]


# -------------------------------------------------------------- controller


class ReplicaSetController(Controller):
    """Keeps ``spec.replicas`` pods running for every ReplicaSet.

    The same loop serves ReplicationControllers (upstream runs its
    ReplicaSet controller for them too): a subclass names the owner kind
    in the class attributes below and says how its selector reads."""

    #: the kind this controller manages
    owner_resource = REPLICASETS
    owner_api_version = "apps/v1"
    owner_kind = "ReplicaSet"
    queue_name = "replicasets"

    def selector_of(self, owner: Obj) -> LabelSelector:
        """The owner's compiled pod selector."""
        return selector_of(owner)

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 1,
        burst_replicas: int = BURST_REPLICAS,
        name: str = "replicaset-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.burst_replicas = burst_replicas
        self.expectations = Expectations()
        self.rs_informer = self.factory.informer_for(self.owner_resource)
        self.pod_informer = self.factory.informer_for(PODS)
        add_indexers(self.rs_informer, {NAMESPACE_INDEX: namespace_index, CONTROLLER_UID_INDEX: controller_uid_index})
        add_indexers(self.pod_informer, {NAMESPACE_INDEX: namespace_index, CONTROLLER_UID_INDEX: controller_uid_index})
        self.replicasets = self.add_queue(self.queue_name, self.sync)
        self.rs_informer.add_event_handler(self._rs_added, self._rs_updated, self._rs_deleted)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)

    # ------------------------------------------------------------- handlers

    def _rs_added(self, rs: Obj) -> None:
        self.replicasets.add(key_of(rs))

    def _rs_updated(self, old: Obj, new: Obj) -> None:
        if uid_of(old) != uid_of(new):
            self.expectations.delete(key_of(old))
        self.replicasets.add(key_of(new))

    def _rs_deleted(self, rs: Obj) -> None:
        rs = unwrap_deleted(rs)
        self.expectations.delete(key_of(rs))
        self.replicasets.add(key_of(rs))

    def _resolve(self, namespace: str, ref: Obj | None) -> Obj | None:
        """The ReplicaSet a controller ref points at, if it is one of ours."""
        group = self.owner_resource.group
        if not ref or ref.get("kind") != self.owner_kind or (
                group and not str(ref.get("apiVersion", "")).startswith(group + "/")):
            return None
        rs = self.rs_informer.indexer.get_by_key(f"{namespace}/{ref.get('name', '')}")
        if rs is None or uid_of(rs) != ref.get("uid"):
            return None
        return rs

    def _matching_replicasets(self, pod: Obj) -> list[Obj]:
        labels = md_of(pod).get("labels") or {}
        if not labels:
            return []
        return [rs for rs in self.rs_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(pod))
                if self.selector_of(rs).matches(labels)]

    def _pod_added(self, pod: Obj) -> None:
        if md_of(pod).get("deletionTimestamp"):
            self._pod_deleted(pod)
            return
        rs = self._resolve(ns_of(pod), controller_ref(pod))
        if rs is not None:
            self.expectations.creation_observed(key_of(rs))
            self.replicasets.add(key_of(rs))
            return
        if controller_ref(pod) is None:
            for rs in self._matching_replicasets(pod):
                self.replicasets.add(key_of(rs))

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if md_of(old).get("resourceVersion") == md_of(new).get("resourceVersion"):
            return
        if md_of(new).get("deletionTimestamp") and not md_of(old).get("deletionTimestamp"):
            self._pod_deleted(new)
            return
        old_ref, new_ref = controller_ref(old), controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            old_rs = self._resolve(ns_of(old), old_ref)
            if old_rs is not None:
                self.replicasets.add(key_of(old_rs))
        rs = self._resolve(ns_of(new), new_ref)
        if rs is not None:
            self.replicasets.add(key_of(rs))
            min_ready = _int((rs.get("spec") or {}).get("minReadySeconds"))
            if min_ready > 0 and not is_pod_ready(old) and is_pod_ready(new):
                self.replicasets.add_after(key_of(rs), min_ready + 1)
            return
        labels_changed = (md_of(old).get("labels") or {}) != (md_of(new).get("labels") or {})
        if new_ref is None and (labels_changed or old_ref is not None):
            for rs in self._matching_replicasets(new):
                self.replicasets.add(key_of(rs))

    def _pod_deleted(self, pod: Obj) -> None:
        pod = unwrap_deleted(pod)
        rs = self._resolve(ns_of(pod), controller_ref(pod))
        if rs is None:
            return
        self.expectations.deletion_observed(key_of(rs), key_of(pod))
        self.replicasets.add(key_of(rs))

    # ----------------------------------------------------------------- sync

    async def sync(self, key: str) -> None:
        rs = self.rs_informer.indexer.get_by_key(key)
        if rs is None:
            self.expectations.delete(key)
            return
        need_sync = self.expectations.satisfied(key)
        selector = self.selector_of(rs)
        namespace = ns_of(rs)
        active = [p for p in self.pod_informer.indexer.by_index(NAMESPACE_INDEX, namespace) if is_pod_active(p)]
        pods = await self.claim_pods(rs, selector, active)
        err: Exception | None = None
        diff = 0
        if need_sync and not md_of(rs).get("deletionTimestamp"):
            diff = len(pods) - spec_replicas(rs)
            try:
                await self.manage_replicas(pods, rs)
            except Exception as exc:  # noqa: BLE001 - reported in status, then retried
                err = exc
        rs = self.rs_informer.indexer.get_by_key(key) or rs
        status = self.calculate_status(rs, pods, err, diff)
        updated = await self._update_status(rs, status)
        min_ready = _int((rs.get("spec") or {}).get("minReadySeconds"))
        if (err is None and min_ready > 0 and updated.get("readyReplicas", 0) == spec_replicas(rs)
                and updated.get("availableReplicas", 0) != spec_replicas(rs)):
            self.replicasets.add_after(key, min_ready)
        if err is not None:
            raise err

    async def claim_pods(self, rs: Obj, selector: LabelSelector, pods: list[Obj]) -> list[Obj]:
        """Adopt matching orphans, release non-matching owned pods; returns the
        pods this ReplicaSet controls afterwards."""
        uid = uid_of(rs)
        deleting = bool(md_of(rs).get("deletionTimestamp"))
        claimed: list[Obj] = []
        can_adopt: bool | None = None
        for pod in pods:
            ref = controller_ref(pod)
            matches = selector.matches(md_of(pod).get("labels") or {})
            if ref is not None:
                if ref.get("uid") != uid:
                    continue
                if matches:
                    claimed.append(pod)
                elif not deleting:
                    await self._release(pod, uid)
                continue
            if not matches or deleting or md_of(pod).get("deletionTimestamp"):
                continue
            if can_adopt is None:
                can_adopt = await self._recheck_owner(rs)
            if not can_adopt:
                continue
            adopted = await self._adopt(pod, rs)
            if adopted is not None:
                claimed.append(adopted)
        return claimed

    async def _recheck_owner(self, rs: Obj) -> bool:
        """Adoption needs a live ReplicaSet that is not being deleted."""
        try:
            fresh = await self.client.get(self.owner_resource, name_of(rs), ns_of(rs))
        except StatusError as err:
            if err.code == 404:
                return False
            raise
        return uid_of(fresh) == uid_of(rs) and not md_of(fresh).get("deletionTimestamp")

    async def _adopt(self, pod: Obj, rs: Obj) -> Obj | None:
        new = deep_copy(pod)
        refs = [r for r in md_of(new).get("ownerReferences") or [] if r.get("uid") != uid_of(rs)]
        refs.append(new_controller_ref(rs, self.owner_api_version, self.owner_kind))
        new["metadata"]["ownerReferences"] = refs
        try:
            return await self.client.update(PODS, new)
        except StatusError as err:
            if err.code in (404, 409):
                return None
            raise

    async def _release(self, pod: Obj, uid: str) -> None:
        new = deep_copy(pod)
        refs = [r for r in md_of(new).get("ownerReferences") or [] if r.get("uid") != uid]
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        try:
            await self.client.update(PODS, new)
        except StatusError as err:
            if err.code not in (404, 409):
                raise

    # ------------------------------------------------------ create / delete

    def pod_from_template(self, rs: Obj) -> Obj:
        tmpl = deep_copy((rs.get("spec") or {}).get("template") or {})
        tmd = tmpl.get("metadata") or {}
        md: Obj = {"generateName": f"{name_of(rs)}-", "namespace": ns_of(rs),
                   "ownerReferences": [new_controller_ref(rs, self.owner_api_version, self.owner_kind)]}
        for k in ("labels", "annotations", "finalizers"):
            if tmd.get(k):
                md[k] = tmd[k]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": tmpl.get("spec") or {}}

    async def manage_replicas(self, pods: list[Obj], rs: Obj) -> None:
        key = key_of(rs)
        diff = len(pods) - spec_replicas(rs)
        if diff < 0:
            count = min(-diff, self.burst_replicas)
            self.expectations.expect_creations(key, count)
            template = self.pod_from_template(rs)

            async def create_one() -> None:
                try:
                    created = await self.client.create(PODS, deep_copy(template), ns_of(rs))
                except StatusError as err:
                    if err.reason == "Forbidden" and "being terminated" in err.message:
                        # Namespace terminating: nothing to create, nothing to report.
                        self.expectations.creation_observed(key)
                        return
                    self.recorder.event(rs, "Warning", "FailedCreate", f"Error creating: {err.message}")
                    raise
                self.recorder.event(rs, "Normal", "SuccessfulCreate", f"Created pod: {name_of(created)}")

            created, err = await slow_start_batch(count, SLOW_START_INITIAL_BATCH_SIZE, create_one)
            skipped = count - created
            if skipped > 0:
                # Failed and never-attempted creations will not show up in the informer.
                self.expectations.creation_observed(key, skipped)
            if err is not None:
                raise err
        elif diff > 0:
            count = min(diff, self.burst_replicas)
            victims = pods_to_delete(pods, self._related_pods(rs), count)
            self.expectations.expect_deletions(key, [key_of(p) for p in victims])
            results = await asyncio.gather(*(self._delete_pod(rs, p) for p in victims), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]

    async def _delete_pod(self, rs: Obj, pod: Obj) -> None:
        try:
            await self.client.delete(PODS, name_of(pod), ns_of(pod), preconditions={"uid": uid_of(pod)})
        except StatusError as err:
            self.expectations.deletion_observed(key_of(rs), key_of(pod))
            if err.code == 404:
                return
            self.recorder.event(rs, "Warning", "FailedDelete", f"Error deleting: {err.message}")
            raise
        self.recorder.event(rs, "Normal", "SuccessfulDelete", f"Deleted pod: {name_of(pod)}")

    def _related_pods(self, rs: Obj) -> list[Obj]:
        """Active pods of every ReplicaSet sharing this one's controller."""
        ref = controller_ref(rs)
        siblings = [rs]
        if ref is not None and ref.get("uid"):
            siblings = self.rs_informer.indexer.by_index(CONTROLLER_UID_INDEX, ref["uid"]) or [rs]
        pods: list[Obj] = []
        for s in siblings:
            pods.extend(p for p in self.pod_informer.indexer.by_index(CONTROLLER_UID_INDEX, uid_of(s))
                        if is_pod_active(p))
        return pods

    # --------------------------------------------------------------- status

    def calculate_status(self, rs: Obj, pods: list[Obj], err: Exception | None, diff: int) -> Obj:
        now = utcnow()
        spec = rs.get("spec") or {}
        tmpl_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        min_ready = _int(spec.get("minReadySeconds"))
        fully = ready = available = 0
        for p in pods:
            labels = md_of(p).get("labels") or {}
            if all(labels.get(k) == v for k, v in tmpl_labels.items()):
                fully += 1
            if is_pod_ready(p):
                ready += 1
                if is_pod_available(p, min_ready, now):
                    available += 1
        status = deep_copy(rs.get("status") or {})
        status["replicas"] = len(pods)
        status["fullyLabeledReplicas"] = fully
        status["readyReplicas"] = ready
        status["availableReplicas"] = available
        generation = md_of(rs).get("generation")
        if generation is not None:
            status["observedGeneration"] = generation
        failure = find_condition(status, "ReplicaFailure")
        if err is not None and failure is None:
            reason = "FailedCreate" if diff < 0 else "FailedDelete"
            message = err.message if isinstance(err, StatusError) else str(err)
            status.setdefault("conditions", []).append({
                "type": "ReplicaFailure", "status": "True", "lastTransitionTime": format_time(now),
                "reason": reason, "message": message,
            })
        elif err is None and failure is not None:
            remove_condition(status, "ReplicaFailure")
        return status

    async def _update_status(self, rs: Obj, status: Obj) -> Obj:
        if status == (rs.get("status") or {}):
            return status
        new = dict(rs)
        new["status"] = status
        try:
            await self.client.update(self.owner_resource, new, subresource="status")
        except StatusError as err:
            if err.code == 404:
                return status
            raise
        return status


async def slow_start_batch(count: int, initial: int, fn: Callable[[], Any]) -> tuple[int, Exception | None]:
    """Call ``fn`` ``count`` times in batches of 1, 2, 4, ... running each batch
    concurrently; stop after the first batch with a failure. Returns the number
    of successful calls and the first error."""
    remaining = count
    successes = 0
    batch = min(remaining, initial)
    while batch > 0:
        results = await asyncio.gather(*(fn() for _ in range(batch)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        successes += batch - len(errors)
        if errors:
            err = errors[0]
            if not isinstance(err, Exception):
                raise err
            return successes, err
        remaining -= batch
        batch = min(2 * batch, remaining)
    return successes, None


__all__ = [
    "BURST_REPLICAS", "CONTROLLER_UID_INDEX", "Expectations", "NAMESPACE_INDEX", "ReplicaSetController",
    "controller_ref", "is_pod_active", "is_pod_available", "is_pod_ready", "new_controller_ref",
    "pods_to_delete", "slow_start_batch",
]
