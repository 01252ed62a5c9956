"""The scheduling loop end to end over a real registry and the in-process client."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.plugins.registry import in_tree_registry
from kubeplane.scheduler.scheduler import (
    PRE_BIND_YIELD_PASSES, FitError, Diagnosis, Scheduler, num_feasible_nodes_to_find,
)
from kubeplane.scheduler.framework.types import Status
from kubeplane.storage.memory import MemoryStore
from helpers import eventually as wait_for

PODS = resource("pods")
NODES = resource("nodes")
EVENTS = resource("events")


def node(name: str, cpu: str = "4", memory: str = "32Gi", pods: str = "110", taints=None, labels=None) -> dict:
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    spec = {"taints": taints} if taints else {}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": spec,
            "status": {"capacity": alloc, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, cpu: str = "100m", **spec_extra) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                                     "resources": {"requests": {"cpu": cpu}}}], **spec_extra}}


@pytest.fixture
async def cluster():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    yield client
    await registry.close()
    await store.close()


async def _start(client) -> tuple[Scheduler, asyncio.Task]:
    sched = Scheduler(client)
    task = asyncio.create_task(sched.run())
    return sched, task


async def _stop(sched, task):
    await sched.stop()
    await asyncio.wait_for(task, 5)


def test_num_feasible_nodes_to_find():
    assert num_feasible_nodes_to_find(0, 50) == 50
    assert num_feasible_nodes_to_find(0, 1000) == 420  # 50 - 1000/125 = 42 %
    assert num_feasible_nodes_to_find(0, 5000) == 500  # 10 %
    assert num_feasible_nodes_to_find(0, 100_000) == 5000  # floor of 5 %
    assert num_feasible_nodes_to_find(1, 1000) == 100  # never below 100
    assert num_feasible_nodes_to_find(30, 1000) == 300


def test_fit_error_message_matches_upstream_format():
    d = Diagnosis(node_to_status={
        "a": Status.unschedulable("Insufficient cpu"),
        "b": Status.unschedulable("Insufficient cpu"),
        "c": Status.unresolvable("node(s) had untolerated taint {k: v}"),
    }, post_filter_msg="preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
    # "<count> <reason>" strings are sorted as strings, as upstream does.
    assert str(FitError({}, 3, d)) == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {k: v}, 2 Insufficient cpu. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
    # A PreFilter rejection is reported once, not per node.
    pre = Diagnosis(node_to_status={"a": Status.unresolvable("x")}, pre_filter_msg="pod has unbound immediate "
                    "PersistentVolumeClaims")
    assert str(FitError({}, 1, pre)) == (
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.")


async def test_pods_are_bound_and_spread_by_resources(cluster):
    for n in ("n1", "n2"):
        await cluster.create(NODES, node(n, cpu="1"))
    sched, task = await _start(cluster)
    try:
        for i in range(4):
            await cluster.create(PODS, pod(f"p{i}", cpu="400m"), "default")

        async def all_bound():
            items = (await cluster.list(PODS, "default"))["items"]
            return all(p["spec"].get("nodeName") for p in items) and items

        items = await wait_for(all_bound)
        per_node = {}
        for p in items:
            per_node.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
            cond = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
            assert cond["status"] == "True"
        # 1 CPU per node, 400m per pod: exactly two fit on each node.
        assert sorted(len(v) for v in per_node.values()) == [2, 2]

        async def scheduled_events():
            evs = (await cluster.list(EVENTS, "default"))["items"]
            return [e for e in evs if e["reason"] == "Scheduled"]

        evs = await wait_for(lambda: _at_least(scheduled_events, 4))
        assert evs[0]["message"].startswith("Successfully assigned default/p")
    finally:
        await _stop(sched, task)


async def _at_least(fn, n):
    got = await fn()
    return got if len(got) >= n else None


async def test_unschedulable_pod_gets_condition_and_event_then_schedules(cluster):
    await cluster.create(NODES, node("small", cpu="500m"))
    await cluster.create(NODES, node("tainted", cpu="8", taints=[{"key": "dedicated", "value": "gpu",
                                                                   "effect": "NoSchedule"}]))
    sched, task = await _start(cluster)
    try:
        await cluster.create(PODS, pod("big", cpu="2"), "default")

        async def failed():
            p = await cluster.get(PODS, "big", "default")
            conds = [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
            return conds[0] if conds and conds[0]["status"] == "False" else None

        cond = await wait_for(failed)
        assert cond["reason"] == "Unschedulable"
        assert cond["message"].startswith("0/2 nodes are available: 1 Insufficient cpu, "
                                          "1 node(s) had untolerated taint {dedicated: gpu}.")
        evs = (await cluster.list(EVENTS, "default"))["items"]
        assert any(e["reason"] == "FailedScheduling" and e["type"] == "Warning" for e in evs)
        # A node update that adds room requeues the pod (NodeResourcesFit's event).
        await cluster.create(NODES, node("roomy", cpu="4"))

        async def bound():
            p = await cluster.get(PODS, "big", "default")
            return p["spec"].get("nodeName")

        assert await wait_for(bound, timeout=15) == "roomy"
    finally:
        await _stop(sched, task)


async def test_other_scheduler_names_are_ignored(cluster):
    await cluster.create(NODES, node("n1"))
    sched, task = await _start(cluster)
    try:
        theirs = await cluster.create(PODS, pod("theirs", schedulerName="other"), "default")
        await cluster.create(PODS, pod("mine"), "default")

        async def mine_bound():
            return (await cluster.get(PODS, "mine", "default"))["spec"].get("nodeName")

        # Sync point: "mine" came after "theirs" on the same watch and is bound, so the
        # scheduler has handled "theirs": had it taken it, it would be queued, in
        # flight, assumed or bound by now (it was first in line).
        await wait_for(mine_bound)
        assert sched.queue.locate(theirs) is None
        assert not sched.cache.is_assumed(theirs)
        assert not (await cluster.get(PODS, "theirs", "default"))["spec"].get("nodeName")
    finally:
        await _stop(sched, task)


async def test_metrics_count_attempts_and_queue_traffic(cluster):
    from kubeplane.scheduler.metrics import SchedulerMetrics

    await cluster.create(NODES, node("n1", cpu="1"))
    metrics = SchedulerMetrics()
    sched = Scheduler(cluster, metrics=metrics)
    task = asyncio.create_task(sched.run())
    try:
        await cluster.create(PODS, pod("ok"), "default")
        await cluster.create(PODS, pod("too-big", cpu="8"), "default")

        async def both_attempted():
            text = metrics.exposition("text/plain")[0].decode()
            return ('scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 1.0' in text
                    and 'result="unschedulable"' in text and text)

        text = await wait_for(both_attempted)
        assert 'scheduler_queue_incoming_pods_total{event="UnscheduledPodAdd",queue="active"} 2.0' in text
        assert 'scheduler_queue_incoming_pods_total{event="ScheduleAttemptFailure",queue="unschedulable"} 1.0' in text
        assert 'scheduler_pending_pods{queue="unschedulable"} 1.0' in text
    finally:
        await _stop(sched, task)


async def test_unschedulable_pods_and_cache_size_gauges(cluster):
    """scheduler_unschedulable_pods counts the pods in the unschedulable pool per
    rejecting plugin (and drops back when they leave it); the cache size gauges
    follow the cache, as upstream's cache cleanup loop sets them."""
    from kubeplane.scheduler.metrics import SchedulerMetrics

    await cluster.create(NODES, node("n1", cpu="1"))
    metrics = SchedulerMetrics()
    sched = Scheduler(cluster, metrics=metrics)
    task = asyncio.create_task(sched.run())
    value = metrics.registry.get_sample_value
    unsched = {"plugin": "NodeResourcesFit", "profile": "default-scheduler"}

    def until(pred):
        async def check():
            return pred()
        return check

    try:
        await cluster.create(PODS, pod("ok"), "default")
        await cluster.create(PODS, pod("too-big", cpu="8"), "default")
        await cluster.create(PODS, pod("too-big-2", cpu="8"), "default")
        await wait_for(until(lambda: value("scheduler_unschedulable_pods", unsched) == 2.0))
        await wait_for(until(lambda: value("scheduler_scheduler_cache_size", {"type": "pods"}) == 1.0))
        assert value("scheduler_scheduler_cache_size", {"type": "nodes"}) == 1.0
        assert value("scheduler_scheduler_cache_size", {"type": "assumed_pods"}) in (0.0, 1.0)
        await cluster.delete(PODS, "too-big", "default")
        await cluster.delete(PODS, "too-big-2", "default")
        await cluster.create(PODS, pod("next"), "default")  # a cycle after the deletions
        await wait_for(until(lambda: value("scheduler_unschedulable_pods", unsched) == 0.0))
    finally:
        await _stop(sched, task)


async def test_plugin_durations_recorded_in_sampled_cycles(cluster):
    import random as _random

    from kubeplane.scheduler.metrics import SchedulerMetrics

    class AlwaysSample(_random.Random):
        def random(self) -> float:  # every cycle is in the 10 % sample
            return 0.0

    await cluster.create(NODES, node("n1"))
    metrics = SchedulerMetrics()
    sched = Scheduler(cluster, metrics=metrics, rng=AlwaysSample(1))
    task = asyncio.create_task(sched.run())
    try:
        await cluster.create(PODS, pod("p"), "default")

        async def recorded():
            text = metrics.exposition("text/plain")[0].decode()
            key = ('scheduler_plugin_execution_duration_seconds_count{extension_point="Bind",'
                   'plugin="DefaultBinder",status="Success"} 1.0')
            return key in text and text

        text = await wait_for(recorded)
        assert 'extension_point="PreFilter",plugin="NodeResourcesFit"' in text
    finally:
        await _stop(sched, task)


def test_node_statuses_name_rows_only_when_read_by_name():
    from kubeplane.scheduler.framework.fastpath import Rejections
    from kubeplane.scheduler.scheduler import NodeStatuses

    names_read = []

    class Counting:
        @property
        def name(self):
            names_read.append(self._n)
            return self._n

        def __init__(self, name):
            self._n = name

    nodes = [Counting(f"n{i}") for i in range(6)]
    fit = Status.unschedulable("Insufficient cpu")
    taint = Status.unresolvable("node(s) had untolerated taint")
    ns = NodeStatuses()
    rej = Rejections()
    rej.add([0, 1, 2], [fit, None, fit], 2)
    rej.add([3, 4, 5], [taint, taint, None], 2)
    rej.distinct.update({id(fit): fit, id(taint): taint})
    ns.add_rejections(nodes, rej)
    assert len(ns) == 4 and sorted(s.reasons[0] for s in ns.values()) == sorted(
        ["Insufficient cpu"] * 2 + ["node(s) had untolerated taint"] * 2)
    assert ns.rejecting_plugins() == {(fit.code, fit.plugin), (taint.code, taint.plugin)}
    assert names_read == []  # counting and the message need no names
    assert ns.get("n1") is None and ns["n2"] is fit and "n3" in ns
    assert dict(ns) == {"n0": fit, "n2": fit, "n3": taint, "n4": taint}
    ns["n1"] = taint
    more = Rejections()
    more.add([5], [fit], 1)
    ns.add_rejections(nodes, more)
    assert len(ns) == 6 and ns["n5"] is fit
    del ns["n0"]
    assert list(ns) == ["n2", "n3", "n4", "n1", "n5"]
    # FitError's message reads the statuses without names
    names_read.clear()
    d = Diagnosis(node_to_status=NodeStatuses())
    d.node_to_status.fill(nodes, fit)
    assert str(FitError({}, 6, d)) == "0/6 nodes are available: 6 Insufficient cpu."
    assert names_read == []
    # counted by status: named entries and rows together, a status missing from
    # ``distinct`` still counted, rows that passed not
    mixed = NodeStatuses({"x": taint})
    odd = Status.unschedulable("Too many pods", "Insufficient cpu")
    rej = Rejections()
    rej.add([0, 1, 2, 3], [fit, None, odd, fit], 3)
    rej.distinct[id(fit)] = fit
    mixed.add_rejections(nodes, rej)
    assert sorted((st.reasons, n) for st, n in mixed.status_counts()) == [
        (["Insufficient cpu"], 2), (["Too many pods", "Insufficient cpu"], 1), (["node(s) had untolerated taint"], 1)]
    assert str(FitError({}, 6, Diagnosis(node_to_status=mixed))) == (
        "0/6 nodes are available: 1 Too many pods, 1 node(s) had untolerated taint, 3 Insufficient cpu.")


class _ChainPreBind(Plugin):
    """A PreBind whose work is a chain of dependent steps (as a volume's API
    writes and informer events are); records the scheduling cycle that was
    current when each pod's chain finished."""

    name = "ChainPreBind"
    STEPS = 6

    def __init__(self, args, handle) -> None:
        super().__init__(args, handle)
        self.finished_at: list[int] = []
        self.scheduler: Scheduler | None = None

    async def pre_bind(self, state, pod_info, node_name):
        for _ in range(self.STEPS):
            await asyncio.sleep(0)
        self.finished_at.append(self.scheduler.queue.scheduling_cycle)
        return None


async def test_prebind_chains_advance_while_pods_wait_to_be_scheduled(cluster):
    """With many pods queued, a binding cycle's PreBind chain is not left to
    advance one step per scheduling cycle: the first pod finishes PreBind
    within a few cycles instead of after STEPS of them."""
    registry = in_tree_registry()
    registry.register(_ChainPreBind)
    profile = {"schedulerName": "default-scheduler",
               "plugins": {"preBind": {"enabled": [{"name": _ChainPreBind.name}]}}}
    await cluster.create(NODES, node("n1", cpu="100", pods="200"))
    for i in range(40):
        await cluster.create(PODS, pod(f"p{i:02d}", cpu="10m"), "default")
    sched = Scheduler(cluster, profiles=[profile], registry=registry, pre_bind_yield_passes=8)
    plugin = next(pl for pl in sched.frameworks["default-scheduler"].pre_bind_plugins
                  if isinstance(pl, _ChainPreBind))
    plugin.scheduler = sched
    task = asyncio.create_task(sched.run())
    try:
        await wait_for(lambda: _async_value(len(plugin.finished_at) >= 40))
        assert sched.queue.scheduling_cycle >= 40
        # The first chain needs STEPS passes of the loop; a cycle yields one
        # pass, plus more while PreBind chains are ready to run.
        assert plugin.finished_at[0] <= 3, plugin.finished_at[:5]
    finally:
        await _stop(sched, task)


async def _async_value(v):
    return v


def test_prebind_yield_passes_default_by_where_the_api_server_runs(cluster):
    """Extra passes only help when PreBind's steps wait for another process."""

    class Remote:
        """The same API, as a client of an API server in another process sees it."""

        def __getattr__(self, name):
            if name == "shares_event_loop":
                raise AttributeError(name)
            return getattr(cluster, name)

    assert Scheduler(cluster).pre_bind_yield_passes == 0
    assert Scheduler(Remote()).pre_bind_yield_passes == PRE_BIND_YIELD_PASSES > 0
