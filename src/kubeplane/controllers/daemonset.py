"""The DaemonSet controller, after upstream's ``pkg/controller/daemon``.

A DaemonSet runs one pod on every node that should run it. A node should run
the daemon pod when the template's nodeName (if any), nodeSelector and
required node affinity match it and the pod, with the tolerations the
controller adds to every daemon pod (not-ready, unreachable, the pressure
conditions, unschedulable, and network-unavailable for host-network pods),
tolerates its NoSchedule and NoExecute taints. A pod already running on a node
whose taints it no longer tolerates stays unless the untolerated taint is a
NoExecute one.

Pods are placed through the scheduler: each new pod gets a required node
affinity term ``metadata.name In [<node>]`` (replacing the template's terms,
which the controller has already checked) and no ``nodeName``.

A sync:

* claims the pods and ControllerRevisions that the selector matches (adopt
  orphans, release the ones that no longer match);
* constructs the history: the ControllerRevision whose data is the current
  template (``{"spec": {"template": {..., "$patch": "replace"}}}``, what
  ``kubectl rollout undo`` patches back) is the current one, named
  ``<daemonset>-<hash>`` and labelled ``controller-revision-hash``; new
  templates get the next revision number;
* creates missing pods and deletes pods on nodes that should not run them,
  excess pods, and failed pods (with a per-node backoff);
* rolls pods to the current revision: ``RollingUpdate`` (maxUnavailable, or
  maxSurge which starts the new pod before deleting the old) or ``OnDelete``;
* deletes old revisions past ``revisionHistoryLimit`` that no pod uses;
* writes status (desired, current, misscheduled, ready, updated, available,
  unavailable, observedGeneration).

Time (pod availability after minReadySeconds, the failed-pod backoff) comes
from the injectable ``clock``.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
from typing import Any, Callable, Iterable

from kubeplane.api.backoff import Backoff
from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, utcnow
from kubeplane.api.nodeselector import NodeSelector
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.deployment import compute_hash, scaled_value
from kubeplane.controllers.history import (
    History,
    raw_data,
    revision_number,
    sort_controller_revisions,
    template_patch,
)
from kubeplane.controllers.replicaset import (
    CONTROLLER_UID_INDEX,
    NAMESPACE_INDEX,
    SLOW_START_INITIAL_BATCH_SIZE,
    Expectations,
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
from kubeplane.registry.strategies_daemonset import TEMPLATE_GENERATION

log = logging.getLogger(__name__)

PODS = resource("pods")
NODES = resource("nodes")
DAEMONSETS = resource("daemonsets")
CONTROLLER_REVISIONS = resource("controllerrevisions")

#: the label of a daemon pod and of a ControllerRevision naming the revision's hash
REVISION_HASH_LABEL = "controller-revision-hash"
#: the label of a daemon pod naming the DaemonSet's template generation
TEMPLATE_GENERATION_LABEL = "pod-template-generation"

BURST_REPLICAS = 250
#: how often the failed-pod backoff forgets entries that are long idle (upstream BackoffGCInterval)
BACKOFF_GC_INTERVAL = 60.0
NODE_NAME_INDEX = "spec.nodeName"

# Event reasons (upstream's daemon controller and pod control).
SELECTING_ALL = "SelectingAll"
FAILED_DAEMON_POD = "FailedDaemonPod"
SUCCEEDED_DAEMON_POD = "SucceededDaemonPod"

#: the tolerations every daemon pod gets (upstream ``AddOrUpdateDaemonPodTolerations``)
DAEMON_TOLERATIONS: tuple[Obj, ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION: Obj = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                                "effect": "NoSchedule"}


# ---------------------------------------------------------- pod template


def _add_or_update_toleration(spec: Obj, toleration: Obj) -> None:
    """Upstream ``AddOrUpdateTolerationInPodSpec``: one toleration per (key, operator, value, effect)."""
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    for i, t in enumerate(tolerations):
        if (t.get("key", "") == toleration["key"] and (t.get("operator") or "Equal") == toleration["operator"]
                and t.get("value", "") == toleration.get("value", "") and t.get("effect", "") == toleration["effect"]):
            tolerations[i] = dict(toleration)
            spec["tolerations"] = tolerations
            return
    tolerations.append(dict(toleration))
    spec["tolerations"] = tolerations


def add_daemon_tolerations(spec: Obj) -> None:
    for t in DAEMON_TOLERATIONS:
        _add_or_update_toleration(spec, t)
    if spec.get("hostNetwork"):
        _add_or_update_toleration(spec, HOST_NETWORK_TOLERATION)


def template_generation(ds: Obj) -> int | None:
    value = (md_of(ds).get("annotations") or {}).get(TEMPLATE_GENERATION)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def create_pod_template(ds: Obj, generation: int | None, hash_: str) -> Obj:
    """The DaemonSet's template with the daemon tolerations and the generation and hash labels."""
    template = deep_copy((ds.get("spec") or {}).get("template") or {})
    spec = template.setdefault("spec", {})
    add_daemon_tolerations(spec)
    md = template.get("metadata")
    if not isinstance(md, dict):
        md = template["metadata"] = {}
    labels = dict(md.get("labels") or {})
    if generation is not None:
        labels[TEMPLATE_GENERATION_LABEL] = str(generation)
    if hash_:
        labels[REVISION_HASH_LABEL] = hash_
    md["labels"] = labels
    return template


def replace_node_name_affinity(affinity: Obj | None, node_name: str) -> Obj:
    """Upstream ``ReplaceDaemonSetPodNodeNameNodeAffinity``: the required node
    affinity becomes the single term ``metadata.name In [node_name]``."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    affinity = dict(affinity or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    required["nodeSelectorTerms"] = [term]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    return affinity


def target_node_name(pod: Obj) -> str | None:
    """The node a daemon pod is for: its nodeName, or its ``metadata.name In`` affinity term."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for r in (term or {}).get("matchFields") or []:
            if r.get("key") == "metadata.name" and r.get("operator") == "In":
                values = r.get("values") or []
                return values[0] if len(values) == 1 else None
    return None


# ------------------------------------------------------------- placement


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Upstream ``Toleration.ToleratesTaint``."""
    effect = toleration.get("effect") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    key = toleration.get("key") or ""
    if key and key != (taint.get("key") or ""):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    return op == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def _untolerated(taints: Iterable[Obj], tolerations: list[Obj], effects: tuple[str, ...]) -> bool:
    return any((t.get("effect") or "") in effects and not any(tolerates(tol, t) for tol in tolerations)
               for t in taints if isinstance(t, dict))


def _matches_node(spec: Obj, node: Obj) -> bool:
    """The pod spec's nodeSelector and required node affinity match the node."""
    labels = md_of(node).get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None:
        return NodeSelector(required).matches(node)
    return True


def node_should_run_daemon_pod(node: Obj, ds: Obj) -> tuple[bool, bool]:
    """Upstream ``NodeShouldRunDaemonPod``: ``(shouldRun, shouldContinueRunning)``."""
    spec = deep_copy(((ds.get("spec") or {}).get("template") or {}).get("spec") or {})
    wanted = spec.get("nodeName")
    if wanted and wanted != name_of(node):
        return False, False
    add_daemon_tolerations(spec)
    if not _matches_node(spec, node):
        return False, False
    taints = (node.get("spec") or {}).get("taints") or []
    tolerations = spec.get("tolerations") or []
    if _untolerated(taints, tolerations, ("NoExecute", "NoSchedule")):
        return False, not _untolerated(taints, tolerations, ("NoExecute",))
    return True, True


def _creation_key(pod: Obj) -> tuple[int, str, str]:
    """Upstream ``podByCreationTimestampAndPhase``: scheduled pods first, then oldest, then by name."""
    return (0 if (pod.get("spec") or {}).get("nodeName") else 1,
            md_of(pod).get("creationTimestamp") or "", name_of(pod))


def is_pod_updated(pod: Obj, hash_: str, generation: int | None) -> bool:
    labels = md_of(pod).get("labels") or {}
    template_matches = generation is not None and labels.get(TEMPLATE_GENERATION_LABEL) == str(generation)
    hash_matches = bool(hash_) and labels.get(REVISION_HASH_LABEL) == hash_
    return hash_matches or template_matches


def _rolling(ds: Obj) -> Obj | None:
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return None
    return strategy.get("rollingUpdate") or {}


def surge_count(ds: Obj, number_to_schedule: int) -> int:
    ru = _rolling(ds)
    if ru is None or ru.get("maxSurge") is None:
        return 0
    return scaled_value(ru.get("maxSurge"), number_to_schedule, True)


def unavailable_count(ds: Obj, number_to_schedule: int) -> int:
    ru = _rolling(ds)
    if ru is None:
        return 0
    return scaled_value(ru.get("maxUnavailable"), number_to_schedule, True)


def allows_surge(ds: Obj) -> bool:
    try:
        return surge_count(ds, 1) > 0
    except ValueError:
        return False


def find_updated_pods_on_node(ds: Obj, pods: list[Obj], hash_: str) -> tuple[Obj | None, Obj | None, bool]:
    """``(new, old, ok)``: the node's one updated and one old pod; not ok with more of either."""
    new_pod = old_pod = None
    generation = template_generation(ds)
    for pod in pods:
        if md_of(pod).get("deletionTimestamp"):
            continue
        if is_pod_updated(pod, hash_, generation):
            if new_pod is not None:
                return None, None, False
            new_pod = pod
        else:
            if old_pod is not None:
                return None, None, False
            old_pod = pod
    return new_pod, old_pod, True


def _phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase") or ""


def _is_terminal(pod: Obj) -> bool:
    return _phase(pod) in ("Succeeded", "Failed")


# --------------------------------------------------------------- history


def revision_patch(ds: Obj) -> Obj:
    """What a ControllerRevision of the DaemonSet holds (upstream ``getPatch``):
    its template to replace on undo, in the form upstream's typed round trip
    writes it, so that ``kubectl rollout undo`` finds the revision that matches
    the DaemonSet byte for byte."""
    return template_patch((ds.get("spec") or {}).get("template") or {})


def revision_matches(ds: Obj, revision: Obj) -> bool:
    """Upstream ``Match``: the revision's data is the DaemonSet's template patch, byte for byte."""
    return raw_data(revision.get("data")) == raw_data(revision_patch(ds))


class DaemonSetExpectations(Expectations):
    """Creations and deletions expected at once (upstream ``SetExpectations(add, del)``)."""

    def expect(self, key: str, creations: int, pod_keys: Iterable[str]) -> None:
        self.expect_creations(key, creations)
        self._dels[key] = set(pod_keys)

    def lower_creations(self, key: str, count: int) -> None:
        self.creation_observed(key, count)


def node_name_index(pod: Obj) -> list[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


# ------------------------------------------------------------ controller


class DaemonSetsController(Controller):
    """Keeps one daemon pod on every node that should run it."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 1,
        name: str = "daemonset-controller",
        clock: Callable[[], _dt.datetime] = utcnow,
        burst_replicas: int = BURST_REPLICAS,
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.clock = clock
        self.burst_replicas = burst_replicas
        self.expectations = DaemonSetExpectations()
        # a failed daemon pod is recreated after 1 s doubling up to 15 min
        self.failed_pods_backoff = Backoff(1.0, 900.0, clock=lambda: self.clock().timestamp())
        self._backoff_gc_at = clock()
        self.ds_informer = self.factory.informer_for(DAEMONSETS)
        self.pod_informer = self.factory.informer_for(PODS)
        self.node_informer = self.factory.informer_for(NODES)
        self.history_informer = self.factory.informer_for(CONTROLLER_REVISIONS)
        add_indexers(self.ds_informer, {NAMESPACE_INDEX: namespace_index})
        add_indexers(self.pod_informer, {NAMESPACE_INDEX: namespace_index, CONTROLLER_UID_INDEX: controller_uid_index,
                                         NODE_NAME_INDEX: node_name_index})
        self.history = History(client, self.history_informer)
        self.daemonsets = self.add_queue("daemonsets", self.sync)
        self.node_updates = self.add_queue("nodes", self.sync_node_update)
        self.ds_informer.add_event_handler(self._ds_added, self._ds_updated, self._ds_deleted)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        self.node_informer.add_event_handler(self._node_added, self._node_updated, self._node_deleted)
        self.history_informer.add_event_handler(self._history_added, self._history_updated, self._history_deleted)

    # ------------------------------------------------------------- handlers

    def enqueue(self, ds: Obj) -> None:
        self.daemonsets.add(key_of(ds))

    def _ds_added(self, ds: Obj) -> None:
        self.enqueue(ds)

    def _ds_updated(self, old: Obj, new: Obj) -> None:
        if uid_of(old) != uid_of(new):
            self.expectations.delete(key_of(old))
        self.enqueue(new)

    def _ds_deleted(self, ds: Obj) -> None:
        ds = unwrap_deleted(ds)
        self.expectations.delete(key_of(ds))
        self.enqueue(ds)

    def _resolve(self, namespace: str, ref: Obj | None) -> Obj | None:
        if not ref or ref.get("kind") != "DaemonSet" or not str(ref.get("apiVersion", "")).startswith("apps/"):
            return None
        ds = self.ds_informer.indexer.get_by_key(f"{namespace}/{ref.get('name', '')}")
        if ds is None or uid_of(ds) != ref.get("uid"):
            return None
        return ds

    def _daemonsets_selecting(self, obj: Obj) -> list[Obj]:
        labels = md_of(obj).get("labels") or {}
        if not labels:
            return []
        return [ds for ds in self.ds_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(obj))
                if not selector_of(ds).empty and selector_of(ds).matches(labels)]

    def _pod_added(self, pod: Obj) -> None:
        if md_of(pod).get("deletionTimestamp"):
            self._pod_deleted(pod)
            return
        ref = controller_ref(pod)
        if ref is not None:
            ds = self._resolve(ns_of(pod), ref)
            if ds is not None:
                self.expectations.creation_observed(key_of(ds))
                self.enqueue(ds)
            return
        for ds in self._daemonsets_selecting(pod):
            self.enqueue(ds)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if md_of(old).get("resourceVersion") == md_of(new).get("resourceVersion"):
            return
        if md_of(new).get("deletionTimestamp") and not md_of(old).get("deletionTimestamp"):
            self._pod_deleted(new)
            return
        old_ref, new_ref = controller_ref(old), controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            old_ds = self._resolve(ns_of(old), old_ref)
            if old_ds is not None:
                self.enqueue(old_ds)
        if new_ref is not None:
            ds = self._resolve(ns_of(new), new_ref)
            if ds is not None:
                self.enqueue(ds)
                min_ready = int((ds.get("spec") or {}).get("minReadySeconds") or 0)
                if min_ready > 0 and not is_pod_ready(old) and is_pod_ready(new):
                    self.daemonsets.add_after(key_of(ds), min_ready + 1)
            return
        if (md_of(old).get("labels") or {}) != (md_of(new).get("labels") or {}) or old_ref is not None:
            for ds in self._daemonsets_selecting(new):
                self.enqueue(ds)

    def _pod_deleted(self, pod: Obj) -> None:
        pod = unwrap_deleted(pod)
        ds = self._resolve(ns_of(pod), controller_ref(pod))
        if ds is None:
            return
        self.expectations.deletion_observed(key_of(ds), key_of(pod))
        self.enqueue(ds)

    def _node_added(self, node: Obj) -> None:
        self.node_updates.add(name_of(node))

    def _node_updated(self, old: Obj, new: Obj) -> None:
        if (md_of(old).get("labels") == md_of(new).get("labels")
                and (old.get("spec") or {}).get("taints") == (new.get("spec") or {}).get("taints")):
            return
        self.node_updates.add(name_of(new))

    def _node_deleted(self, node: Obj) -> None:
        # the node's pods are the pod garbage collector's; the counts change now
        for ds in self.ds_informer.indexer.list():
            self.enqueue(ds)

    def _history_owner(self, rev: Obj) -> Obj | None:
        return self._resolve(ns_of(rev), controller_ref(rev))

    def _history_added(self, rev: Obj) -> None:
        if md_of(rev).get("deletionTimestamp"):
            self._history_deleted(rev)
            return
        ds = self._history_owner(rev)
        if ds is not None:
            self.enqueue(ds)
            return
        if controller_ref(rev) is None:
            for ds in self._daemonsets_selecting(rev):
                self.enqueue(ds)

    def _history_updated(self, old: Obj, new: Obj) -> None:
        if md_of(old).get("resourceVersion") == md_of(new).get("resourceVersion"):
            return
        old_ref, new_ref = controller_ref(old), controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            ds = self._resolve(ns_of(old), old_ref)
            if ds is not None:
                self.enqueue(ds)
        if new_ref is not None:
            ds = self._resolve(ns_of(new), new_ref)
            if ds is not None:
                self.enqueue(ds)
            return
        if (md_of(old).get("labels") or {}) != (md_of(new).get("labels") or {}) or old_ref is not None:
            for ds in self._daemonsets_selecting(new):
                self.enqueue(ds)

    def _history_deleted(self, rev: Obj) -> None:
        rev = unwrap_deleted(rev)
        ds = self._history_owner(rev)
        if ds is not None:
            self.enqueue(ds)

    # ---------------------------------------------------------- node queue

    async def sync_node_update(self, node_name: str) -> None:
        """A node appeared or its labels or taints changed: sync the DaemonSets it concerns."""
        node = self.node_informer.indexer.get_by_key(node_name)
        if node is None:
            return
        by_ds: dict[str, int] = {}
        for pod in self.pod_informer.indexer.by_index(NODE_NAME_INDEX, node_name):
            ref = controller_ref(pod)
            if ref is None or ref.get("kind") != "DaemonSet":
                continue
            key = f"{ns_of(pod)}/{ref.get('name', '')}"
            by_ds[key] = by_ds.get(key, 0) + 1
        for ds in self.ds_informer.indexer.list():
            should_run, should_continue = node_should_run_daemon_pod(node, ds)
            scheduled = by_ds.get(key_of(ds), 0) > 0
            misscheduled = int((ds.get("status") or {}).get("numberMisscheduled") or 0) > 0
            if (should_run and not scheduled) or (not should_continue and scheduled) or (scheduled and misscheduled):
                self.enqueue(ds)

    # ----------------------------------------------------------------- sync

    async def sync(self, key: str) -> None:
        now = self.clock()
        if (now - self._backoff_gc_at).total_seconds() >= BACKOFF_GC_INTERVAL:
            self.failed_pods_backoff.gc(now.timestamp())
            self._backoff_gc_at = now
        ds = self.ds_informer.indexer.get_by_key(key)
        if ds is None:
            self.expectations.delete(key)
            return
        nodes = self.node_informer.indexer.list()
        selector = (ds.get("spec") or {}).get("selector")
        if selector is not None and not (selector.get("matchLabels") or selector.get("matchExpressions")):
            self.recorder.event(ds, "Warning", SELECTING_ALL,
                                "This daemon set is selecting all pods. A non-empty selector is required.")
            return
        if md_of(ds).get("deletionTimestamp"):
            return
        cur, old = await self.construct_history(ds)
        hash_ = (md_of(cur).get("labels") or {}).get(REVISION_HASH_LABEL, "")
        if not self.expectations.satisfied(key):
            await self.update_status(ds, nodes, hash_, update_observed_generation=False)
            return
        err: Exception | None = None
        try:
            await self.update_daemonset(ds, nodes, hash_, key, old)
        except Exception as exc:  # noqa: BLE001 - status is written first, then the error retried
            err = exc
        try:
            await self.update_status(ds, nodes, hash_, update_observed_generation=True)
        except Exception as status_err:  # noqa: BLE001
            if err is None:
                raise
            log.warning("%s: failed to update status of %s: %s", self.name, key, status_err)
        if err is not None:
            raise err

    async def update_daemonset(self, ds: Obj, nodes: list[Obj], hash_: str, key: str, old: list[Obj]) -> None:
        await self.manage(ds, nodes, hash_)
        if self.expectations.satisfied(key) and _rolling(ds) is not None:
            await self.rolling_update(ds, nodes, hash_)
        await self.cleanup_history(ds, old)

    # ------------------------------------------------------------ claiming

    async def daemon_pods(self, ds: Obj) -> list[Obj]:
        """The pods this DaemonSet controls, after adopting and releasing."""
        selector = selector_of(ds)
        uid = uid_of(ds)
        deleting = bool(md_of(ds).get("deletionTimestamp"))
        claimed: list[Obj] = []
        can_adopt: bool | None = None
        for pod in self.pod_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(ds)):
            ref = controller_ref(pod)
            matches = selector.matches(md_of(pod).get("labels") or {})
            if ref is not None:
                if ref.get("uid") != uid:
                    continue
                if matches:
                    claimed.append(pod)
                elif not deleting:
                    await self._release(PODS, pod, uid)
                continue
            if not matches or deleting or md_of(pod).get("deletionTimestamp"):
                continue
            if can_adopt is None:
                can_adopt = await self._recheck(ds)
            if not can_adopt:
                continue
            adopted = await self._adopt(PODS, pod, ds)
            if adopted is not None:
                claimed.append(adopted)
        return claimed

    async def _recheck(self, ds: Obj) -> bool:
        """Adoption needs the DaemonSet alive (same uid) and not being deleted."""
        try:
            fresh = await self.client.get(DAEMONSETS, name_of(ds), ns_of(ds))
        except StatusError as err:
            if err.code == 404:
                return False
            raise
        return uid_of(fresh) == uid_of(ds) and not md_of(fresh).get("deletionTimestamp")

    async def _adopt(self, res: Any, obj: Obj, ds: Obj) -> Obj | None:
        patch = {"metadata": {"ownerReferences": [new_controller_ref(ds, "apps/v1", "DaemonSet")],
                              "uid": uid_of(obj)}}
        try:
            return await self.client.patch(res, name_of(obj), patch, ns_of(obj), patch_type="strategic")
        except StatusError as err:
            if err.code in (404, 409, 422):
                return None
            raise

    async def _release(self, res: Any, obj: Obj, uid: str) -> None:
        patch = {"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}], "uid": uid_of(obj)}}
        try:
            await self.client.patch(res, name_of(obj), patch, ns_of(obj), patch_type="strategic")
        except StatusError as err:
            if err.code not in (404, 409, 422):
                raise

    async def nodes_to_daemon_pods(self, ds: Obj, include_deleted_terminal: bool = False) -> dict[str, list[Obj]]:
        out: dict[str, list[Obj]] = {}
        for pod in await self.daemon_pods(ds):
            if not include_deleted_terminal and _is_terminal(pod) and md_of(pod).get("deletionTimestamp"):
                continue
            node = target_node_name(pod)
            if node is None:
                continue
            out.setdefault(node, []).append(pod)
        return out

    # ----------------------------------------------------------- placement

    def pods_should_be_on_node(self, node: Obj, node_pods: dict[str, list[Obj]], ds: Obj,
                               hash_: str) -> tuple[list[str], list[str]]:
        """Upstream ``podsShouldBeOnNode``: ``(nodes needing a pod, pods to delete)``."""
        should_run, should_continue = node_should_run_daemon_pod(node, ds)
        node_name = name_of(node)
        pods = node_pods.get(node_name)
        need: list[str] = []
        delete: list[str] = []
        if should_run and pods is None:
            need.append(node_name)
        elif should_continue:
            running: list[Obj] = []
            for pod in pods or []:
                if md_of(pod).get("deletionTimestamp"):
                    continue
                if _phase(pod) == "Failed":
                    backoff_key = f"{uid_of(ds)}/{(ds.get('status') or {}).get('observedGeneration', 0)}/{node_name}"
                    now = self.clock()
                    if self.failed_pods_backoff.in_backoff_since_update(backoff_key, now.timestamp()):
                        self.daemonsets.add_after(key_of(ds), self.failed_pods_backoff.get(backoff_key))
                        continue
                    self.failed_pods_backoff.next(backoff_key, now.timestamp())
                    self.recorder.event(ds, "Warning", FAILED_DAEMON_POD,
                                        f"Found failed daemon pod {ns_of(pod)}/{name_of(pod)} on node {node_name}, "
                                        "will try to kill it")
                    delete.append(name_of(pod))
                elif _phase(pod) == "Succeeded":
                    self.recorder.event(ds, "Normal", SUCCEEDED_DAEMON_POD,
                                        f"Found succeeded daemon pod {ns_of(pod)}/{name_of(pod)} on node {node_name}, "
                                        "will try to delete it")
                    delete.append(name_of(pod))
                else:
                    running.append(pod)
            running.sort(key=_creation_key)
            if not allows_surge(ds):
                # keep the oldest pod, delete the rest
                delete.extend(name_of(p) for p in running[1:])
            elif len(running) <= 1:
                if not running and should_run:
                    need.append(node_name)
            else:
                oldest_new = oldest_old = None
                for pod in running:
                    if (md_of(pod).get("labels") or {}).get(REVISION_HASH_LABEL) == hash_:
                        if oldest_new is None:
                            oldest_new = pod
                            continue
                    elif oldest_old is None:
                        oldest_old = pod
                        continue
                    delete.append(name_of(pod))
                if oldest_new is not None and oldest_old is not None:
                    min_ready = int((ds.get("spec") or {}).get("minReadySeconds") or 0)
                    if not is_pod_ready(oldest_old):
                        delete.append(name_of(oldest_old))
                    elif is_pod_available(oldest_new, min_ready, self.clock()):
                        delete.append(name_of(oldest_old))
        elif pods:
            delete.extend(name_of(p) for p in pods if not md_of(p).get("deletionTimestamp"))
        return need, delete

    async def manage(self, ds: Obj, nodes: list[Obj], hash_: str) -> None:
        node_pods = await self.nodes_to_daemon_pods(ds)
        need: list[str] = []
        delete: list[str] = []
        for node in nodes:
            n, d = self.pods_should_be_on_node(node, node_pods, ds, hash_)
            need += n
            delete += d
        # pods for nodes that no longer exist and were never scheduled
        running = {name_of(n) for n in nodes}
        for node_name, pods in node_pods.items():
            if node_name not in running:
                delete += [name_of(p) for p in pods if not (p.get("spec") or {}).get("nodeName")]
        await self.sync_nodes(ds, delete, need, hash_)

    async def sync_nodes(self, ds: Obj, pods_to_delete: list[str], nodes_needing_pods: list[str], hash_: str) -> None:
        key = key_of(ds)
        creates = nodes_needing_pods[:self.burst_replicas]
        deletes = pods_to_delete[:self.burst_replicas]
        namespace = ns_of(ds)
        self.expectations.expect(key, len(creates), [f"{namespace}/{p}" for p in deletes])
        errors: list[Exception] = []
        template = create_pod_template(ds, template_generation(ds), hash_)
        pos = 0
        batch = min(len(creates), SLOW_START_INITIAL_BATCH_SIZE)
        while batch > 0:
            results = await asyncio.gather(*(self._create_pod(ds, template, node) for node in creates[pos:pos + batch]),
                                           return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            for r in failed:
                if not isinstance(r, Exception):
                    raise r
                errors.append(r)
            pos += batch
            skipped = len(creates) - pos
            if failed and skipped > 0:
                # slow start: stop after a batch with a failure; these will not show up
                self.expectations.lower_creations(key, skipped)
                break
            batch = min(2 * batch, len(creates) - pos)
        results = await asyncio.gather(*(self._delete_pod(ds, p) for p in deletes), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                if not isinstance(r, Exception):
                    raise r
                errors.append(r)
        if errors:
            raise errors[0]

    async def _create_pod(self, ds: Obj, template: Obj, node_name: str) -> None:
        key = key_of(ds)
        md = template.get("metadata") or {}
        spec = deep_copy(template.get("spec") or {})
        spec["affinity"] = replace_node_name_affinity(spec.get("affinity"), node_name)
        pod_md: Obj = {"generateName": f"{name_of(ds)}-", "namespace": ns_of(ds),
                       "ownerReferences": [new_controller_ref(ds, "apps/v1", "DaemonSet")]}
        for k in ("labels", "annotations", "finalizers"):
            if md.get(k):
                pod_md[k] = deep_copy(md[k])
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_md, "spec": spec}
        try:
            created = await self.client.create(PODS, pod, ns_of(ds))
        except StatusError as err:
            self.expectations.creation_observed(key)
            if err.reason == "Forbidden" and "being terminated" in err.message:
                return
            self.recorder.event(ds, "Warning", "FailedCreate", f"Error creating: {err.message}")
            raise
        except Exception:
            self.expectations.creation_observed(key)
            raise
        self.recorder.event(ds, "Normal", "SuccessfulCreate", f"Created pod: {name_of(created)}")

    async def _delete_pod(self, ds: Obj, pod_name: str) -> None:
        namespace = ns_of(ds)
        try:
            await self.client.delete(PODS, pod_name, namespace)
        except StatusError as err:
            self.expectations.deletion_observed(key_of(ds), f"{namespace}/{pod_name}")
            if err.code == 404:
                return
            self.recorder.event(ds, "Warning", "FailedDelete", f"Error deleting: {err.message}")
            raise
        self.recorder.event(ds, "Normal", "SuccessfulDelete", f"Deleted pod: {pod_name}")

    # -------------------------------------------------------- rolling update

    def _desired_counts(self, ds: Obj, nodes: list[Obj], node_pods: dict[str, list[Obj]]) -> tuple[int, int, int]:
        """Upstream ``updatedDesiredNodeCounts``: ``(maxSurge, maxUnavailable, desired)``;
        every node that should run a pod gets an entry in ``node_pods``."""
        desired = 0
        for node in nodes:
            if not node_should_run_daemon_pod(node, ds)[0]:
                continue
            desired += 1
            node_pods.setdefault(name_of(node), [])
        max_unavailable = unavailable_count(ds, desired)
        max_surge = surge_count(ds, desired)
        if desired > 0 and max_unavailable == 0 and max_surge == 0:
            max_unavailable = 1
        return max_surge, max_unavailable, desired

    async def rolling_update(self, ds: Obj, nodes: list[Obj], hash_: str) -> None:
        node_pods = await self.nodes_to_daemon_pods(ds)
        max_surge, max_unavailable, desired = self._desired_counts(ds, nodes, node_pods)
        now = self.clock()
        min_ready = int((ds.get("spec") or {}).get("minReadySeconds") or 0)
        nodes_by_name = {name_of(n): n for n in nodes}

        def available(pod: Obj) -> bool:
            return is_pod_available(pod, min_ready, now)

        def should_run(node_name: str) -> bool:
            node = nodes_by_name.get(node_name)
            return node is not None and node_should_run_daemon_pod(node, ds)[0]

        if max_surge == 0:
            num_unavailable = 0
            allowed: list[str] = []
            candidates: list[str] = []
            for node_name in sorted(node_pods):
                new_pod, old_pod, ok = find_updated_pods_on_node(ds, node_pods[node_name], hash_)
                if not ok:
                    # excess pods: the core loop deletes them first
                    num_unavailable += 1
                    continue
                if (old_pod is None) == (new_pod is None):
                    num_unavailable += 1
                elif new_pod is not None:
                    if not available(new_pod):
                        num_unavailable += 1
                else:
                    assert old_pod is not None
                    if not available(old_pod):
                        allowed.append(name_of(old_pod))
                        num_unavailable += 1
                    elif num_unavailable < max_unavailable:
                        candidates.append(name_of(old_pod))
            remaining = min(max(max_unavailable - num_unavailable, 0), len(candidates))
            await self.sync_nodes(ds, allowed + candidates[:remaining], [], hash_)
            return

        old_to_delete: list[str] = []
        should_not_run_to_delete: list[str] = []
        candidate_nodes: list[str] = []
        allowed_nodes: list[str] = []
        num_surge = 0
        num_available = 0
        for node_name in sorted(node_pods):
            new_pod, old_pod, ok = find_updated_pods_on_node(ds, node_pods[node_name], hash_)
            if not ok:
                num_surge += 1
                continue
            if old_pod is not None:
                if available(old_pod):
                    num_available += 1
            elif new_pod is not None and available(new_pod):
                num_available += 1
            if old_pod is None:
                continue
            if new_pod is None:
                if not available(old_pod):
                    if not should_run(node_name):
                        old_to_delete.append(name_of(old_pod))
                        continue
                    allowed_nodes.append(node_name)
                else:
                    if not should_run(node_name):
                        should_not_run_to_delete.append(name_of(old_pod))
                        continue
                    if num_surge >= max_surge:
                        continue
                    candidate_nodes.append(node_name)
            else:
                if not available(new_pod):
                    num_surge += 1
                    continue
                old_to_delete.append(name_of(old_pod))
        remaining = max_surge - num_surge
        deletable = num_available - desired
        if deletable > 0:
            old_to_delete += should_not_run_to_delete[:min(deletable, len(should_not_run_to_delete))]
        remaining = min(max(remaining, 0), len(candidate_nodes))
        await self.sync_nodes(ds, old_to_delete, allowed_nodes + candidate_nodes[:remaining], hash_)

    # ------------------------------------------------------------- history

    async def controlled_histories(self, ds: Obj) -> list[Obj]:
        """The ControllerRevisions this DaemonSet controls, after adopting matching
        orphans and releasing owned ones the selector no longer matches."""
        selector = selector_of(ds)
        uid = uid_of(ds)
        deleting = bool(md_of(ds).get("deletionTimestamp"))
        owned: list[Obj] = []
        can_adopt: bool | None = None
        # the owned ones the selector matches and the matching orphans (the index) ...
        candidates = self.history.list_controller_revisions(ds, "apps/v1", "DaemonSet", selector)
        # ... and the owned ones it no longer matches, to release
        candidates += [r for r in self.history_informer.indexer.list()
                       if ns_of(r) == ns_of(ds) and (controller_ref(r) or {}).get("uid") == uid
                       and not selector.matches(md_of(r).get("labels") or {})]
        for rev in candidates:
            ref = controller_ref(rev)
            if ref is not None:
                if selector.matches(md_of(rev).get("labels") or {}):
                    owned.append(rev)
                elif not deleting:
                    await self.history.release_controller_revision(ds, rev)
                continue
            if deleting or md_of(rev).get("deletionTimestamp"):
                continue
            if can_adopt is None:
                can_adopt = await self._recheck(ds)
            if not can_adopt:
                continue
            try:
                owned.append(await self.history.adopt_controller_revision(ds, "apps/v1", "DaemonSet", rev))
            except StatusError as err:
                if err.code not in (404, 409, 422):
                    raise
        return owned

    async def construct_history(self, ds: Obj) -> tuple[Obj, list[Obj]]:
        """``(current, old)`` revisions; creates the current one for a new template."""
        current: list[Obj] = []
        old: list[Obj] = []
        for rev in await self.controlled_histories(ds):
            labels = md_of(rev).get("labels") or {}
            if REVISION_HASH_LABEL not in labels:
                # a revision from before the label: its name stands for the hash
                new = deep_copy(rev)
                new["metadata"].setdefault("labels", {})[REVISION_HASH_LABEL] = name_of(rev)
                rev = await self.client.update(CONTROLLER_REVISIONS, new)
            (current if revision_matches(ds, rev) else old).append(rev)
        next_revision = max((revision_number(r) for r in old), default=0) + 1
        if not current:
            cur = await self.snapshot(ds, next_revision)
        else:
            cur = await self.dedup_current_histories(ds, current)
            if revision_number(cur) < next_revision:
                cur = await self.history.update_controller_revision(cur, next_revision)
        return cur, old

    async def dedup_current_histories(self, ds: Obj, current: list[Obj]) -> Obj:
        """Several revisions hold the current template: keep the newest, relabel its pods, delete the rest."""
        if len(current) == 1:
            return current[0]
        keep = current[0]
        for rev in current:
            if revision_number(rev) >= revision_number(keep):
                keep = rev
        keep_hash = (md_of(keep).get("labels") or {}).get(REVISION_HASH_LABEL)
        for pod in await self.daemon_pods(ds):
            if (md_of(pod).get("labels") or {}).get(REVISION_HASH_LABEL) != keep_hash:
                await self.client.patch(PODS, name_of(pod), {"metadata": {"labels": {REVISION_HASH_LABEL: keep_hash}}},
                                        ns_of(pod))
        for rev in current:
            if name_of(rev) == name_of(keep):
                continue
            try:
                await self.client.delete(CONTROLLER_REVISIONS, name_of(rev), ns_of(rev))
            except StatusError as err:
                if err.code != 404:
                    raise
        return keep

    async def snapshot(self, ds: Obj, revision: int) -> Obj:
        """Create the ControllerRevision of the current template (``<name>-<hash>``);
        a different revision under that name is a hash collision: bump
        ``status.collisionCount`` and retry."""
        template = (ds.get("spec") or {}).get("template") or {}
        collision = (ds.get("status") or {}).get("collisionCount")
        hash_ = compute_hash(template, collision)
        name = f"{name_of(ds)}-{hash_}"
        md: Obj = {"name": name, "namespace": ns_of(ds),
                   "labels": {**((template.get("metadata") or {}).get("labels") or {}), REVISION_HASH_LABEL: hash_},
                   "ownerReferences": [new_controller_ref(ds, "apps/v1", "DaemonSet")]}
        if md_of(ds).get("annotations"):
            md["annotations"] = dict(md_of(ds)["annotations"])
        rev = {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": md,
               "data": revision_patch(ds), "revision": revision}
        try:
            return await self.client.create(CONTROLLER_REVISIONS, rev, ns_of(ds))
        except StatusError as err:
            if err.code != 409 or err.reason != "AlreadyExists":
                raise
            existing = await self.client.get(CONTROLLER_REVISIONS, name, ns_of(ds))
            if revision_matches(ds, existing):
                return existing
            fresh = await self.client.get(DAEMONSETS, name_of(ds), ns_of(ds))
            fresh_collision = (fresh.get("status") or {}).get("collisionCount")
            if fresh_collision != collision:
                raise RuntimeError(
                    f"found a stale collision count ({collision}, expected {fresh_collision}) of DaemonSet "
                    f"{name_of(ds)!r} while processing; will retry until it is updated") from err
            fresh.setdefault("status", {})["collisionCount"] = int(fresh_collision or 0) + 1
            await self.client.update(DAEMONSETS, fresh, subresource="status")
            log.info("%s: hash collision for DaemonSet %s, collisionCount bumped", self.name, key_of(ds))
            raise

    async def cleanup_history(self, ds: Obj, old: list[Obj]) -> None:
        """Delete the oldest revisions past revisionHistoryLimit that no pod runs."""
        limit = (ds.get("spec") or {}).get("revisionHistoryLimit")
        to_keep = 10 if limit is None else int(limit)
        to_kill = len(old) - to_keep
        if to_kill <= 0:
            return
        live: set[str] = set()
        for pods in (await self.nodes_to_daemon_pods(ds, include_deleted_terminal=True)).values():
            for pod in pods:
                h = (md_of(pod).get("labels") or {}).get(REVISION_HASH_LABEL)
                if h:
                    live.add(h)
        for rev in sort_controller_revisions(old):
            if to_kill <= 0:
                break
            if (md_of(rev).get("labels") or {}).get(REVISION_HASH_LABEL) in live:
                continue
            try:
                await self.history.delete_controller_revision(rev)
            except StatusError as err:
                if err.code != 404:
                    raise
            to_kill -= 1

    # --------------------------------------------------------------- status

    async def update_status(self, ds: Obj, nodes: list[Obj], hash_: str, *, update_observed_generation: bool) -> None:
        node_pods = await self.nodes_to_daemon_pods(ds)
        desired = current = misscheduled = ready = updated = available = 0
        now = self.clock()
        min_ready = int((ds.get("spec") or {}).get("minReadySeconds") or 0)
        generation = template_generation(ds)
        for node in nodes:
            should_run, _ = node_should_run_daemon_pod(node, ds)
            pods = node_pods.get(name_of(node)) or []
            if should_run:
                desired += 1
                if not pods:
                    continue
                current += 1
                pod = sorted(pods, key=_creation_key)[0]
                if is_pod_ready(pod):
                    ready += 1
                    if is_pod_available(pod, min_ready, now):
                        available += 1
                if is_pod_updated(pod, hash_, generation):
                    updated += 1
            elif pods:
                misscheduled += 1
        counts = {"desiredNumberScheduled": desired, "currentNumberScheduled": current,
                  "numberMisscheduled": misscheduled, "numberReady": ready, "updatedNumberScheduled": updated,
                  "numberAvailable": available, "numberUnavailable": desired - available}
        await self._store_status(ds, counts, update_observed_generation)
        if min_ready > 0 and ready != available:
            self.daemonsets.add_after(key_of(ds), min_ready)

    async def _store_status(self, ds: Obj, counts: dict[str, int], update_observed_generation: bool) -> None:
        status = ds.get("status") or {}
        generation = int(md_of(ds).get("generation") or 0)
        if (all(int(status.get(k) or 0) == v for k, v in counts.items())
                and int(status.get("observedGeneration") or 0) >= generation):
            return
        to_update = deep_copy(ds)
        for attempt in range(2):
            new_status = dict(to_update.get("status") or {})
            if update_observed_generation:
                new_status["observedGeneration"] = generation
            for k, v in counts.items():
                if v == 0 and k in ("updatedNumberScheduled", "numberAvailable", "numberUnavailable"):
                    new_status.pop(k, None)  # omitempty
                else:
                    new_status[k] = v
            to_update["status"] = new_status
            try:
                await self.client.update(DAEMONSETS, to_update, subresource="status")
                return
            except StatusError as err:
                if err.code == 404:
                    return
                if attempt == 1 or err.code != 409:
                    raise
            to_update = await self.client.get(DAEMONSETS, name_of(ds), ns_of(ds))


__all__ = [
    "DAEMON_TOLERATIONS", "DaemonSetsController", "REVISION_HASH_LABEL", "TEMPLATE_GENERATION_LABEL",
    "add_daemon_tolerations", "create_pod_template", "find_updated_pods_on_node", "node_should_run_daemon_pod",
    "replace_node_name_affinity", "revision_patch", "target_node_name",
]
