"""Scheduling queue: ordering, backoff, gating, queueing hints, in-flight events, flushes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeplane.scheduler.framework.types import (
    UNSCHEDULABLE_TIMEOUT,
    WILDCARD_EVENT,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    EventResource,
    QueueingHint,
    Status,
)
from kubeplane.scheduler.queue import (
    QueuedPodInfo,
    QueueProfile,
    SchedulingQueue,
    event_label,
    is_pod_updated,
    pod_update_events,
)

NODE_ADD = ClusterEvent(EventResource.NODE, ActionType.ADD)
NODE_LABEL = ClusterEvent(EventResource.NODE, ActionType.UPDATE_NODE_LABEL)
CLAIM_UPDATE = ClusterEvent(EventResource.RESOURCE_CLAIM, ActionType.UPDATE)
GATES_GONE = ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED)
POD_DELETE = ClusterEvent(EventResource.POD, ActionType.DELETE)


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def step(self, d: float) -> None:
        self.t += d


def mkpod(name: str, *, prio: int = 0, ns: str = "default", gates: list[str] | None = None,
          labels: dict[str, str] | None = None, scheduler: str | None = None,
          nominated: str | None = None, cpu: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"priority": prio, "containers": [{"name": "c"}]}
    if cpu is not None:
        spec["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if scheduler:
        spec["schedulerName"] = scheduler
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "labels": labels or {}},
        "spec": spec,
        "status": {},
    }
    if nominated:
        pod["status"]["nominatedNodeName"] = nominated
    return pod


def gates_pre_enqueue(pod: dict[str, Any]) -> Status | None:
    if pod["spec"].get("schedulingGates"):
        return Status.unresolvable("waiting for scheduling gates", plugin="SchedulingGates")
    return None


def big_node_hint(pod: dict[str, Any], old: Any, new: Any) -> QueueingHint:
    labels = ((new or {}).get("metadata") or {}).get("labels") or {}
    return QueueingHint.QUEUE if labels.get("size") == "big" else QueueingHint.SKIP


def make_profile(**extra_hints: list[ClusterEventWithHint]) -> QueueProfile:
    hints: dict[str, list[ClusterEventWithHint]] = {
        "SchedulingGates": [ClusterEventWithHint(GATES_GONE)],
        "Fit": [ClusterEventWithHint(NODE_ADD, big_node_hint), ClusterEventWithHint(POD_DELETE)],
        "Taints": [ClusterEventWithHint(NODE_LABEL)],
        "Claims": [ClusterEventWithHint(CLAIM_UPDATE)],
        "PodTopologySpread": [ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.ADD))],
    }
    hints.update(extra_hints)
    return QueueProfile(pre_enqueue=[("SchedulingGates", gates_pre_enqueue)], hints=hints)


def make_queue(clock: FakeClock | None = None, **kw: Any) -> tuple[SchedulingQueue, FakeClock]:
    clock = clock or FakeClock()
    profile = kw.pop("profile", None) or make_profile()
    q = SchedulingQueue({"default-scheduler": profile}, clock=clock, **kw)
    return q, clock


def fail(q: SchedulingQueue, pinfo: QueuedPodInfo, *plugins: str, pending: tuple[str, ...] = ()) -> None:
    pinfo.unschedulable_plugins = set(plugins)
    pinfo.pending_plugins = set(pending)
    q.add_unschedulable_if_not_present(pinfo, q.scheduling_cycle)


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def pop_names(q: SchedulingQueue) -> list[str]:
    out = []
    while (p := q.try_pop()) is not None:
        out.append(p.pod["metadata"]["name"])
    return out


# ------------------------------------------------------------------------- ordering


def test_priority_order_with_fifo_tiebreak_on_frozen_clock() -> None:
    q, _ = make_queue()
    for name, prio in [("a", 1), ("b", 5), ("c", 1), ("d", 5), ("e", 3)]:
        q.add(mkpod(name, prio=prio))
    assert pop_names(q) == ["b", "d", "e", "a", "c"]


def test_earlier_timestamp_wins_among_equal_priority() -> None:
    q, clock = make_queue()
    q.add(mkpod("late", prio=1))
    # Re-adding with a newer timestamp must not jump ahead of an older pod.
    clock.step(1)
    q.add(mkpod("later", prio=1))
    clock.step(1)
    q.add(mkpod("high", prio=2))
    assert pop_names(q) == ["high", "late", "later"]


def test_pop_increments_cycle_and_attempts_and_marks_in_flight() -> None:
    q, _ = make_queue()
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None and p.attempts == 1 and q.scheduling_cycle == 1
    assert names(q.in_flight_pods()) == ["a"]
    assert q.locate(p.pod) == "in_flight"
    q.done(p.pod_uid)
    assert q.in_flight_pods() == [] and q.locate(p.pod) is None


def test_pods_of_unknown_scheduler_are_ignored() -> None:
    q, _ = make_queue()
    q.add(mkpod("other", scheduler="other-scheduler"))
    q.add(mkpod("mine"))
    assert names(q.pods_in_active_q()) == ["mine"]


def test_initial_attempt_timestamp_set_once() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None and p.initial_attempt_timestamp == 1000.0
    clock.step(5)
    fail(q, p)  # error -> backoff
    clock.step(5)
    q.flush_backoff_q_completed()
    p2 = q.try_pop()
    assert p2 is p and p2.initial_attempt_timestamp == 1000.0 and p2.attempts == 2


# ------------------------------------------------------------------------- backoff


def test_backoff_durations_double_up_to_max() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    durations = []
    for _ in range(6):
        p = q.try_pop()
        assert p is not None
        fail(q, p, "Fit")
        assert q.locate(p.pod) == "unschedulable"
        durations.append(q.backoff_duration(p))
        # Wildcard moves it; it must wait exactly its backoff in backoffQ.
        q.move_all_to_active_or_backoff(WILDCARD_EVENT)
        assert q.locate(p.pod) == "backoff"
        clock.step(durations[-1] - 0.001)
        q.flush_backoff_q_completed()
        assert q.locate(p.pod) == "backoff"
        clock.step(0.001)
        q.flush_backoff_q_completed()
        assert q.locate(p.pod) == "active"
    assert durations == [1, 2, 4, 8, 10, 10]


def test_error_path_uses_consecutive_errors_and_rejection_resets_it() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p)  # no rejector plugins: error
    assert p.consecutive_errors_count == 1 and p.unschedulable_count == 0
    assert q.locate(p.pod) == "backoff" and q.backoff_duration(p) == 1
    clock.step(1)
    q.flush_backoff_q_completed()
    p = q.try_pop()
    assert p is not None
    fail(q, p)
    assert q.backoff_duration(p) == 2 and q.locate(p.pod) == "backoff"
    clock.step(2)
    q.flush_backoff_q_completed()
    p = q.try_pop()
    assert p is not None
    fail(q, p, "Fit")
    assert p.consecutive_errors_count == 0 and p.unschedulable_count == 1
    assert q.backoff_duration(p) == 1
    assert q.locate(p.pod) == "unschedulable"


def test_max_backoff_zero_disables_backoff() -> None:
    q, _ = make_queue(max_backoff=0)
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p)
    assert q.locate(p.pod) == "active"


def test_backoff_queue_orders_by_expiry() -> None:
    q, clock = make_queue()
    q.add(mkpod("x"))
    q.add(mkpod("y"))
    px, py = q.try_pop(), q.try_pop()
    assert px is not None and py is not None
    px.consecutive_errors_count = 3  # next error -> 4th -> 8 s
    fail(q, px)
    fail(q, py)  # 1 s
    clock.step(1)
    q.flush_backoff_q_completed()
    assert names(q.pods_in_active_q()) == ["y"] and names(q.pods_in_backoff_q()) == ["x"]


def test_pop_from_backoff_when_active_empty() -> None:
    q, _ = make_queue(pop_from_backoff=True)
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p, "Fit")
    q.move_all_to_active_or_backoff(WILDCARD_EVENT)
    assert q.locate(p.pod) == "backoff"
    p2 = q.try_pop()
    assert p2 is p and p2.attempts == 2


# ------------------------------------------------------------------------- gating


def test_gated_pod_released_only_by_its_gating_plugin_event() -> None:
    q, clock = make_queue()
    pod = mkpod("g", gates=["example.com/wait"])
    q.add(pod)
    info = q.get(pod)
    assert info is not None and info.gated and info.gating_plugin == "SchedulingGates"
    assert info.gating_plugin_events == [GATES_GONE]
    assert q.locate(pod) == "gated"
    assert q.counts() == {"active": 0, "backoff": 0, "unschedulable": 0, "gated": 1}

    # Events the gate did not register never move it, not even the timeout flush.
    q.move_all_to_active_or_backoff(NODE_ADD, None, {"metadata": {"labels": {"size": "big"}}})
    clock.step(301)
    q.flush_unschedulable_pods_left_over()
    labelled = mkpod("g", gates=["example.com/wait"], labels={"x": "y"})
    q.update(pod, labelled)
    assert q.locate(pod) == "gated"

    ungated = mkpod("g", labels={"x": "y"})
    q.update(labelled, ungated)
    assert q.locate(pod) == "active"
    p = q.try_pop()
    assert p is not None and p.pod is ungated and not p.gated


def test_gated_pod_moved_by_registered_event_but_still_gated_stays() -> None:
    allow = {"ok": False}

    def gate(pod: dict[str, Any]) -> Status | None:
        return None if allow["ok"] else Status.unschedulable("not yet", plugin="Gate")

    prof = make_profile(Gate=[ClusterEventWithHint(CLAIM_UPDATE)])
    prof.pre_enqueue = [("Gate", gate)]
    q, _ = make_queue(profile=prof)
    pod = mkpod("g")
    q.add(pod)
    assert q.locate(pod) == "gated"
    q.move_all_to_active_or_backoff(CLAIM_UPDATE)
    assert q.locate(pod) == "gated"
    allow["ok"] = True
    q.move_all_to_active_or_backoff(NODE_ADD)  # not registered by Gate
    assert q.locate(pod) == "gated"
    q.move_all_to_active_or_backoff(CLAIM_UPDATE)
    assert q.locate(pod) == "active"


# ------------------------------------------------------------------------- hints


def test_hint_skip_keeps_pod_queue_moves_it() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p, "Fit")
    q.move_all_to_active_or_backoff(NODE_ADD, None, {"metadata": {"labels": {"size": "small"}}})
    assert q.locate(p.pod) == "unschedulable"
    # Event registered by another plugin than the rejector: ignored.
    q.move_all_to_active_or_backoff(NODE_LABEL, {}, {})
    assert q.locate(p.pod) == "unschedulable"
    q.move_all_to_active_or_backoff(NODE_ADD, None, {"metadata": {"labels": {"size": "big"}}})
    assert q.locate(p.pod) == "backoff"  # still within its 1 s backoff
    clock.step(1)
    q.flush_backoff_q_completed()
    assert q.locate(p.pod) == "active"


def test_queue_after_backoff_goes_active_when_backoff_already_over() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p, "Fit")
    clock.step(5)
    q.move_all_to_active_or_backoff(POD_DELETE, mkpod("victim"), None)
    assert q.locate(p.pod) == "active"


def test_pending_plugin_queue_means_immediately() -> None:
    q, _ = make_queue()
    q.add(mkpod("a"))
    q.add(mkpod("b"))
    pa, pb = q.try_pop(), q.try_pop()
    assert pa is not None and pb is not None
    fail(q, pa, "Fit", pending=("Claims",))
    fail(q, pb, "Fit", "Claims")
    q.move_all_to_active_or_backoff(CLAIM_UPDATE, {}, {})
    assert q.locate(pa.pod) == "active"  # pending plugin: skips backoff
    assert q.locate(pb.pod) == "backoff"  # unschedulable plugin: after backoff


def test_hint_exception_counts_as_queue() -> None:
    def boom(pod: Any, old: Any, new: Any) -> QueueingHint:
        raise RuntimeError("bad hint")

    q, clock = make_queue(profile=make_profile(Fit=[ClusterEventWithHint(NODE_ADD, boom)]))
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p, "Fit")
    clock.step(2)
    q.move_all_to_active_or_backoff(NODE_ADD, None, {})
    assert q.locate(p.pod) == "active"


def test_move_with_pre_check_filters_pods() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    q.add(mkpod("b"))
    pa, pb = q.try_pop(), q.try_pop()
    assert pa is not None and pb is not None
    fail(q, pa, "Taints")
    fail(q, pb, "Taints")
    clock.step(2)
    q.move_all_to_active_or_backoff(NODE_LABEL, {}, {}, pre_check=lambda pod: pod["metadata"]["name"] == "b")
    assert q.locate(pa.pod) == "unschedulable" and q.locate(pb.pod) == "active"


def test_wildcard_with_pod_targets_only_that_pod() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    q.add(mkpod("b"))
    pa, pb = q.try_pop(), q.try_pop()
    assert pa is not None and pb is not None
    fail(q, pa, "Fit")
    fail(q, pb, "Fit")
    clock.step(2)
    q.move_all_to_active_or_backoff(WILDCARD_EVENT, None, pb.pod)
    assert q.locate(pa.pod) == "unschedulable" and q.locate(pb.pod) == "active"


# ------------------------------------------------------------------------- in flight


def test_event_while_in_flight_is_replayed_on_return() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    q.add(mkpod("b"))
    pa, pb = q.try_pop(), q.try_pop()
    assert pa is not None and pb is not None
    q.move_all_to_active_or_backoff(NODE_ADD, None, {"metadata": {"labels": {"size": "big"}}})
    assert [e for e, _, _ in q.in_flight_events()] == [NODE_ADD]
    fail(q, pa, "Fit")  # Fit's hint says the node helps -> backoff, not unschedulable
    assert q.locate(pa.pod) == "backoff"
    fail(q, pb, "Taints")  # Taints did not register NodeAdd
    assert q.locate(pb.pod) == "unschedulable"
    assert q.in_flight_events() == [] and q.in_flight_pods() == []


def test_event_before_pop_is_not_replayed() -> None:
    q, _ = make_queue()
    q.add(mkpod("a"))
    q.add(mkpod("b"))
    pa = q.try_pop()
    assert pa is not None
    q.move_all_to_active_or_backoff(NODE_ADD, None, {"metadata": {"labels": {"size": "big"}}})
    pb = q.try_pop()
    assert pb is not None
    fail(q, pb, "Fit")
    assert q.locate(pb.pod) == "unschedulable"


def test_pending_plugin_event_in_flight_requeues_immediately() -> None:
    q, _ = make_queue()
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    q.move_all_to_active_or_backoff(CLAIM_UPDATE, {}, {})
    fail(q, p, pending=("Claims",))
    assert q.locate(p.pod) == "active"


def test_in_flight_event_log_trimming() -> None:
    q, _ = make_queue()
    for n in ("a", "b", "c"):
        q.add(mkpod(n))
    pa = q.try_pop()
    assert pa is not None
    q.move_all_to_active_or_backoff(NODE_ADD, None, {})  # E1: only a needs it
    pb = q.try_pop()
    assert pb is not None
    q.move_all_to_active_or_backoff(NODE_LABEL, {}, {})  # E2: a and b
    assert [e for e, _, _ in q.in_flight_events()] == [NODE_ADD, NODE_LABEL]
    q.done(pb.pod_uid)  # a (older) is still in flight: nothing can go
    assert [e for e, _, _ in q.in_flight_events()] == [NODE_ADD, NODE_LABEL]
    pc = q.try_pop()
    assert pc is not None
    q.done(pa.pod_uid)  # events before c are no longer needed by anyone
    assert q.in_flight_events() == []
    q.move_all_to_active_or_backoff(NODE_ADD, None, {})
    assert len(q.in_flight_events()) == 1
    q.done(pc.pod_uid)
    assert q.in_flight_events() == [] and q.in_flight_pods() == []
    # No pod in flight: events are not logged at all.
    q.move_all_to_active_or_backoff(NODE_ADD, None, {})
    assert q.in_flight_events() == []


def test_update_of_in_flight_pod_recorded_as_pod_events() -> None:
    prof = make_profile(Labels=[ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_LABEL))])
    q, _ = make_queue(profile=prof)
    pod = mkpod("a")
    q.add(pod)
    p = q.try_pop()
    assert p is not None
    new = mkpod("a", labels={"app": "x"})
    q.update(pod, new)
    assert q.locate(pod) == "in_flight"  # not re-added to activeQ
    events = [e for e, _, _ in q.in_flight_events()]
    assert events == [ClusterEvent(EventResource.UNSCHEDULED_POD, ActionType.UPDATE_POD_LABEL)]
    fail(q, p, "Labels")
    assert q.locate(pod) == "backoff"  # the label update may help; backoff still applies


def test_activate() -> None:
    q, _ = make_queue()
    for n in ("u", "b", "f"):
        q.add(mkpod(n))
    pu, pb, pf = q.try_pop(), q.try_pop(), q.try_pop()
    assert pu is not None and pb is not None and pf is not None
    fail(q, pu, "Fit")
    fail(q, pb)  # error backoff
    assert q.locate(pu.pod) == "unschedulable" and q.locate(pb.pod) == "backoff"
    q.activate([pu.pod, pb.pod, pf.pod, mkpod("unknown")])
    assert q.locate(pu.pod) == "active" and q.locate(pb.pod) == "active"
    assert q.locate(mkpod("unknown")) is None
    # The in-flight pod got a ForceActivate for itself only.
    fail(q, pf, "Fit")
    assert q.locate(pf.pod) == "backoff"


# ------------------------------------------------------------------------- flushes


def test_unschedulable_timeout_flush_after_five_minutes() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p, "Fit")
    clock.step(300)
    q.flush_unschedulable_pods_left_over()
    assert q.locate(p.pod) == "unschedulable"
    clock.step(0.5)
    q.flush_unschedulable_pods_left_over()
    assert q.locate(p.pod) == "active"
    assert q.incoming_pods[("active", UNSCHEDULABLE_TIMEOUT.label)] == 1


async def test_run_flushes_periodically_and_is_cancellable() -> None:
    q, clock = make_queue(flush_backoff_interval=0.005, flush_unschedulable_interval=0.005)
    q.add(mkpod("a"))
    q.add(mkpod("b"))
    pa, pb = q.try_pop(), q.try_pop()
    assert pa is not None and pb is not None
    fail(q, pa)  # backoff
    fail(q, pb, "Fit")  # unschedulable
    clock.step(301)
    task = asyncio.create_task(q.run())
    for _ in range(200):
        await asyncio.sleep(0.005)
        if len(q.pods_in_active_q()) == 2:
            break
    assert sorted(names(q.pods_in_active_q())) == ["a", "b"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ------------------------------------------------------------------------- update / delete


def test_update_replaces_in_place_in_active_and_reorders() -> None:
    q, _ = make_queue()
    a, b = mkpod("a", prio=1), mkpod("b", prio=2)
    q.add(a)
    q.add(b)
    a2 = mkpod("a", prio=3)
    q.update(a, a2)
    assert len(q.pods_in_active_q()) == 2
    first = q.try_pop()
    assert first is not None and first.pod is a2


def test_update_replaces_in_backoff() -> None:
    q, _ = make_queue()
    pod = mkpod("a")
    q.add(pod)
    p = q.try_pop()
    assert p is not None
    fail(q, p)
    new = mkpod("a", labels={"v": "2"})
    q.update(pod, new)
    assert q.locate(pod) == "backoff"
    assert q.get(pod) is p and p.pod is new


def test_update_of_unknown_pod_adds_it() -> None:
    q, _ = make_queue()
    old, new = mkpod("a"), mkpod("a", labels={"x": "1"})
    q.update(old, new)
    assert q.pods_in_active_q() == [new]


def test_delete_removes_from_every_queue() -> None:
    q, _ = make_queue()
    pods = [mkpod(n) for n in ("act", "bo", "un")] + [mkpod("gated", gates=["g"]), mkpod("nom", nominated="n1")]
    for p in pods:
        q.add(p)
    # act stays active; bo -> backoff; un -> unschedulable
    infos = {}
    while (pi := q.try_pop()) is not None:
        infos[pi.pod["metadata"]["name"]] = pi
    fail(q, infos["bo"])
    fail(q, infos["un"], "Fit")
    q.add(pods[0])
    assert q.locate(pods[0]) == "active" and q.locate(pods[1]) == "backoff"
    assert q.locate(pods[2]) == "unschedulable" and q.locate(pods[3]) == "gated"
    assert names(q.nominated_pods_for_node("n1")) == ["nom"]
    for p in pods:
        q.delete(p)
    assert q.pending_pods() == ([], "activeQ:0; backoffQ:0; unschedulablePods:0")
    assert q.nominated_pods_for_node("n1") == []


def test_pending_pods_summary_and_counts() -> None:
    q, _ = make_queue()
    for n in ("a", "b", "c"):
        q.add(mkpod(n))
    q.add(mkpod("g", gates=["x"]))
    pa = q.try_pop()
    assert pa is not None
    fail(q, pa)
    pods, summary = q.pending_pods()
    assert summary == "activeQ:2; backoffQ:1; unschedulablePods:1"
    assert sorted(names(pods)) == ["a", "b", "c", "g"]
    assert q.counts() == {"active": 2, "backoff": 1, "unschedulable": 0, "gated": 1}


def test_assigned_pod_added_moves_cross_topology_rejections_in_namespace() -> None:
    q, clock = make_queue()
    q.add(mkpod("same", ns="a"))
    q.add(mkpod("other", ns="b"))
    q.add(mkpod("fit", ns="a"))
    ps = [q.try_pop() for _ in range(3)]
    assert all(ps)
    fail(q, ps[0], "PodTopologySpread")  # type: ignore[arg-type]
    fail(q, ps[1], "PodTopologySpread")  # type: ignore[arg-type]
    fail(q, ps[2], "Fit")  # type: ignore[arg-type]
    clock.step(2)
    bound = mkpod("bound", ns="a")
    bound["spec"]["nodeName"] = "n1"
    q.assigned_pod_added(bound)
    assert names(q.pods_in_active_q()) == ["same"]


def test_cross_topology_candidates_come_from_the_rejecting_groups_in_pool_order() -> None:
    """A bound pod concerns pods rejected by PodTopologySpread in its namespace and
    by InterPodAffinity in any; the pods rejected only by other plugins are not
    candidates, and the candidates keep the pool's order."""
    q, _ = make_queue()
    specs = [("fit1", "a", ("Fit",)), ("ipa-b", "b", ("InterPodAffinity",)),
             ("pts-a", "a", ("PodTopologySpread",)), ("pts-b", "b", ("PodTopologySpread",)),
             ("both-b", "b", ("PodTopologySpread", "InterPodAffinity")), ("fit2", "a", ("Fit", "NodePorts")),
             ("pts-fit-a", "a", ("PodTopologySpread", "Fit")), ("pending-pts", "a", ())]
    for name, ns, _ in specs:
        q.add(mkpod(name, ns=ns))
    for name, _, plugins in specs:
        pinfo = q.try_pop()
        assert pinfo is not None and pinfo.pod["metadata"]["name"] == name
        # pending rejections alone do not make a candidate
        fail(q, pinfo, *plugins, pending=("PodTopologySpread",) if not plugins else ())
    bound = mkpod("bound", ns="a")
    bound["spec"]["nodeName"] = "n1"
    got = [p.pod["metadata"]["name"] for p in q._cross_topology_candidates(bound)]
    assert got == ["ipa-b", "pts-a", "both-b", "pts-fit-a"]


def test_hints_disabled_uses_move_request_cycle() -> None:
    q, _ = make_queue(queueing_hints_enabled=False)
    q.add(mkpod("a"))
    q.add(mkpod("b"))
    pa = q.try_pop()
    assert pa is not None
    cycle_a = q.scheduling_cycle
    q.move_all_to_active_or_backoff(NODE_ADD, None, {})  # a move request during a's cycle
    pa.unschedulable_plugins = {"Fit"}
    q.add_unschedulable_if_not_present(pa, cycle_a)
    assert q.locate(pa.pod) == "backoff"
    pb = q.try_pop()
    assert pb is not None
    pb.unschedulable_plugins = {"Fit"}
    q.add_unschedulable_if_not_present(pb, q.scheduling_cycle)
    assert q.locate(pb.pod) == "unschedulable"


def test_add_unschedulable_ignores_pod_already_queued() -> None:
    q, _ = make_queue()
    pod = mkpod("a")
    q.add(pod)
    p = q.try_pop()
    assert p is not None
    q.add(pod)  # informer re-add while in flight
    fail(q, p, "Fit")
    assert q.locate(pod) == "active" and p.unschedulable_count == 0
    assert q.in_flight_pods() == []


# ------------------------------------------------------------------------- async pop


async def test_pop_blocks_until_add() -> None:
    q, _ = make_queue()
    task = asyncio.create_task(q.pop())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    q.add(mkpod("a"))
    p = await asyncio.wait_for(task, 1)
    assert p is not None and p.pod["metadata"]["name"] == "a" and q.scheduling_cycle == 1


async def test_pop_woken_by_backoff_flush() -> None:
    q, clock = make_queue()
    q.add(mkpod("a"))
    p = await q.pop()
    assert p is not None
    fail(q, p)
    task = asyncio.create_task(q.pop())
    await asyncio.sleep(0)
    assert not task.done()
    clock.step(1)
    q.flush_backoff_q_completed()
    assert (await asyncio.wait_for(task, 1)) is p


async def test_close_unblocks_pop() -> None:
    q, _ = make_queue()
    task = asyncio.create_task(q.pop())
    await asyncio.sleep(0)
    q.close()
    assert await asyncio.wait_for(task, 1) is None
    q.add(mkpod("a"))
    assert await q.pop() is None


# ------------------------------------------------------------------------- pod update events


def test_pod_update_events_classification() -> None:
    base = mkpod("a", cpu="500m", gates=["g"])
    labels = mkpod("a", cpu="500m", gates=["g"], labels={"x": "1"})
    U = EventResource.UNSCHEDULED_POD
    assert pod_update_events(base, labels) == [ClusterEvent(U, ActionType.UPDATE_POD_LABEL)]
    smaller = mkpod("a", cpu="250m", gates=["g"])
    assert pod_update_events(base, smaller) == [ClusterEvent(U, ActionType.UPDATE_POD_SCALE_DOWN)]
    assert pod_update_events(smaller, base) == [ClusterEvent(U, ActionType.UPDATED_POD_OTHER)]
    ungated = mkpod("a", cpu="500m")
    assert pod_update_events(base, ungated) == [ClusterEvent(U, ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED)]
    tol = mkpod("a", cpu="500m", gates=["g"])
    tol["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    assert pod_update_events(base, tol) == [ClusterEvent(U, ActionType.UPDATE_POD_TOLERATIONS)]
    both = mkpod("a", cpu="500m", labels={"x": "1"})
    assert [e.action for e in pod_update_events(base, both)] == [
        ActionType.UPDATE_POD_LABEL, ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED]
    bound = mkpod("a", cpu="500m", gates=["g"], labels={"x": "1"})
    bound["spec"]["nodeName"] = "n1"
    assert pod_update_events(base, bound)[0].resource == EventResource.ASSIGNED_POD


def test_scale_down_counts_init_containers_and_sidecars() -> None:
    old = mkpod("a", cpu="100m")
    old["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]
    new = mkpod("a", cpu="100m")
    new["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "1"}}}]
    assert pod_update_events(old, new)[0].action == ActionType.UPDATE_POD_SCALE_DOWN
    # A sidecar's requests add to the regular containers: 100m+1 > 2? no -> init 2 dominates.
    side = mkpod("a", cpu="100m")
    side["spec"]["initContainers"] = [{"name": "s", "restartPolicy": "Always",
                                       "resources": {"requests": {"cpu": "3"}}}]
    assert pod_update_events(side, old)[0].action == ActionType.UPDATE_POD_SCALE_DOWN
    assert pod_update_events(old, side)[0].action == ActionType.UPDATED_POD_OTHER


def _with_pod_level(pod: dict, **requests: str) -> dict:
    pod["spec"]["resources"] = {"requests": dict(requests)}
    return pod


def test_scale_down_uses_the_requests_the_cache_accounts() -> None:
    """Pod-level requests replace the containers' cpu/memory (as in NodeInfo): the
    queue calls an update a scale-down exactly when some request NodeInfo
    accounts for the pod went down."""
    from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo

    def shrank(old: dict, new: dict) -> bool:
        before, after = NodeInfo(), NodeInfo()
        before.add_pod(PodInfo(old))
        after.add_pod(PodInfo(new))
        return any(after.requested.get(k, 0) < v for k, v in before.requested.items())

    U = EventResource.UNSCHEDULED_POD
    cases = [
        # pod-level cpu 2 -> 1, containers unchanged: the pod's request went down
        (_with_pod_level(mkpod("a", cpu="500m"), cpu="2"), _with_pod_level(mkpod("a", cpu="500m"), cpu="1"), True),
        # containers shrink under an unchanged pod-level cpu: the pod still requests 2
        (_with_pod_level(mkpod("a", cpu="1"), cpu="2"), _with_pod_level(mkpod("a", cpu="200m"), cpu="2"), False),
        # pod-level requests dropped: the containers' 500m is less than 2
        (_with_pod_level(mkpod("a", cpu="500m"), cpu="2"), mkpod("a", cpu="500m"), True),
        # pod-level requests added above the containers
        (mkpod("a", cpu="500m"), _with_pod_level(mkpod("a", cpu="500m"), cpu="2"), False),
    ]
    for old, new, expected in cases:
        assert shrank(old, new) is expected
        action = ActionType.UPDATE_POD_SCALE_DOWN if expected else ActionType.UPDATED_POD_OTHER
        assert pod_update_events(old, new) == [ClusterEvent(U, action)]


def test_scale_down_of_malformed_requests_does_not_raise() -> None:
    old = mkpod("a", cpu="500m")
    new = mkpod("a", cpu="500m")
    new["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    assert ActionType.UPDATE_POD_SCALE_DOWN in [e.action for e in pod_update_events(old, new)]


def test_is_pod_updated_ignores_status_and_rv() -> None:
    a = mkpod("a")
    b = mkpod("a")
    b["metadata"]["resourceVersion"] = "7"
    b["status"] = {"conditions": [{"type": "PodScheduled", "status": "False"}]}
    assert not is_pod_updated(a, b)
    b["spec"]["priority"] = 9
    assert is_pod_updated(a, b)


def test_event_label() -> None:
    assert event_label(NODE_ADD) == "NodeAdd"
    assert event_label(UNSCHEDULABLE_TIMEOUT) == "UnschedulableTimeout"
    assert event_label(NODE_LABEL) == "NodeUpdateNodeLabel"


async def test_pop_woken_by_add_from_another_thread() -> None:
    import threading

    q, _ = make_queue()
    task = asyncio.create_task(q.pop())
    await asyncio.sleep(0)
    t = threading.Thread(target=q.add, args=(mkpod("t"),))
    t.start()
    t.join()
    p = await asyncio.wait_for(task, 2)
    assert p is not None and p.pod["metadata"]["name"] == "t"


def test_backoff_aligned_to_window_when_popping_from_backoff() -> None:
    q, clock = make_queue(FakeClock(1000.3), pop_from_backoff=True)
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p)  # expiry 1001.3 -> window 1001
    assert q.backoff_expiry(p) == 1001.0
    clock.t = 1001.9
    assert q.is_pod_backing_off(p)
    clock.t = 1002.0
    assert not q.is_pod_backing_off(p)


def test_update_in_unschedulable_without_hints_requeues_on_spec_change_only() -> None:
    q, clock = make_queue(queueing_hints_enabled=False)
    pod = mkpod("a")
    q.add(pod)
    p = q.try_pop()
    assert p is not None
    p.unschedulable_plugins = {"Fit"}
    q.add_unschedulable_if_not_present(p, q.scheduling_cycle)
    status_only = mkpod("a")
    status_only["status"] = {"conditions": [{"type": "PodScheduled", "status": "False"}]}
    q.update(pod, status_only)
    assert q.locate(pod) == "unschedulable"
    relabelled = mkpod("a", labels={"x": "1"})
    q.update(status_only, relabelled)
    assert q.locate(pod) == "backoff"
    clock.step(1)
    q.update(relabelled, mkpod("a", labels={"x": "2"}))  # in backoffQ: replaced in place
    assert q.locate(pod) == "backoff"


def test_assigned_pod_scale_down_considers_all_unschedulable_pods() -> None:
    scale_down = ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_SCALE_DOWN)
    q, clock = make_queue(profile=make_profile(Fit=[ClusterEventWithHint(scale_down)]))
    q.add(mkpod("a"))
    p = q.try_pop()
    assert p is not None
    fail(q, p, "Fit")
    clock.step(2)
    old, new = mkpod("bound", cpu="2"), mkpod("bound", cpu="1")
    old["spec"]["nodeName"] = new["spec"]["nodeName"] = "n1"
    q.assigned_pod_updated(old, new, pod_update_events(old, new)[0])
    assert q.locate(p.pod) == "active"


def test_crashing_pre_enqueue_gates_the_pod() -> None:
    def crash(pod: Any) -> Status | None:
        raise ValueError("boom")

    prof = make_profile()
    prof.pre_enqueue = [("Crash", crash)]
    q, _ = make_queue(profile=prof)
    q.add(mkpod("a"))
    info = q.get(mkpod("a"))
    assert info is not None and info.gating_plugin == "Crash" and "Crash" in info.unschedulable_plugins


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "add", "delete", "pop", "peek"]),
                          st.integers(0, 11), st.integers(-2, 2)), max_size=300))
def test_keyed_heap_matches_a_sorted_model(ops: list[tuple[str, int, int]]) -> None:
    """activeQ's heap under random adds, updates, deletes, pops and peeks (with
    stale entries piling up and compactions) answers as a sorted dict would."""
    from kubeplane.scheduler.queue import KeyedHeap, QueuedPodInfo

    heap = KeyedHeap(lambda p: (-p.priority, p.seq))
    model: dict[str, tuple[int, int]] = {}
    seq = 0
    for op, i, prio in ops:
        key = f"default/p{i}"
        if op == "add":
            seq += 1
            heap.add_or_update(QueuedPodInfo(mkpod(f"p{i}", prio=prio), seq=seq))
            model[key] = (-prio, seq)
        elif op == "delete":
            got = heap.delete(key)
            assert (got is None) == (key not in model)
            model.pop(key, None)
        else:
            want = min(model, key=model.__getitem__) if model else None
            got = heap.pop() if op == "pop" else heap.peek()
            assert (got.key if got else None) == want
            if op == "pop" and want is not None:
                del model[want]
        assert len(heap) == len(model) and sorted(p.key for p in heap.list()) == sorted(model)
        assert all((k in heap) and heap.get(k).key == k for k in model)
        assert len(heap._heap) <= 2 * len(model) + 65
