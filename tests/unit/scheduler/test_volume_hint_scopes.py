"""Hint scopes of the volume plugins must be exact: they may only hide Skip answers.

Two checks on seeded random pods and events: (1) the scope contract itself,
for every scoped hint of VolumeBinding, VolumeZone, VolumeRestrictions and
NodeVolumeLimits: when a pod's keys and an event's keys are disjoint, the
hint answers Skip without raising; (2) a queue pre-selecting through the
scopes and one calling every hint (``_use_scopes = False``) go through the
same random operations and must keep identical contents, pop order and
metrics, while the scoped queue calls fewer hints.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest

from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, EventResource, QueueingHint,
)
from kubeplane.scheduler.plugins.node_volume_limits import NodeVolumeLimits
from kubeplane.scheduler.plugins.volumebinding import (
    CLAIM_HINT_SCOPE, PV_HINT_SCOPE, VolumeBinding, claim_keys_of_pod,
)
from kubeplane.scheduler.plugins.volume_restrictions import VolumeRestrictions
from kubeplane.scheduler.plugins.volume_zone import VolumeZone
from kubeplane.scheduler.queue import QueueProfile, SchedulingQueue, hint_scope
from kubeplane.scheduler.plugins.volumebinding.binder import pod_claim_names
from queue_hint_env import Clock, counting, snapshot

NAMESPACES = ("ns-a", "ns-b", None)
CLAIMS = ("c0", "c1", "c2", "", None, "p1-eph")
CLASSES = ("fast", "slow", "")
DISKS = ("d0", "d1", None)
DRIVERS = ("drv-a", "drv-b", None)
ZONE = "topology.kubernetes.io/zone"

PV_ADD = ClusterEvent(EventResource.PERSISTENT_VOLUME, ActionType.ADD, "PersistentVolumeAdd")
PV_UPDATE = ClusterEvent(EventResource.PERSISTENT_VOLUME, ActionType.UPDATE, "PersistentVolumeUpdate")
PVC_ADD = ClusterEvent(EventResource.PERSISTENT_VOLUME_CLAIM, ActionType.ADD, "PersistentVolumeClaimAdd")
PVC_UPDATE = ClusterEvent(EventResource.PERSISTENT_VOLUME_CLAIM, ActionType.UPDATE, "PersistentVolumeClaimUpdate")
POD_DELETE = ClusterEvent(EventResource.ASSIGNED_POD, ActionType.DELETE, "AssignedPodDelete")
SC_ADD = ClusterEvent(EventResource.STORAGE_CLASS, ActionType.ADD, "StorageClassAdd")
SC_UPDATE = ClusterEvent(EventResource.STORAGE_CLASS, ActionType.UPDATE, "StorageClassUpdate")
CSI_NODE_ADD = ClusterEvent(EventResource.CSI_NODE, ActionType.ADD, "CSINodeAdd")
CSI_NODE_UPDATE = ClusterEvent(EventResource.CSI_NODE, ActionType.UPDATE, "CSINodeUpdate")
CSI_DRIVER_UPDATE = ClusterEvent(EventResource.CSI_DRIVER, ActionType.UPDATE, "CSIDriverUpdate")
CAPACITY_UPDATE = ClusterEvent(EventResource.CSI_STORAGE_CAPACITY, ActionType.UPDATE, "CSIStorageCapacityUpdate")
NODE_ADD = ClusterEvent(EventResource.NODE, ActionType.ADD, "NodeAdd")


class Claims:
    """PVCs by ``namespace/name``: the binder's pvc cache and VolumeRestrictions' lister."""

    def __init__(self) -> None:
        self.objs: dict[str, dict] = {}

    def get(self, key: str) -> dict | None:
        return self.objs.get(key)

    def get_by_key(self, key: str) -> dict | None:
        return self.objs.get(key)


class Binder:
    def __init__(self, claims: Claims) -> None:
        self.pvc_cache = claims


def make_plugins(claims: Claims) -> dict[str, Any]:
    handle = Handle()
    handle.volume_binder = Binder(claims)
    restrictions = VolumeRestrictions(None, handle)
    restrictions.pvc_lister = claims
    return {"VolumeBinding": VolumeBinding(None, handle), "VolumeZone": VolumeZone(None, handle),
            "VolumeRestrictions": restrictions, "NodeVolumeLimits": NodeVolumeLimits(None, handle)}


# ------------------------------------------------------------------ random objects

def random_volume(rng: random.Random, j: int) -> dict:
    vol: dict[str, Any] = {"name": rng.choice((f"v{j}", "eph", None))}
    kind = rng.random()
    if kind < 0.45:
        vol["persistentVolumeClaim"] = {} if rng.random() < 0.05 else {"claimName": rng.choice(CLAIMS)}
        if rng.random() < 0.05:
            vol["ephemeral"] = {}
    elif kind < 0.6:
        vol["ephemeral"] = {"volumeClaimTemplate": {}}
    elif kind < 0.68:
        vol["gcePersistentDisk"] = {"pdName": rng.choice(DISKS), "readOnly": rng.random() < 0.5}
    elif kind < 0.74:
        vol["awsElasticBlockStore"] = {"volumeID": rng.choice(DISKS)}
    elif kind < 0.8:
        vol["iscsi"] = {"iqn": rng.choice(DISKS), "readOnly": rng.random() < 0.5}
    elif kind < 0.86:
        vol["rbd"] = {"monitors": rng.sample(("m1", "m2", "m3"), rng.randint(0, 2)),
                      "pool": rng.choice(("rbd", None, "p")), "image": rng.choice(DISKS),
                      "readOnly": rng.random() < 0.5}
    elif kind < 0.93:
        vol["csi"] = {"driver": rng.choice(DRIVERS)} if rng.random() < 0.9 else {}
    else:
        vol["emptyDir"] = {}
    return vol


def random_pod(rng: random.Random, i: int, assigned: bool = False) -> dict:
    meta: dict[str, Any] = {"name": rng.choice((f"p{i}", "p1")) if not assigned else f"a{i}",
                            "uid": f"uid-{i}-{assigned}"}
    ns = rng.choice(NAMESPACES)
    if ns is not None:
        meta["namespace"] = ns
    spec: dict[str, Any] = {"containers": [{"name": "c"}],
                            "volumes": [random_volume(rng, j) for j in range(rng.randint(0, 3))]}
    if assigned and rng.random() < 0.8:
        spec["nodeName"] = "n1"
    return {"metadata": meta, "spec": spec, "status": {}}


def random_claim(rng: random.Random) -> dict:
    meta: dict[str, Any] = {"name": rng.choice(CLAIMS), "uid": f"claim-{rng.random()}"}
    ns = rng.choice(NAMESPACES)
    if ns is not None:
        meta["namespace"] = ns
    spec: dict[str, Any] = {"storageClassName": rng.choice(CLASSES),
                            "accessModes": rng.sample(("ReadWriteOnce", "ReadWriteOncePod"), rng.randint(0, 1)),
                            "resources": {"requests": {"storage": rng.choice(("1Gi", "5Gi"))}}}
    if rng.random() < 0.3:
        spec["volumeName"] = rng.choice(("pv-0", "pv-1"))
    if rng.random() < 0.3:
        spec["selector"] = {"matchLabels": {"app": rng.choice(("x", "y"))}}
    return {"metadata": meta, "spec": spec, "status": {}}


def random_pv(rng: random.Random) -> dict:
    labels = {"app": rng.choice(("x", "y"))}
    if rng.random() < 0.4:
        labels[ZONE] = rng.choice(("z1", "z2"))
    meta: dict[str, Any] = {"name": rng.choice(("pv-0", "pv-1")), "labels": labels}
    if rng.random() < 0.1:
        meta["deletionTimestamp"] = "now"
    spec: dict[str, Any] = {"storageClassName": rng.choice(CLASSES), "capacity": {"storage": rng.choice(("1Gi", "5Gi"))},
                            "accessModes": rng.sample(("ReadWriteOnce", "ReadWriteOncePod"), rng.randint(0, 2))}
    if rng.random() < 0.4:
        ref: dict[str, Any] = {"name": rng.choice(CLAIMS)}
        ns = rng.choice(NAMESPACES)
        if ns is not None:
            ref["namespace"] = ns
        spec["claimRef"] = ref
    phase = rng.choice(("Available", "Available", "Pending", "Bound", None))
    return {"metadata": meta, "spec": spec, "status": {"phase": phase} if phase else {}}


def random_csi_node(rng: random.Random) -> dict:
    return {"metadata": {"name": "n1", "annotations": {
                "storage.alpha.kubernetes.io/migrated-plugins": rng.choice(("a", "b"))}},
            "spec": {"drivers": [{"name": d, "allocatable": {"count": rng.randint(1, 3)}}
                                 for d in rng.sample(("drv-a", "drv-b"), rng.randint(0, 2))]}}


def random_event(rng: random.Random, claims: Claims, i: int) -> tuple[ClusterEvent, Any, Any]:
    """A registered event with plausible (old, new) objects; claim events also update ``claims``."""
    kind = rng.random()
    if kind < 0.3:
        old = random_pv(rng) if rng.random() < 0.5 else None
        return (PV_ADD if old is None else PV_UPDATE), old, random_pv(rng)
    if kind < 0.5:
        new = random_claim(rng)
        md = new["metadata"]
        key = f"{md.get('namespace') or 'default'}/{md['name']}"
        old = claims.objs.get(key)
        claims.objs[key] = new
        return (PVC_ADD if old is None else PVC_UPDATE), old, new
    if kind < 0.62:
        return POD_DELETE, random_pod(rng, i, assigned=True), None
    if kind < 0.7:
        sc = {"metadata": {"name": "fast"}, "volumeBindingMode": rng.choice(("WaitForFirstConsumer", "Immediate")),
              "allowedTopologies": rng.choice((None, [{"zone": "z1"}]))}
        old = None if rng.random() < 0.5 else {**sc, "allowedTopologies": rng.choice((None, [{"zone": "z2"}]))}
        return (SC_ADD if old is None else SC_UPDATE), old, sc
    if kind < 0.8:
        old = None if rng.random() < 0.3 else random_csi_node(rng)
        return (CSI_NODE_ADD if old is None else CSI_NODE_UPDATE), old, random_csi_node(rng)
    if kind < 0.9:
        def driver(cap: bool) -> dict:
            return {"metadata": {"name": rng.choice(DRIVERS)}, "spec": {"storageCapacity": cap}}
        return CSI_DRIVER_UPDATE, driver(rng.random() < 0.6), driver(rng.random() < 0.4)
    if kind < 0.95:
        def capacity() -> dict:
            cap: dict[str, Any] = {"capacity": rng.choice(("1Gi", "2Gi"))}
            if rng.random() < 0.3:
                cap["maximumVolumeSize"] = rng.choice(("1Gi", "3Gi"))
            return cap
        return CAPACITY_UPDATE, capacity(), capacity()
    return NODE_ADD, None, {"metadata": {"name": f"n{i}"}}


def scoped_hints(plugins: dict[str, Any]) -> list[tuple[str, ClusterEvent, Callable[..., QueueingHint]]]:
    out = []
    for name, plugin in plugins.items():
        for reg in plugin.events_to_register():
            if reg.hint is not None and hint_scope(reg.hint) is not None:
                out.append((name, reg.event, reg.hint))
    return out


# ------------------------------------------------------------------ contract

@pytest.mark.parametrize("seed", range(6))
def test_disjoint_keys_mean_skip(seed: int) -> None:
    """For every scoped hint: pod keys and event keys disjoint -> Skip, never an exception."""
    rng = random.Random(seed)
    claims = Claims()
    plugins = make_plugins(claims)
    hints = scoped_hints(plugins)
    assert {h[0] for h in hints} == set(plugins)
    pods = [random_pod(rng, i) for i in range(60)]
    hidden = queued = 0
    for i in range(300):
        event, old, new = random_event(rng, claims, i)
        for _, registered, hint in hints:
            if registered.resource != event.resource and not (
                    registered.resource == EventResource.POD and event.resource == EventResource.ASSIGNED_POD):
                continue
            scope = hint_scope(hint)
            assert scope is not None
            event_keys = scope.event_keys(old, new)
            for pod in pods:
                answer = hint(pod, old, new)
                if answer != QueueingHint.SKIP:
                    queued += 1
                if event_keys is None:
                    continue
                if set(scope.pod_keys(pod)).isdisjoint(event_keys):
                    hidden += 1
                    assert answer == QueueingHint.SKIP, (hint, pod, old, new)
    assert hidden > 1000
    assert queued > 100


def test_claim_keys_cover_every_plugins_claim_names() -> None:
    """The shared claim scope holds the names of pod_claim_names, PodInfo and VolumeRestrictions."""
    from kubeplane.scheduler.framework.nodeinfo import PodInfo

    rng = random.Random(7)
    for i in range(300):
        pod = random_pod(rng, i)
        ns = (pod["metadata"].get("namespace")) or "default"
        keys = set(claim_keys_of_pod(pod))
        names = {n for n, _ in pod_claim_names(pod)} | set(PodInfo(pod).pvc_names)
        names |= {(v.get("persistentVolumeClaim") or {}).get("claimName") for v in pod["spec"]["volumes"]}
        assert keys == {(ns, n) for n in names}


def test_pv_scope_follows_claim_ref() -> None:
    """A claimed PV concerns the pods naming its claimRef; an Available one every pod; others none."""
    pod = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}}
    assert PV_HINT_SCOPE.pod_keys(pod) == [("ns", "c")]
    claimed = {"metadata": {"name": "pv"}, "spec": {"claimRef": {"name": "c", "namespace": "ns"}},
               "status": {"phase": "Bound"}}
    assert PV_HINT_SCOPE.event_keys(None, claimed) == [("ns", "c")]
    available = {"metadata": {"name": "pv"}, "spec": {}, "status": {"phase": "Available"}}
    assert PV_HINT_SCOPE.event_keys(None, available) is None
    pending = {"metadata": {"name": "pv"}, "spec": {}, "status": {"phase": "Pending"}}
    assert PV_HINT_SCOPE.event_keys(None, pending) == []
    deleting = {**claimed, "metadata": {"name": "pv", "deletionTimestamp": "now"}}
    assert PV_HINT_SCOPE.event_keys(claimed, deleting) == []
    claim = {"metadata": {"name": "c", "namespace": "ns"}}
    assert CLAIM_HINT_SCOPE.event_keys(None, claim) == [("ns", "c")]
    assert ("ns", "c") in CLAIM_HINT_SCOPE.pod_keys(pod)


# ------------------------------------------------------------------ queue equivalence

def make_queue(plugins: dict[str, Any], clock: Clock, calls: list[int]) -> SchedulingQueue:
    hints = {name: [ClusterEventWithHint(r.event, None if r.hint is None else counting(r.hint, calls))
                    for r in plugin.events_to_register()]
             for name, plugin in plugins.items()}
    hints["Fit"] = [ClusterEventWithHint(NODE_ADD)]
    return SchedulingQueue({"default-scheduler": QueueProfile(hints=hints)}, clock=clock,
                           initial_backoff=1.0, max_backoff=4.0)


@pytest.mark.parametrize("seed", range(8))
def test_scoped_volume_events_equal_calling_every_hint(seed: int) -> None:
    rng = random.Random(seed)
    claims = Claims()
    plugins = make_plugins(claims)
    clock = Clock()
    calls_scoped, calls_all = [0], [0]
    scoped = make_queue(plugins, clock, calls_scoped)
    plain = make_queue(plugins, clock, calls_all)
    plain._use_scopes = False
    queues = (scoped, plain)
    rejector_names = [*plugins, "Fit"]
    added = events = 0

    def both(fn: Callable[[SchedulingQueue], Any]) -> list[Any]:
        return [fn(q) for q in queues]

    for step in range(500):
        op = rng.random()
        if op < 0.15 or added < 8:
            pod = random_pod(rng, added)
            added += 1
            both(lambda q: q.add(pod))
        elif op < 0.4:
            popped = both(lambda q: q.try_pop())
            assert [None if p is None else p.key for p in popped] == [None if popped[0] is None
                                                                      else popped[0].key] * 2
            if popped[0] is not None:
                rejectors = set(rng.sample(rejector_names, rng.randint(0, 2)))
                pending = {rng.choice(rejector_names)} if rng.random() < 0.1 else set()
                if rng.random() < 0.15:
                    for q, p in zip(queues, popped):
                        q.done(p.pod_uid)
                else:
                    for q, p in zip(queues, popped):
                        p.unschedulable_plugins = set(rejectors)
                        p.pending_plugins = set(pending)
                        q.add_unschedulable_if_not_present(p, q.scheduling_cycle)
        elif op < 0.9:
            events += 1
            event, old, new = random_event(rng, claims, step)
            both(lambda q: q.move_all_to_active_or_backoff(event, old, new))
        elif op < 0.96:
            clock.t += rng.choice((0.5, 1.0, 3.0))
            both(lambda q: q.flush_backoff_q_completed())
        else:
            clock.t += 301
            both(lambda q: q.flush_unschedulable_pods_left_over())
        assert snapshot(scoped, "uid") == snapshot(plain, "uid"), step

    order: list[list[str]] = [[], []]
    for i, q in enumerate(queues):
        while (p := q.try_pop()) is not None:
            order[i].append(p.key)
    assert order[0] == order[1]
    assert events > 150
    assert calls_scoped[0] * 2 < calls_all[0]


def test_pv_bound_to_a_claim_only_calls_the_hint_of_its_pod() -> None:
    """Many pods waiting for volumes; a PV bound to one claim calls one hint, not one per pod."""
    claims = Claims()
    plugins = make_plugins(claims)
    calls = [0]
    q = make_queue(plugins, Clock(), calls)
    for i in range(40):
        q.add({"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"},
               "spec": {"containers": [{"name": "c"}],
                        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": f"c{i}"}}]}})
    for _ in range(40):
        p = q.try_pop()
        assert p is not None
        p.unschedulable_plugins = {"VolumeBinding"}
        q.add_unschedulable_if_not_present(p, q.scheduling_cycle)
    assert q.counts()["unschedulable"] == 40
    pv = {"metadata": {"name": "pv"}, "spec": {"claimRef": {"name": "c3", "namespace": "ns"}},
          "status": {"phase": "Bound"}}
    q.move_all_to_active_or_backoff(PV_UPDATE, None, pv)
    assert calls[0] == 1
    assert q.counts()["unschedulable"] == 39
    pending = {"metadata": {"name": "pv2"}, "spec": {}, "status": {"phase": "Pending"}}
    q.move_all_to_active_or_backoff(PV_ADD, None, pending)
    assert calls[0] == 1


def test_available_pv_only_calls_the_hints_of_pods_whose_claims_it_could_serve() -> None:
    """Pods waiting for a PV each select theirs by label: an Available PV calls the hint
    of the pod it can serve (and of pods with a claim not known yet), not of every pod."""
    claims = Claims()
    plugins = make_plugins(claims)
    calls = [0]
    q = make_queue(plugins, Clock(), calls)
    for i in range(40):
        claims.objs[f"ns/c{i}"] = {"metadata": {"name": f"c{i}", "namespace": "ns"},
                                   "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                                            "resources": {"requests": {"storage": "1Gi"}},
                                            "selector": {"matchLabels": {"pv": f"for-{i}"}}}}
        q.add({"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"},
               "spec": {"containers": [{"name": "c"}],
                        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": f"c{i}"}}]}})
    q.add({"metadata": {"name": "early", "namespace": "ns", "uid": "u-early"},  # its claim comes later
           "spec": {"containers": [{"name": "c"}],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "later"}}]}})
    for _ in range(41):
        p = q.try_pop()
        assert p is not None
        p.unschedulable_plugins = {"VolumeBinding"}
        q.add_unschedulable_if_not_present(p, q.scheduling_cycle)
    pv = {"metadata": {"name": "pv-7", "labels": {"pv": "for-7"}},
          "spec": {"storageClassName": "local", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]},
          "status": {"phase": "Available"}}
    q.move_all_to_active_or_backoff(PV_UPDATE, None, pv)
    assert calls[0] == 2  # p7 and the pod whose claim is not known
    assert q.counts()["unschedulable"] == 39
    other_class = {**pv, "metadata": {"name": "pv-x", "labels": {"pv": "for-8"}},
                   "spec": {**pv["spec"], "storageClassName": "other"}}
    q.move_all_to_active_or_backoff(PV_ADD, None, other_class)
    assert calls[0] == 2 and q.counts()["unschedulable"] == 39


def test_the_volume_plugins_share_one_claim_scope() -> None:
    """The PVC hints of the four volume plugins carry the one scope of
    plugins/hint_scopes.py, so the queue files each pod under it once."""
    from kubeplane.scheduler.plugins import hint_scopes

    hints = [VolumeBinding.is_schedulable_after_pvc_change, VolumeZone.is_schedulable_after_pvc_change,
             VolumeRestrictions.is_schedulable_after_pvc_added, NodeVolumeLimits.is_schedulable_after_pvc_added]
    assert all(hint_scope(h) is hint_scopes.CLAIM_HINT_SCOPE for h in hints)
    assert CLAIM_HINT_SCOPE is hint_scopes.CLAIM_HINT_SCOPE
