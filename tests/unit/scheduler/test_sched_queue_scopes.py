"""Hint scopes: the queue's pre-selection of pods for cluster events must change nothing.

A queue using hint scopes and one calling every hint (``_use_scopes = False``)
go through the same seeded random operations, with the real DynamicResources
hints next to scoped and unscoped test hints; their contents, pop order and
incoming-pods metrics must stay identical while the scoped queue calls fewer hints.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest

from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, EventResource, QueueingHint, Status,
)
from kubeplane.scheduler.plugins.dynamicresources.dynamic_resources import CLAIM_HINT_SCOPE, DynamicResources
from kubeplane.scheduler.queue import HintScope, QueueProfile, SchedulingQueue, pod_update_events
from queue_hint_env import Clock, counting, snapshot

NAMESPACES = ("ns-a", "ns-b")
CLAIM_NAMES = tuple(f"c{i}" for i in range(6))
CLAIM_ADD = ClusterEvent(EventResource.RESOURCE_CLAIM, ActionType.ADD, "ResourceClaimAdd")
CLAIM_UPDATE = ClusterEvent(EventResource.RESOURCE_CLAIM, ActionType.UPDATE, "ResourceClaimUpdate")
CLAIM_DELETE = ClusterEvent(EventResource.RESOURCE_CLAIM, ActionType.DELETE, "ResourceClaimDelete")
NODE_ADD = ClusterEvent(EventResource.NODE, ActionType.ADD, "NodeAdd")
SLICE_ADD = ClusterEvent(EventResource.RESOURCE_SLICE, ActionType.ADD, "ResourceSliceAdd")


class Claims:
    """The DRA manager surface the hints and PreEnqueue use: claims by namespace/name."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str], dict] = {}

    def get_claim(self, namespace: str, name: str) -> dict | None:
        return self.objs.get((namespace, name))


def _labels(obj: Any) -> dict:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def other_claim_hint(pod: dict, old: Any, new: Any) -> QueueingHint:
    """Unscoped: any claim labelled ``other`` may help."""
    return QueueingHint.QUEUE if _labels(new).get("other") == "yes" else QueueingHint.SKIP


def colour_hint(pod: dict, old: Any, new: Any) -> QueueingHint:
    """Scoped by colour label: only pods of the claim's colour."""
    if new is None or _labels(new).get("colour") != _labels(pod).get("colour"):
        return QueueingHint.SKIP
    return QueueingHint.QUEUE


colour_hint.queue_scope = HintScope(  # type: ignore[attr-defined]
    lambda pod: [_labels(pod).get("colour")],
    lambda old, new: [] if new is None else [_labels(new).get("colour")],
)


def make_queue(plugin: DynamicResources, clock: Clock, calls: list[int]) -> SchedulingQueue:
    def regs(*pairs: tuple[ClusterEvent, Any]) -> list[ClusterEventWithHint]:
        return [ClusterEventWithHint(ev, None if fn is None else counting(fn, calls)) for ev, fn in pairs]

    dra = [ClusterEventWithHint(r.event, None if r.hint is None else counting(r.hint, calls))
           for r in plugin.events_to_register()]

    def pre_enqueue(pod: dict) -> Status | None:
        return plugin.pre_enqueue(pod)

    first = QueueProfile(
        pre_enqueue=[("DynamicResources", pre_enqueue)],
        hints={"DynamicResources": dra,
               "Other": regs((CLAIM_ADD, other_claim_hint)),
               "Colour": regs((CLAIM_UPDATE, colour_hint), (CLAIM_ADD, colour_hint)),
               "Fit": regs((NODE_ADD, None))})
    second = QueueProfile(pre_enqueue=[("DynamicResources", pre_enqueue)], hints={"DynamicResources": dra})
    return SchedulingQueue({"default-scheduler": first, "second": second}, clock=clock,
                           initial_backoff=1.0, max_backoff=4.0)


def random_pod(rng: random.Random, i: int) -> dict:
    ns = rng.choice(NAMESPACES)
    claims, statuses = [], []
    for j in range(rng.randint(0, 2)):
        if rng.random() < 0.5:
            claims.append({"name": f"pc{j}", "resourceClaimName": rng.choice(CLAIM_NAMES)})
        else:
            claims.append({"name": f"pc{j}", "resourceClaimTemplateName": "tpl"})
            if rng.random() < 0.7:
                statuses.append({"name": f"pc{j}", "resourceClaimName": rng.choice(CLAIM_NAMES)})
    spec: dict[str, Any] = {"containers": [{"name": "c"}], "priority": rng.randint(0, 2)}
    if claims:
        spec["resourceClaims"] = claims
    if rng.random() < 0.2:
        spec["schedulerName"] = "second"
    pod: dict[str, Any] = {"metadata": {"name": f"p{i}", "namespace": ns, "uid": f"uid-{i}",
                                        "labels": {"colour": rng.choice(("red", "blue"))}},
                           "spec": spec, "status": {}}
    if statuses:
        pod["status"]["resourceClaimStatuses"] = statuses
    return pod


def random_claim(rng: random.Random, ns: str, name: str, pod_uids: list[str]) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"claim-{ns}-{name}",
                            "labels": {"colour": rng.choice(("red", "blue")),
                                       "other": rng.choice(("yes", "no", "no"))}}
    if pod_uids and rng.random() < 0.5:
        meta["ownerReferences"] = [{"uid": rng.choice(pod_uids), "controller": True}]
    claim: dict[str, Any] = {"metadata": meta, "spec": {}, "status": {}}
    if rng.random() < 0.4:
        claim["status"]["allocation"] = {"devices": {"results": []}}
    return claim


@pytest.mark.parametrize("seed", range(10))
def test_scoped_event_handling_equals_calling_every_hint(seed: int) -> None:
    rng = random.Random(seed)
    store = Claims()
    handle = Handle()
    handle.dra_manager = store
    plugin = DynamicResources(None, handle)
    clock = Clock()
    calls_scoped, calls_all = [0], [0]
    scoped = make_queue(plugin, clock, calls_scoped)
    plain = make_queue(plugin, clock, calls_all)
    plain._use_scopes = False
    queues = (scoped, plain)
    pods: dict[str, dict] = {}
    claim_events = 0

    def both(fn: Callable[[SchedulingQueue], Any]) -> list[Any]:
        return [fn(q) for q in queues]

    for step in range(400):
        op = rng.random()
        if op < 0.2 or len(pods) < 5:
            pod = random_pod(rng, len(pods))
            pods[pod["metadata"]["name"]] = pod
            both(lambda q: q.add(pod))
        elif op < 0.4:
            popped = both(lambda q: q.try_pop())
            assert [None if p is None else p.key for p in popped] == [None if popped[0] is None
                                                                      else popped[0].key] * 2
            if popped[0] is not None:
                roll = rng.random()
                rejectors = set(rng.sample(["DynamicResources", "Other", "Colour", "Fit"], rng.randint(0, 2)))
                pending = {"DynamicResources"} if rng.random() < 0.1 else set()
                if roll < 0.2:
                    for q, p in zip(queues, popped):
                        q.done(p.pod_uid)
                else:
                    for q, p in zip(queues, popped):
                        p.unschedulable_plugins = set(rejectors)
                        p.pending_plugins = set(pending)
                        q.add_unschedulable_if_not_present(p, q.scheduling_cycle)
        elif op < 0.75:
            claim_events += 1
            ns, name = rng.choice(NAMESPACES), rng.choice(CLAIM_NAMES)
            old = store.objs.get((ns, name))
            uids = [p["metadata"]["uid"] for p in pods.values()]
            kind = rng.random()
            if old is not None and kind < 0.25:
                del store.objs[(ns, name)]
                both(lambda q: q.move_all_to_active_or_backoff(CLAIM_DELETE, old, None))
                continue
            new = random_claim(rng, ns, name, uids)
            if old is not None and kind < 0.6:
                # Deallocation or a status-preserving update are the interesting cases.
                if kind < 0.45 and old["status"].get("allocation"):
                    new["status"] = {}
                else:
                    new["status"] = dict(old["status"])
            store.objs[(ns, name)] = new
            event = CLAIM_ADD if old is None else CLAIM_UPDATE
            both(lambda q: q.move_all_to_active_or_backoff(event, old, new))
        elif op < 0.8:
            name = rng.choice(sorted(pods))
            old_pod = pods[name]
            new_pod = {**old_pod, "status": {"resourceClaimStatuses": [
                {"name": "pc0", "resourceClaimName": rng.choice(CLAIM_NAMES)}]}}
            pods[name] = new_pod
            both(lambda q: q.update(old_pod, new_pod))
            for ev in pod_update_events(old_pod, new_pod):
                both(lambda q: q.move_all_to_active_or_backoff(ev, old_pod, new_pod))
        elif op < 0.86:
            other_event = rng.choice((NODE_ADD, SLICE_ADD))
            both(lambda q: q.move_all_to_active_or_backoff(other_event, None, {"metadata": {"name": f"n{step}"}}))
        elif op < 0.9:
            clock.t += rng.choice((0.5, 1.0, 3.0))
            both(lambda q: q.flush_backoff_q_completed())
        elif op < 0.92:
            clock.t += 301
            both(lambda q: q.flush_unschedulable_pods_left_over())
        else:
            chosen = [pods[n] for n in rng.sample(sorted(pods), 3)]
            both(lambda q: q.activate(chosen))
        assert snapshot(scoped) == snapshot(plain), step

    order = [[], []]
    for i, q in enumerate(queues):
        while (p := q.try_pop()) is not None:
            order[i].append(p.key)
    assert order[0] == order[1]
    assert claim_events > 100
    assert calls_scoped[0] < calls_all[0]


def test_claim_scope_keys_follow_the_hint() -> None:
    """Pods named in spec or status are keyed per namespace; deallocations concern every pod."""
    pod = {"metadata": {"namespace": "ns"},
           "spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "direct"},
                                       {"name": "b", "resourceClaimTemplateName": "tpl"}]},
           "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "generated"}]}}
    assert sorted(CLAIM_HINT_SCOPE.pod_keys(pod)) == [("ns", "direct"), ("ns", "generated")]
    claim = {"metadata": {"name": "direct", "namespace": "ns"}, "status": {}}
    allocated = {**claim, "status": {"allocation": {"devices": {"results": []}}}}
    assert CLAIM_HINT_SCOPE.event_keys(None, claim) == [("ns", "direct")]
    assert CLAIM_HINT_SCOPE.event_keys(claim, allocated) == [("ns", "direct")]
    assert CLAIM_HINT_SCOPE.event_keys(allocated, claim) is None
    assert CLAIM_HINT_SCOPE.event_keys(claim, None) == []
    assert CLAIM_HINT_SCOPE.event_keys(None, {"metadata": {}}) == []


def test_claim_event_only_calls_hints_of_pods_naming_the_claim() -> None:
    """Many waiting pods, one claim update: one hint call, not one per pod."""
    store = Claims()
    handle = Handle()
    handle.dra_manager = store
    plugin = DynamicResources(None, handle)
    calls = [0]
    q = make_queue(plugin, Clock(), calls)
    for i in range(50):
        q.add({"metadata": {"name": f"p{i}", "namespace": "ns-a", "uid": f"u{i}"},
               "spec": {"containers": [{"name": "c"}], "resourceClaims": [{"name": "x", "resourceClaimName": f"c{i}"}]},
               "status": {}})
    assert q.counts()["gated"] == 50
    claim = {"metadata": {"name": "c7", "namespace": "ns-a", "uid": "claim-7"}, "spec": {}, "status": {}}
    store.objs[("ns-a", "c7")] = claim
    q.move_all_to_active_or_backoff(CLAIM_ADD, None, claim)
    assert calls[0] == 1
    assert [p["metadata"]["name"] for p in q.pods_in_active_q()] == ["p7"]
    assert q.counts()["gated"] == 49
