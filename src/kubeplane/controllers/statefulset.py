"""The StatefulSet controller, after upstream's ``pkg/controller/statefulset``.

A StatefulSet owns pods with stable identities: ``<set>-<ordinal>`` for the
ordinals ``ordinals.start`` .. ``start + replicas - 1``, each with the
``statefulset.kubernetes.io/pod-name`` and ``apps.kubernetes.io/pod-index``
labels, ``hostname`` = its name and ``subdomain`` = ``serviceName`` (the
headless Service that gives them DNS names), and one PersistentVolumeClaim
``<template>-<set>-<ordinal>`` per volumeClaimTemplate, created before the pod
and kept across its restarts (the scheduler's volume binding then binds them).

Every template the set has had is a ControllerRevision
(:mod:`kubeplane.controllers.history`); pods carry the one they were made
from in ``controller-revision-hash``. A sync:

* adopts orphan revisions and claims pods (adopt matching orphans whose name
  has the set's prefix, release owned pods that no longer match);
* finds the current and update revisions (creating or renumbering the update
  revision, walking ``collisionCount`` past hash collisions);
* makes the replicas exist: ``OrderedReady`` one at a time in ordinal order,
  each Running and Ready (and available for ``minReadySeconds``) before the
  next, scale-down from the highest ordinal once the others are healthy;
  ``Parallel`` all at once. Failed and Succeeded pods are deleted and
  recreated;
* applies ``persistentVolumeClaimRetentionPolicy`` as owner references on
  the claims (``whenDeleted: Delete``: owned by the set; ``whenScaled:
  Delete``: owned by a condemned pod), which the garbage collector acts on;
* ``RollingUpdate``: deletes pods not at the update revision from the highest
  ordinal down to ``partition``, at most ``maxUnavailable`` unavailable at a
  time (MaxUnavailableStatefulSet's behaviour, which kubeplane has on);
  ``OnDelete``: pods are replaced at the update revision only once deleted;
* writes status (replicas, readyReplicas, currentReplicas, updatedReplicas,
  availableReplicas, currentRevision, updateRevision, collisionCount,
  observedGeneration) and keeps ``revisionHistoryLimit`` unused revisions.

Time (pod availability under ``minReadySeconds``) is read from ``clock``,
so tests move it instead of waiting.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import re
import time
from typing import Any, Awaitable, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, parse_time, utcnow
from kubeplane.api.patch import strategic_merge_patch
from kubeplane.api.resources import resource
from kubeplane.api.selectors import LabelSelector
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.history import (
    History,
    equal_revision,
    find_equal_revisions,
    new_controller_revision,
    revision_number,
    sort_controller_revisions,
    template_patch,
)
from kubeplane.controllers.replicaset import (
    CONTROLLER_UID_INDEX,
    NAMESPACE_INDEX,
    add_indexers,
    controller_ref,
    controller_uid_index,
    is_pod_available,
    is_pod_ready,
    key_of,
    md_of,
    name_of,
    namespace_index,
    new_controller_ref,
    ns_of,
    selector_of,
    uid_of,
)

log = logging.getLogger(__name__)

PODS = resource("pods")
PVCS = resource("persistentvolumeclaims")
STATEFULSETS = resource("statefulsets")
CONTROLLER_REVISIONS = resource("controllerrevisions")

API_VERSION = "apps/v1"
KIND = "StatefulSet"

POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REVISION_LABEL = "controller-revision-hash"

RETAIN = "Retain"
DELETE = "Delete"

#: upstream's MaxBatchSize for Parallel pod management
MAX_BATCH_SIZE = 500
#: writes not seen by the informers stop blocking syncs after this many seconds
EXPECTATIONS_TIMEOUT = 300.0

_STATEFUL_POD = re.compile(r"^(.*)-([0-9]+)$")


# ------------------------------------------------------------ identities


def parent_and_ordinal(pod: Obj) -> tuple[str, int]:
    """``(parent name, ordinal)`` from ``<parent>-<ordinal>``; ordinal -1 otherwise."""
    m = _STATEFUL_POD.match(name_of(pod))
    if not m:
        return "", -1
    ordinal = int(m.group(2))
    if ordinal > 2**31 - 1:
        return m.group(1), -1
    return m.group(1), ordinal


def ordinal_of(pod: Obj) -> int:
    return parent_and_ordinal(pod)[1]


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


def _spec(obj: Obj) -> Obj:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def replicas_of(sts: Obj) -> int:
    r = _spec(sts).get("replicas")
    return 1 if r is None else max(_int(r, 1), 0)


def start_ordinal(sts: Obj) -> int:
    ordinals = _spec(sts).get("ordinals")
    return max(_int(ordinals.get("start")), 0) if isinstance(ordinals, dict) else 0


def end_ordinal(sts: Obj) -> int:
    return start_ordinal(sts) + replicas_of(sts) - 1


def in_ordinal_range(pod: Obj, sts: Obj) -> bool:
    return start_ordinal(sts) <= ordinal_of(pod) <= end_ordinal(sts)


def pod_name(sts: Obj, ordinal: int) -> str:
    return f"{name_of(sts)}-{ordinal}"


def claim_templates(sts: Obj) -> list[Obj]:
    claims = _spec(sts).get("volumeClaimTemplates")
    return [c for c in claims if isinstance(c, dict)] if isinstance(claims, list) else []


def claim_template_name(claim: Obj) -> str:
    return md_of(claim).get("name", "")


def claim_name(sts: Obj, claim: Obj, ordinal: int) -> str:
    return f"{claim_template_name(claim)}-{name_of(sts)}-{ordinal}"


def is_member_of(sts: Obj, pod: Obj) -> bool:
    return parent_and_ordinal(pod)[0] == name_of(sts)


def _labels(obj: Obj) -> dict[str, str]:
    labels = md_of(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


def identity_matches(sts: Obj, pod: Obj) -> bool:
    parent, ordinal = parent_and_ordinal(pod)
    return (ordinal >= 0 and parent == name_of(sts) and name_of(pod) == pod_name(sts, ordinal)
            and ns_of(pod) == ns_of(sts) and _labels(pod).get(POD_NAME_LABEL) == name_of(pod))


def storage_matches(sts: Obj, pod: Obj) -> bool:
    ordinal = ordinal_of(pod)
    if ordinal < 0:
        return False
    volumes = {v.get("name"): v for v in _spec(pod).get("volumes") or [] if isinstance(v, dict)}
    for claim in claim_templates(sts):
        v = volumes.get(claim_template_name(claim))
        pvc = (v or {}).get("persistentVolumeClaim")
        if not isinstance(pvc, dict) or pvc.get("claimName") != claim_name(sts, claim, ordinal):
            return False
    return True


def retention_policy(sts: Obj) -> tuple[str, str]:
    """``(whenDeleted, whenScaled)``, Retain where unset."""
    policy = _spec(sts).get("persistentVolumeClaimRetentionPolicy")
    policy = policy if isinstance(policy, dict) else {}
    return policy.get("whenDeleted") or RETAIN, policy.get("whenScaled") or RETAIN


def pod_revision(pod: Obj) -> str:
    return _labels(pod).get(REVISION_LABEL, "")


def is_created(pod: Obj) -> bool:
    return bool((pod.get("status") or {}).get("phase"))


def _phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase") or ""


def is_terminating(pod: Obj) -> bool:
    return bool(md_of(pod).get("deletionTimestamp"))


def is_running_and_ready(pod: Obj) -> bool:
    return _phase(pod) == "Running" and is_pod_ready(pod)


def is_unavailable(pod: Obj, min_ready: int, now: _dt.datetime) -> bool:
    return not is_pod_available(pod, min_ready, now) or is_terminating(pod)


def allows_burst(sts: Obj) -> bool:
    return _spec(sts).get("podManagementPolicy") == "Parallel"


def update_strategy(sts: Obj) -> Obj:
    s = _spec(sts).get("updateStrategy")
    return s if isinstance(s, dict) else {}


def max_unavailable(sts: Obj, replica_count: int) -> int:
    """``rollingUpdate.maxUnavailable`` scaled to ``replica_count`` (rounded
    down, at least 1; 1 when unset)."""
    ru = update_strategy(sts).get("rollingUpdate")
    value = (ru or {}).get("maxUnavailable", 1) if isinstance(ru, dict) else 1
    if value is None:
        value = 1
    if isinstance(value, str) and value.endswith("%"):
        try:
            n = int(int(value[:-1]) * replica_count / 100)
        except ValueError:
            n = 1
    else:
        n = _int(value, 1)
    return max(n, 1)


def partition_of(sts: Obj) -> int:
    ru = update_strategy(sts).get("rollingUpdate")
    return max(_int(ru.get("partition")), 0) if isinstance(ru, dict) else 0


# ------------------------------------------------------------ revisions


def revision_patch(sts: Obj) -> Obj:
    """What a revision records (upstream ``getPatch``)."""
    return template_patch(_spec(sts).get("template"))


def new_revision(sts: Obj, revision: int, collision_count: int | None) -> Obj:
    labels = ((_spec(sts).get("template") or {}).get("metadata") or {}).get("labels")
    cr = new_controller_revision(sts, API_VERSION, KIND, labels if isinstance(labels, dict) else {},
                                 revision_patch(sts), revision, collision_count)
    annotations = md_of(sts).get("annotations")
    if isinstance(annotations, dict) and annotations:
        cr["metadata"]["annotations"] = dict(annotations)
    return cr


def apply_revision(sts: Obj, revision: Obj) -> Obj:
    """The set with the revision's template (upstream ``ApplyRevision``)."""
    data = revision.get("data")
    if not isinstance(data, dict):
        return deep_copy(sts)
    return strategic_merge_patch(deep_copy(sts), deep_copy(data), "apps", KIND)


def next_revision(revisions: list[Obj]) -> int:
    return revision_number(revisions[-1]) + 1 if revisions else 1


# ------------------------------------------------------------ new pods and claims


def new_stateful_pod(sts: Obj, ordinal: int) -> Obj:
    """Upstream ``newStatefulSetPod``: the template's pod with the set's
    identity and storage for ``ordinal``."""
    tmpl = deep_copy(_spec(sts).get("template") or {})
    tmd = tmpl.get("metadata") if isinstance(tmpl.get("metadata"), dict) else {}
    name = pod_name(sts, ordinal)
    md: Obj = {"name": name, "namespace": ns_of(sts),
               "ownerReferences": [new_controller_ref(sts, API_VERSION, KIND)]}
    for k in ("labels", "annotations", "finalizers"):
        if tmd.get(k):
            md[k] = tmd[k]
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": md,
                "spec": tmpl.get("spec") if isinstance(tmpl.get("spec"), dict) else {}}
    init_identity(sts, pod)
    update_storage(sts, pod)
    return pod


def update_identity(sts: Obj, pod: Obj) -> None:
    ordinal = ordinal_of(pod)
    md = pod.setdefault("metadata", {})
    md["name"] = pod_name(sts, ordinal)
    md["namespace"] = ns_of(sts)
    labels = md.get("labels")
    if not isinstance(labels, dict):
        labels = md["labels"] = {}
    labels[POD_NAME_LABEL] = md["name"]
    labels[POD_INDEX_LABEL] = str(ordinal)


def init_identity(sts: Obj, pod: Obj) -> None:
    update_identity(sts, pod)
    spec = pod.setdefault("spec", {})
    spec["hostname"] = name_of(pod)
    service = _spec(sts).get("serviceName")
    if service:
        spec["subdomain"] = service
    else:
        spec.pop("subdomain", None)


def claims_for(sts: Obj, pod: Obj) -> dict[str, Obj]:
    """Template name -> the claim the pod uses (upstream ``getPersistentVolumeClaims``)."""
    ordinal = ordinal_of(pod)
    match_labels = ((_spec(sts).get("selector") or {}).get("matchLabels") or {})
    out: dict[str, Obj] = {}
    for template in claim_templates(sts):
        claim = deep_copy(template)
        claim.pop("status", None)
        md = claim.get("metadata") if isinstance(claim.get("metadata"), dict) else {}
        claim["metadata"] = md
        md["name"] = claim_name(sts, template, ordinal)
        md["namespace"] = ns_of(sts)
        labels = md.get("labels") if isinstance(md.get("labels"), dict) else {}
        labels.update(match_labels)
        if labels:
            md["labels"] = labels
        claim["apiVersion"], claim["kind"] = "v1", "PersistentVolumeClaim"
        out[claim_template_name(template)] = claim
    return out


def update_storage(sts: Obj, pod: Obj) -> None:
    claims = claims_for(sts, pod)
    spec = pod.setdefault("spec", {})
    volumes = [{"name": name, "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
               for name, claim in claims.items()]
    volumes += [v for v in spec.get("volumes") or [] if not (isinstance(v, dict) and v.get("name") in claims)]
    if volumes:
        spec["volumes"] = volumes


def set_pod_revision(pod: Obj, revision: str) -> None:
    md = pod.setdefault("metadata", {})
    if not isinstance(md.get("labels"), dict):
        md["labels"] = {}
    md["labels"][REVISION_LABEL] = revision


def new_versioned_pod(current_set: Obj, update_set: Obj, current_revision: str, update_revision: str,
                      ordinal: int) -> Obj:
    """A missing replica: at the current revision below the partition (or,
    without rollingUpdate, below currentReplicas), else at the update revision."""
    strategy = update_strategy(current_set)
    ru = strategy.get("rollingUpdate")
    start = start_ordinal(current_set)
    current_replicas = _int((current_set.get("status") or {}).get("currentReplicas"))
    if ((strategy.get("type") == "RollingUpdate" and ru is None and ordinal < start + current_replicas)
            or (ru is not None and ordinal < start + partition_of(current_set))):
        pod = new_stateful_pod(current_set, ordinal)
        set_pod_revision(pod, current_revision)
        return pod
    pod = new_stateful_pod(update_set, ordinal)
    set_pod_revision(pod, update_revision)
    return pod


# ------------------------------------------------------------ claim ownership


def _matches_ref(ref: Obj, obj: Obj, api_version: str, kind: str) -> bool:
    return ref.get("apiVersion") == api_version and ref.get("kind") == kind and ref.get("name") == name_of(obj)


def _refs(obj: Obj) -> list[Obj]:
    return [r for r in md_of(obj).get("ownerReferences") or [] if isinstance(r, dict)]


def has_owner_ref(target: Obj, owner: Obj) -> bool:
    uid = uid_of(owner)
    return any(r.get("uid") == uid for r in _refs(target))


def has_stale_owner_ref(target: Obj, obj: Obj, api_version: str, kind: str) -> bool:
    for ref in _refs(target):
        if _matches_ref(ref, obj, api_version, kind):
            return ref.get("uid") != uid_of(obj)
    return False


def has_unexpected_controller(claim: Obj, sts: Obj, pod: Obj) -> bool:
    if retention_policy(sts) == (RETAIN, RETAIN):
        return False
    for ref in _refs(claim):
        if _matches_ref(ref, sts, API_VERSION, KIND):
            if ref.get("uid") != uid_of(sts):
                return True
            continue
        if _matches_ref(ref, pod, "v1", "Pod"):
            if ref.get("uid") != uid_of(pod):
                return True
            continue
        if ref.get("controller"):
            return True
    return False


def has_non_controller_owner(claim: Obj, sts: Obj, pod: Obj) -> bool:
    return any(r.get("uid") in (uid_of(sts), uid_of(pod)) and not r.get("controller") for r in _refs(claim))


def claim_owner_up_to_date(claim: Obj, sts: Obj, pod: Obj) -> bool:
    if has_stale_owner_ref(claim, sts, API_VERSION, KIND) or has_stale_owner_ref(claim, pod, "v1", "Pod"):
        return True  # a stale ref: the garbage collector's to clean up, not ours
    if has_unexpected_controller(claim, sts, pod):
        return not (has_owner_ref(claim, sts) or has_owner_ref(claim, pod))
    if has_non_controller_owner(claim, sts, pod):
        return False
    when_deleted, when_scaled = retention_policy(sts)
    scaled_down = not in_ordinal_range(pod, sts)
    if when_scaled == DELETE and when_deleted == DELETE:
        return scaled_down != has_owner_ref(claim, sts) and scaled_down == has_owner_ref(claim, pod)
    if when_scaled == DELETE:
        return not has_owner_ref(claim, sts) and scaled_down == has_owner_ref(claim, pod)
    if when_deleted == DELETE:
        return has_owner_ref(claim, sts) and not has_owner_ref(claim, pod)
    return not (has_owner_ref(claim, sts) or has_owner_ref(claim, pod))


def _add_controller_ref(refs: list[Obj], owner: Obj, api_version: str, kind: str) -> list[Obj]:
    if any(r.get("uid") == uid_of(owner) for r in refs):
        return refs
    return [*refs, new_controller_ref(owner, api_version, kind)]


def update_claim_owner_refs(claim: Obj, sts: Obj, pod: Obj) -> None:
    unexpected = has_unexpected_controller(claim, sts, pod)
    refs = [r for r in _refs(claim)
            if not (_matches_ref(r, sts, API_VERSION, KIND) or _matches_ref(r, pod, "v1", "Pod"))]
    if not unexpected:
        when_deleted, when_scaled = retention_policy(sts)
        scaled_down = not in_ordinal_range(pod, sts)
        if when_scaled == DELETE and scaled_down:
            refs = _add_controller_ref(refs, pod, "v1", "Pod")
        if when_deleted == DELETE and not (when_scaled == DELETE and scaled_down):
            refs = _add_controller_ref(refs, sts, API_VERSION, KIND)
    md = claim.setdefault("metadata", {})
    if refs:
        md["ownerReferences"] = refs
    else:
        md.pop("ownerReferences", None)


# ------------------------------------------------------------ status


def replica_counts(pods: list[Obj], min_ready: int, current: str, update: str,
                   now: _dt.datetime) -> dict[str, int]:
    out = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0, "currentReplicas": 0, "updatedReplicas": 0}
    for pod in pods:
        if pod is None:
            continue
        created = is_created(pod)
        if created:
            out["replicas"] += 1
        if is_running_and_ready(pod):
            out["readyReplicas"] += 1
            if is_pod_available(pod, min_ready, now):
                out["availableReplicas"] += 1
        if created and not is_terminating(pod):
            rev = pod_revision(pod)
            if rev == current:
                out["currentReplicas"] += 1
            if rev == update:
                out["updatedReplicas"] += 1
    return out


def complete_rolling_update(sts: Obj, status: Obj) -> None:
    replicas = replicas_of(sts)
    if (update_strategy(sts).get("type") == "RollingUpdate" and status["updatedReplicas"] == replicas
            and status["readyReplicas"] == replicas and status["replicas"] == replicas):
        status["currentReplicas"] = status["updatedReplicas"]
        status["currentRevision"] = status["updateRevision"]


_STATUS_FIELDS = ("observedGeneration", "replicas", "readyReplicas", "currentReplicas", "updatedReplicas",
                  "currentRevision", "updateRevision", "availableReplicas")


def inconsistent_status(sts: Obj, status: Obj) -> bool:
    old = sts.get("status") or {}
    if _int(status.get("observedGeneration")) > _int(old.get("observedGeneration")):
        return True
    for key in _STATUS_FIELDS[1:]:
        default: Any = "" if key.endswith("Revision") else 0
        if (status.get(key) or default) != (old.get(key) or default):
            return True
    return False


def status_object(sts: Obj, status: Obj) -> Obj:
    """The status as the API serves it: omitempty fields left out when zero,
    the set's conditions kept."""
    out: Obj = {}
    for key in _STATUS_FIELDS:
        value = status.get(key)
        if key in ("replicas", "availableReplicas"):
            out[key] = value or 0
        elif value:
            out[key] = value
    out["collisionCount"] = status.get("collisionCount", 0)
    conditions = (sts.get("status") or {}).get("conditions")
    if conditions:
        out["conditions"] = conditions
    return out


# ------------------------------------------------------------ expectations


class PendingWrites:
    """Pods this controller created or deleted that its informer has not
    shown yet, per set: a sync waits for them rather than act on a view
    that predates its own writes (a second deletion during a rolling update
    would break maxUnavailable)."""

    def __init__(self, timeout: float = EXPECTATIONS_TIMEOUT, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._pending: dict[str, set[tuple[str, str]]] = {}
        self._stamp: dict[str, float] = {}

    def expect(self, key: str, op: str, pod: str) -> None:
        self._pending.setdefault(key, set()).add((op, pod))
        self._stamp[key] = self._clock()

    def observed(self, key: str, op: str, pod: str) -> None:
        pending = self._pending.get(key)
        if pending is not None:
            pending.discard((op, pod))

    def satisfied(self, key: str) -> bool:
        if not self._pending.get(key):
            return True
        return self._clock() - self._stamp.get(key, 0.0) > self.timeout

    def forget(self, key: str) -> None:
        self._pending.pop(key, None)
        self._stamp.pop(key, None)


# ------------------------------------------------------------ the controller


class StatefulSetController(Controller):
    """Keeps every StatefulSet's ordered, stably named pods and their claims."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 1,
        clock: Callable[[], _dt.datetime] = utcnow,
        name: str = "statefulset-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.clock = clock
        self.pending = PendingWrites()
        self.set_informer = self.factory.informer_for(STATEFULSETS)
        self.pod_informer = self.factory.informer_for(PODS)
        self.pvc_informer = self.factory.informer_for(PVCS)
        self.revision_informer = self.factory.informer_for(CONTROLLER_REVISIONS)
        self.history = History(client, self.revision_informer)
        add_indexers(self.set_informer, {NAMESPACE_INDEX: namespace_index})
        add_indexers(self.pod_informer, {NAMESPACE_INDEX: namespace_index, CONTROLLER_UID_INDEX: controller_uid_index})
        self.statefulsets = self.add_queue("statefulsets", self.sync)
        self.set_informer.add_event_handler(self._set_added, self._set_updated, self._set_deleted)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)

    # ------------------------------------------------------------- handlers

    def _set_added(self, sts: Obj) -> None:
        self.statefulsets.add(key_of(sts))

    def _set_updated(self, old: Obj, new: Obj) -> None:
        if uid_of(old) != uid_of(new):
            self.pending.forget(key_of(old))
        self.statefulsets.add(key_of(new))

    def _set_deleted(self, sts: Obj) -> None:
        sts = unwrap_deleted(sts)
        self.pending.forget(key_of(sts))
        self.statefulsets.add(key_of(sts))

    def _resolve(self, namespace: str, ref: Obj | None) -> Obj | None:
        if not ref or ref.get("kind") != KIND:
            return None
        sts = self.set_informer.indexer.get_by_key(f"{namespace}/{ref.get('name', '')}")
        if sts is None or uid_of(sts) != ref.get("uid"):
            return None
        return sts

    def _sets_for_orphan(self, pod: Obj) -> list[Obj]:
        labels = _labels(pod)
        if not labels:
            return []
        return [s for s in self.set_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(pod))
                if selector_of(s).matches(labels)]

    def _pod_added(self, pod: Obj) -> None:
        if is_terminating(pod):
            self._pod_deleted(pod)
            return
        sts = self._resolve(ns_of(pod), controller_ref(pod))
        if sts is not None:
            self.pending.observed(key_of(sts), "add", name_of(pod))
            self.statefulsets.add(key_of(sts))
            return
        if controller_ref(pod) is None:
            for s in self._sets_for_orphan(pod):
                self.statefulsets.add(key_of(s))

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if md_of(old).get("resourceVersion") == md_of(new).get("resourceVersion"):
            return
        old_ref, new_ref = controller_ref(old), controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            old_set = self._resolve(ns_of(old), old_ref)
            if old_set is not None:
                self.statefulsets.add(key_of(old_set))
        if new_ref is not None:
            sts = self._resolve(ns_of(new), new_ref)
            if sts is None:
                return
            key = key_of(sts)
            self.pending.observed(key, "add", name_of(new))
            if is_terminating(new):
                self.pending.observed(key, "delete", name_of(new))
            self.statefulsets.add(key)
            min_ready = _int(_spec(sts).get("minReadySeconds"))
            if min_ready > 0 and not is_pod_ready(old) and is_pod_ready(new):
                self.statefulsets.add_after(key, float(min_ready))
            return
        if _labels(old) != _labels(new) or old_ref != new_ref:
            for s in self._sets_for_orphan(new):
                self.statefulsets.add(key_of(s))

    def _pod_deleted(self, pod: Obj) -> None:
        pod = unwrap_deleted(pod)
        sts = self._resolve(ns_of(pod), controller_ref(pod))
        if sts is None:
            return
        self.pending.observed(key_of(sts), "delete", name_of(pod))
        self.statefulsets.add(key_of(sts))

    # ----------------------------------------------------------------- sync

    async def sync(self, key: str) -> None:
        sts = self.set_informer.indexer.get_by_key(key)
        if sts is None:
            self.pending.forget(key)
            return
        if not self.pending.satisfied(key):
            return  # requeued when the informer shows the pods written
        sts = deep_copy(sts)
        selector = selector_of(sts)
        await self.adopt_orphan_revisions(sts, selector)
        pods = await self.claim_pods(sts, selector)
        now = self.clock()
        status = await self.update_statefulset(sts, pods, now)
        min_ready = _int(_spec(sts).get("minReadySeconds"))
        if min_ready > 0 and status is not None and status["readyReplicas"] != status["availableReplicas"]:
            self.statefulsets.add_after(key, self._next_availability_check(pods, min_ready, now))

    @staticmethod
    def _next_availability_check(pods: list[Obj], min_ready: int, now: _dt.datetime) -> float:
        """Seconds until the first ready pod becomes available (upstream
        ``FindMinNextPodAvailabilityCheck``), ``min_ready`` when none is pending."""
        best: float | None = None
        for pod in pods:
            if not is_pod_ready(pod) or is_pod_available(pod, min_ready, now):
                continue
            cond = next((c for c in (pod.get("status") or {}).get("conditions") or []
                         if isinstance(c, dict) and c.get("type") == "Ready"), {})
            try:
                since = parse_time(cond.get("lastTransitionTime") or "")
            except ValueError:
                continue
            left = (since + _dt.timedelta(seconds=min_ready) - now).total_seconds()
            best = left if best is None else min(best, left)
        return float(min_ready) if best is None else max(best, 0.0) + 0.001

    # -------------------------------------------------------- adoption

    async def _can_adopt(self, sts: Obj) -> bool:
        try:
            fresh = await self.client.get(STATEFULSETS, name_of(sts), ns_of(sts))
        except StatusError as err:
            if err.code == 404:
                return False
            raise
        return uid_of(fresh) == uid_of(sts) and not md_of(fresh).get("deletionTimestamp")

    async def adopt_orphan_revisions(self, sts: Obj, selector: LabelSelector) -> None:
        revisions = self.history.list_controller_revisions(sts, API_VERSION, KIND, selector)
        orphans = [r for r in revisions if controller_ref(r) is None]
        if not orphans:
            return
        if not await self._can_adopt(sts):
            raise RuntimeError(f"can't adopt ControllerRevisions: StatefulSet {key_of(sts)} is gone or being deleted")
        for rev in orphans:
            await self.history.adopt_controller_revision(sts, API_VERSION, KIND, rev)

    async def claim_pods(self, sts: Obj, selector: LabelSelector) -> list[Obj]:
        """The set's pods: owned ones that still match (others released) and
        matching orphans named after it (adopted)."""
        uid = uid_of(sts)
        deleting = bool(md_of(sts).get("deletionTimestamp"))
        claimed: list[Obj] = []
        can_adopt: bool | None = None
        for pod in self.pod_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(sts)):
            ref = controller_ref(pod)
            matches = selector.matches(_labels(pod)) and is_member_of(sts, pod)
            if ref is not None:
                if ref.get("uid") != uid:
                    continue
                if matches:
                    claimed.append(pod)
                elif not deleting:
                    await self._release(pod, uid)
                continue
            if not matches or deleting or is_terminating(pod):
                continue
            if can_adopt is None:
                can_adopt = await self._can_adopt(sts)
            if not can_adopt:
                continue
            adopted = await self._patch_pod_owner(pod, [*_refs(pod), new_controller_ref(sts, API_VERSION, KIND)])
            if adopted is not None:
                claimed.append(adopted)
        return claimed

    async def _release(self, pod: Obj, uid: str) -> None:
        patch = {"metadata": {"uid": uid_of(pod), "ownerReferences": [{"$patch": "delete", "uid": uid}]}}
        try:
            await self.client.patch(PODS, name_of(pod), patch, ns_of(pod), patch_type="strategic")
        except StatusError as err:
            if err.code not in (404, 409, 422):
                raise

    async def _patch_pod_owner(self, pod: Obj, refs: list[Obj]) -> Obj | None:
        new = deep_copy(pod)
        new["metadata"]["ownerReferences"] = refs
        try:
            return await self.client.update(PODS, new)
        except StatusError as err:
            if err.code in (404, 409):
                return None
            raise

    # -------------------------------------------------------- revisions

    async def get_revisions(self, sts: Obj, revisions: list[Obj]) -> tuple[Obj, Obj, int]:
        """``(current, update, collisionCount)`` (upstream ``getStatefulSetRevisions``)."""
        collision_count = _int((sts.get("status") or {}).get("collisionCount"))
        update = new_revision(sts, next_revision(revisions), collision_count)
        equal = find_equal_revisions(revisions, update)
        if equal and equal_revision(revisions[-1], equal[-1]):
            update = revisions[-1]
        elif equal:
            update = await self.history.update_controller_revision(equal[-1], revision_number(update))
        else:
            update, collision_count = await self.history.create_controller_revision(sts, update, collision_count)
        current_name = (sts.get("status") or {}).get("currentRevision")
        current = next((r for r in revisions if name_of(r) == current_name), None) or update
        return current, update, collision_count

    async def truncate_history(self, sts: Obj, pods: list[Obj], revisions: list[Obj],
                               current: Obj | None, update: Obj | None) -> None:
        live = {name_of(r) for r in (current, update) if r is not None}
        live |= {pod_revision(p) for p in pods}
        old = [r for r in revisions if name_of(r) not in live]
        limit = _spec(sts).get("revisionHistoryLimit")
        limit = 10 if limit is None else _int(limit, 10)
        if limit < 0 or len(old) <= limit:
            return
        for rev in old[:len(old) - limit]:
            try:
                await self.history.delete_controller_revision(rev)
            except StatusError as err:
                if err.code != 404:
                    raise

    # -------------------------------------------------------- the update

    async def update_statefulset(self, sts: Obj, pods: list[Obj], now: _dt.datetime) -> Obj | None:
        selector = selector_of(sts)
        revisions = sort_controller_revisions(
            self.history.list_controller_revisions(sts, API_VERSION, KIND, selector))
        current: Obj | None = None
        update: Obj | None = None
        status: Obj | None = None
        err: Exception | None = None
        try:
            current, update, collision_count = await self.get_revisions(sts, revisions)
            status, err = await self._update_pods(sts, current, update, collision_count, pods, now)
            if status is not None:
                await self.update_status(sts, status)
        except Exception as exc:  # noqa: BLE001 - history is truncated either way, then the error raised
            err = exc
        try:
            await self.truncate_history(sts, pods, revisions, current, update)
        except Exception as exc:  # noqa: BLE001
            err = err or exc
        if err is not None:
            raise err
        return status

    async def _update_pods(self, sts: Obj, current_rev: Obj, update_rev: Obj, collision_count: int,
                           pods: list[Obj], now: _dt.datetime) -> tuple[Obj, Exception | None]:
        current_set = apply_revision(sts, current_rev)
        update_set = apply_revision(sts, update_rev)
        current_name, update_name = name_of(current_rev), name_of(update_rev)
        min_ready = _int(_spec(sts).get("minReadySeconds"))
        status: Obj = {"observedGeneration": _int(md_of(sts).get("generation")),
                       "currentRevision": current_name, "updateRevision": update_name,
                       "collisionCount": collision_count}

        def recount(*lists: list[Obj]) -> None:
            for k in ("replicas", "readyReplicas", "availableReplicas", "currentReplicas", "updatedReplicas"):
                status[k] = 0
            for lst in lists:
                for k, v in replica_counts(lst, min_ready, current_name, update_name, now).items():
                    status[k] += v

        recount(pods)
        start, count = start_ordinal(sts), replicas_of(sts)
        replicas: list[Obj | None] = [None] * count
        condemned: list[Obj] = []
        for pod in pods:
            if in_ordinal_range(pod, sts):
                replicas[ordinal_of(pod) - start] = pod
            elif ordinal_of(pod) >= 0:
                condemned.append(pod)
        for i in range(count):
            if replicas[i] is None:
                replicas[i] = new_versioned_pod(current_set, update_set, current_name, update_name, start + i)
        reps: list[Obj] = [p for p in replicas if p is not None]
        condemned.sort(key=ordinal_of, reverse=True)
        first_unavailable: Obj | None = None
        for pod in [*reps, *reversed(condemned)]:
            if is_unavailable(pod, min_ready, now):
                first_unavailable = pod
                break
        if md_of(sts).get("deletionTimestamp"):
            return status, None
        monotonic = not allows_burst(sts)

        async def run_all(items: list[Obj], fn: Callable[[int], Awaitable[bool]]) -> tuple[bool, Exception | None]:
            if monotonic:
                for i in range(len(items)):
                    try:
                        if await fn(i):
                            return True, None
                    except Exception as exc:  # noqa: BLE001 - reported with the status
                        return True, exc
                return False, None
            err = await _slow_start(len(items), fn)
            return err is not None, err

        async def replica(i: int) -> bool:
            return await self._process_replica(sts, update_set, monotonic, reps, i, now)

        for items, fn in ((reps, replica),
                          (condemned, lambda i: self._fix_claim(update_set, condemned[i])),
                          (condemned, lambda i: self._process_condemned(sts, first_unavailable, monotonic,
                                                                         condemned, i, now))):
            stop, err = await run_all(items, fn)
            if stop or err is not None:
                recount(reps, condemned)
                return status, err
        recount(reps, condemned)
        strategy = update_strategy(sts)
        if strategy.get("type") == "OnDelete":
            return status, None
        # RollingUpdate with maxUnavailable (upstream's MaxUnavailableStatefulSet path)
        allowed = max_unavailable(sts, count)
        unavailable = sum(1 for p in reps if is_unavailable(p, min_ready, now))
        if unavailable >= allowed:
            return status, None
        to_delete = allowed - unavailable
        deleted = 0
        partition = partition_of(sts)
        for target in range(len(reps) - 1, partition - 1, -1):
            if deleted >= to_delete:
                break
            pod = reps[target]
            if pod_revision(pod) != update_name and not is_terminating(pod):
                try:
                    await self._delete_pod(sts, pod)
                except Exception as exc:  # noqa: BLE001
                    return status, exc
                deleted += 1
                status["currentReplicas"] -= 1
        return status, None

    async def _process_replica(self, sts: Obj, update_set: Obj, monotonic: bool, reps: list[Obj], i: int,
                               now: _dt.datetime) -> bool:
        pod = reps[i]
        phase = _phase(pod)
        if phase in ("Failed", "Succeeded"):
            if not is_terminating(pod):
                await self._delete_pod(sts, pod)
            return True
        if not is_created(pod):
            if await self._claim_is_stale(sts, pod):
                return True
            created = await self._create_pod(sts, pod)
            reps[i] = created
            if monotonic:
                return True
            pod = created
        if _phase(pod) == "Pending":
            await self._create_claims(sts, pod)
            await self._update_claims_for_policy(sts, pod)
        if is_terminating(pod) and monotonic:
            return True
        min_ready = _int(_spec(sts).get("minReadySeconds"))
        if monotonic and (not is_running_and_ready(pod) or not is_pod_available(pod, min_ready, now)):
            return True
        try:
            retention_ok = await self._claims_match_policy(update_set, pod)
        except StatusError:
            retention_ok = True
        if identity_matches(sts, pod) and storage_matches(sts, pod) and retention_ok:
            return False
        await self._update_pod(update_set, deep_copy(pod))
        return False

    async def _process_condemned(self, sts: Obj, first_unhealthy: Obj | None, monotonic: bool,
                                 condemned: list[Obj], i: int, now: _dt.datetime) -> bool:
        pod = condemned[i]
        if is_terminating(pod):
            return monotonic
        min_ready = _int(_spec(sts).get("minReadySeconds"))
        if monotonic and pod is not first_unhealthy and (
                not is_running_and_ready(pod) or not is_pod_available(pod, min_ready, now)):
            return True
        await self._delete_pod(sts, pod)
        return True

    async def _fix_claim(self, update_set: Obj, pod: Obj) -> bool:
        if not await self._claims_match_policy(update_set, pod):
            await self._update_claims_for_policy(update_set, pod)
        return False

    # -------------------------------------------------------- pod writes

    def _pod_event(self, verb: str, sts: Obj, pod: Obj, err: Exception | None) -> None:
        title = verb.title()
        if err is None:
            self.recorder.event(sts, "Normal", f"Successful{title}",
                                f"{title} Pod {name_of(pod)} in StatefulSet {name_of(sts)} successful")
        else:
            message = err.message if isinstance(err, StatusError) else str(err)
            self.recorder.event(sts, "Warning", f"Failed{title}",
                                f"{title} Pod {name_of(pod)} in StatefulSet {name_of(sts)} failed error: {message}")

    async def _create_pod(self, sts: Obj, pod: Obj) -> Obj:
        try:
            await self._create_claims(sts, pod)
        except Exception as err:
            self._pod_event("create", sts, pod, err)
            raise
        key = key_of(sts)
        self.pending.expect(key, "add", name_of(pod))
        try:
            created = await self.client.create(PODS, deep_copy(pod), ns_of(sts))
        except StatusError as err:
            self.pending.observed(key, "add", name_of(pod))
            if err.reason == "AlreadyExists":
                raise
            if err.reason == "Forbidden" and "being terminated" in err.message:
                raise
            self._pod_event("create", sts, pod, err)
            raise
        try:
            await self._update_claims_for_policy(sts, created)
        except Exception as err:
            self._pod_event("update", sts, created, err)
            raise
        self._pod_event("create", sts, created, None)
        return created

    async def _update_pod(self, sts: Obj, pod: Obj) -> None:
        if not identity_matches(sts, pod):
            update_identity(sts, pod)
        if not storage_matches(sts, pod):
            update_storage(sts, pod)
            try:
                await self._create_claims(sts, pod)
            except Exception as err:
                self._pod_event("update", sts, pod, err)
                raise
        try:
            if not await self._claims_match_policy(sts, pod):
                await self._update_claims_for_policy(sts, pod)
        except Exception as err:
            self._pod_event("update", sts, pod, err)
            raise
        try:
            await self.client.update(PODS, pod)
        except StatusError as err:
            self._pod_event("update", sts, pod, err)
            raise
        self._pod_event("update", sts, pod, None)

    async def _delete_pod(self, sts: Obj, pod: Obj) -> None:
        key = key_of(sts)
        self.pending.expect(key, "delete", name_of(pod))
        try:
            await self.client.delete(PODS, name_of(pod), ns_of(pod))
        except StatusError as err:
            self.pending.observed(key, "delete", name_of(pod))
            if err.code != 404:
                self._pod_event("delete", sts, pod, err)
                raise
        self._pod_event("delete", sts, pod, None)

    # -------------------------------------------------------- claims

    def _claim(self, namespace: str, name: str) -> Obj | None:
        return self.pvc_informer.indexer.get_by_key(f"{namespace}/{name}")

    def _claim_event(self, sts: Obj, pod: Obj, claim: Obj, err: Exception | None) -> None:
        if err is None:
            self.recorder.event(sts, "Normal", "SuccessfulCreate",
                                f"Create Claim {name_of(claim)} Pod {name_of(pod)} in StatefulSet {name_of(sts)} "
                                "success")
        else:
            message = err.message if isinstance(err, StatusError) else str(err)
            self.recorder.event(sts, "Warning", "FailedCreate",
                                f"Create Claim {name_of(claim)} for Pod {name_of(pod)} in StatefulSet "
                                f"{name_of(sts)} failed error: {message}")

    async def _create_claims(self, sts: Obj, pod: Obj) -> None:
        errors: list[str] = []
        for claim in claims_for(sts, pod).values():
            existing = self._claim(ns_of(sts), name_of(claim))
            if existing is not None:
                if md_of(existing).get("deletionTimestamp"):
                    errors.append(f"pvc {name_of(claim)} is being deleted")
                continue
            try:
                await self.client.create(PVCS, deep_copy(claim), ns_of(sts))
            except StatusError as err:
                if err.reason == "AlreadyExists":
                    continue  # the informer had not shown it yet
                errors.append(f"failed to create PVC {name_of(claim)}: {err.message}")
                self._claim_event(sts, pod, claim, err)
                continue
            self._claim_event(sts, pod, claim, None)
        if errors:
            raise RuntimeError("; ".join(errors))

    async def _claims_match_policy(self, sts: Obj, pod: Obj) -> bool:
        ordinal = ordinal_of(pod)
        for template in claim_templates(sts):
            claim = self._claim(ns_of(sts), claim_name(sts, template, ordinal))
            if claim is not None and not claim_owner_up_to_date(claim, sts, pod):
                return False
        return True

    async def _update_claims_for_policy(self, sts: Obj, pod: Obj) -> None:
        ordinal = ordinal_of(pod)
        for template in claim_templates(sts):
            name = claim_name(sts, template, ordinal)
            claim = self._claim(ns_of(sts), name)
            if claim is None:
                continue
            if has_unexpected_controller(claim, sts, pod):
                self.recorder.event(sts, "Warning", "ConflictingController",
                                    f"PersistentVolumeClaim {name} has a conflicting OwnerReference that acts as a "
                                    "manging controller, the retention policy is ignored for this claim")
            if not claim_owner_up_to_date(claim, sts, pod):
                claim = deep_copy(claim)
                update_claim_owner_refs(claim, sts, pod)
                try:
                    await self.client.update(PVCS, claim)
                except StatusError as err:
                    raise RuntimeError(f"could not update claim {name} for delete policy ownerRefs: "
                                       f"{err.message}") from err

    async def _claim_is_stale(self, sts: Obj, pod: Obj) -> bool:
        """A claim still owned by an earlier pod of this name (whenScaled:
        Delete): wait for the garbage collector to remove it."""
        if retention_policy(sts)[1] == RETAIN:
            return False
        for claim in claims_for(sts, pod).values():
            existing = self._claim(ns_of(sts), name_of(claim))
            if existing is not None and has_stale_owner_ref(existing, pod, "v1", "Pod"):
                return True
        return False

    # -------------------------------------------------------- status

    async def update_status(self, sts: Obj, status: Obj) -> None:
        complete_rolling_update(sts, status)
        if not inconsistent_status(sts, status):
            return
        new = dict(sts)
        new["status"] = status_object(sts, status)
        try:
            await self.client.update(STATEFULSETS, new, subresource="status")
        except StatusError as err:
            if err.code == 404:
                return
            raise


async def _slow_start(count: int, fn: Callable[[int], Awaitable[bool]]) -> Exception | None:
    """Call ``fn(0..count-1)`` in concurrent batches of 1, 2, 4, ... (at most
    :data:`MAX_BATCH_SIZE`), stopping after a batch with a failure."""
    done = 0
    batch = min(count, 1)
    while batch > 0:
        results = await asyncio.gather(*(fn(done + k) for k in range(batch)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for e in errors:
            if not isinstance(e, Exception):
                raise e
        if errors:
            return errors[0]  # type: ignore[return-value]
        done += batch
        batch = min(2 * batch, count - done, MAX_BATCH_SIZE)
    return None


def build(client: Client, factory: SharedInformerFactory, opts: Any) -> list[Any]:
    """The ``statefulset-controller`` of :data:`kubeplane.cluster.CONTROLLERS`."""
    return [StatefulSetController(client, factory)]


__all__ = [
    "POD_INDEX_LABEL", "POD_NAME_LABEL", "REVISION_LABEL", "StatefulSetController", "apply_revision", "build",
    "claim_owner_up_to_date", "new_revision", "new_stateful_pod", "parent_and_ordinal", "update_claim_owner_refs",
]
