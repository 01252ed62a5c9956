"""Framework runtime: profile expansion, extension point semantics, permit waiting."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from kubeplane.scheduler.cache import Snapshot
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle, Plugin
from kubeplane.scheduler.plugins.registry import in_tree_registry
from kubeplane.scheduler.framework.runtime import (
    MAX_PERMIT_TIMEOUT, Framework, FrameworkError, merge_plugin_set,
)
from kubeplane.scheduler.framework.types import (
    ClusterEventWithHint, Code, CycleState, EventResource, PreFilterResult, Status,
)

CALLS: list[str] = []


def node(name: str) -> dict:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"}}}


def pod(name: str = "p", priority: int = 0, cpu: str = "1") -> dict:
    return {"metadata": {"name": name, "namespace": "d", "uid": name},
            "spec": {"priority": priority, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}


class Sort(Plugin):
    name = "Sort"

    def less(self, a: Any, b: Any) -> bool:
        return a < b


class Binder(Plugin):
    name = "Binder"

    async def bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        CALLS.append(f"bind:{self.name}:{node_name}")
        return None


class SkipBinder(Binder):
    name = "SkipBinder"

    async def bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        CALLS.append(f"bind:{self.name}")
        return Status.skip()


class Narrow(Plugin):
    """PreFilter narrowing to args['nodes']; filter rejects args['reject']; scores from args."""

    name = "Narrow"

    def pre_filter(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Any:
        if self.args.get("skip"):
            return None, Status.skip()
        if self.args.get("fail"):
            return None, Status.unschedulable("nope")
        if self.args.get("error"):
            return None, Status.as_status(RuntimeError("boom"))
        names = self.args.get("nodes")
        return (PreFilterResult(set(names)) if names is not None else None), None

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        CALLS.append(f"filter:{self.name}:{node_info.name}")
        if node_info.name in self.args.get("reject", ()):
            return Status.unschedulable(f"{self.name} rejects")
        return None

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        return self.args.get("scores", {}).get(node_info.name, 0), None


class Narrow2(Narrow):
    name = "Narrow2"


class Double(Narrow):
    """Scores x2 in normalize (to check range validation)."""

    name = "Double"

    def normalize_score(self, state: CycleState, pod_info: PodInfo, scores: list[list[Any]]) -> Status | None:
        for s in scores:
            s[1] *= 2
        return None


class Res(Plugin):
    name = "Res"

    def reserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        CALLS.append(f"reserve:{self.name}")
        return Status.unschedulable("no") if self.args.get("fail") else None

    def unreserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        CALLS.append(f"unreserve:{self.name}")


class Res2(Res):
    name = "Res2"


class Waiter(Plugin):
    name = "Waiter"

    def permit(self, state: CycleState, pod_info: PodInfo, node_name: str) -> tuple[Status | None, float]:
        return Status.wait(), self.args.get("timeout", 10)


class Waiter2(Waiter):
    name = "Waiter2"


class Rejecter(Plugin):
    name = "Rejecter"

    def permit(self, state: CycleState, pod_info: PodInfo, node_name: str) -> tuple[Status | None, float]:
        return Status.unschedulable("denied"), 0


class Gate(Plugin):
    name = "Gate"

    def pre_enqueue(self, pod: dict) -> Status | None:
        return Status.unresolvable("gated") if pod["metadata"]["name"].startswith("g") else None

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return []


REG: dict[str, type[Plugin]] = {c.name: c for c in (
    Sort, Binder, SkipBinder, Narrow, Narrow2, Double, Res, Res2, Waiter, Waiter2, Rejecter, Gate)}
BASE = [{"name": "Sort"}, {"name": "Binder"}]


def fw(multi: list[dict], args: dict | None = None, plugins: dict | None = None, handle: Handle | None = None) -> Framework:
    profile: dict[str, Any] = {"plugins": dict(plugins or {}),
                               "pluginConfig": [{"name": k, "args": v} for k, v in (args or {}).items()]}
    return Framework(REG, profile, handle, default_plugins=BASE + multi)


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


# ------------------------------------------------------------------ profile


def test_default_profile_order_and_weights() -> None:
    f = Framework(in_tree_registry())
    lp = f.list_plugins()
    # Upstream's default order (plugins kubeplane does not have yet are absent).
    assert lp["filter"] == ["NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity", "NodePorts",
                            "NodeResourcesFit", "VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding",
                            "VolumeZone", "PodTopologySpread", "InterPodAffinity", "DynamicResources"]
    assert lp["score"] == ["TaintToleration", "NodeAffinity", "NodeResourcesFit", "VolumeBinding",
                           "PodTopologySpread", "InterPodAffinity", "NodeResourcesBalancedAllocation",
                           "ImageLocality"]
    assert f.score_weights == {"TaintToleration": 3, "NodeAffinity": 2, "NodeResourcesFit": 1,
                               "VolumeBinding": 1, "PodTopologySpread": 2, "InterPodAffinity": 2,
                               "NodeResourcesBalancedAllocation": 1, "ImageLocality": 1}
    assert lp["reserve"] == ["VolumeBinding", "DynamicResources"]
    assert lp["preBind"] == ["VolumeBinding", "DynamicResources"]
    assert lp["queueSort"] == ["PrioritySort"] and lp["bind"] == ["DefaultBinder"]
    assert lp["postFilter"] == ["DynamicResources", "DefaultPreemption"]
    assert lp["preEnqueue"] == ["SchedulingGates", "DynamicResources"]


def test_custom_weight_and_disable_in_multipoint() -> None:
    f = Framework(in_tree_registry(), {"plugins": {
        "multiPoint": {"enabled": [{"name": "ImageLocality", "weight": 5}], "disabled": [{"name": "NodePorts"}]},
        "score": {"disabled": [{"name": "TaintToleration"}]},
    }})
    assert f.score_weights["ImageLocality"] == 5
    assert "NodePorts" not in f.list_plugins()["filter"]
    assert "TaintToleration" not in f.list_plugins()["score"]
    assert "TaintToleration" in f.list_plugins()["filter"]


def test_explicit_extension_point_overrides_multipoint_weight() -> None:
    f = Framework(in_tree_registry(), {"plugins": {"score": {"enabled": [{"name": "NodeAffinity", "weight": 7}]}}})
    assert f.score_weights["NodeAffinity"] == 7
    # overridden plugins come first, then remaining multipoint ones
    assert f.list_plugins()["score"][0] == "NodeAffinity"


def test_disable_star_on_one_point() -> None:
    f = Framework(in_tree_registry(), {"plugins": {"score": {"disabled": [{"name": "*"}],
                                                             "enabled": [{"name": "ImageLocality"}]}}})
    assert f.list_plugins()["score"] == ["ImageLocality"]


def test_invalid_profiles() -> None:
    with pytest.raises(FrameworkError, match='"Nope" does not exist'):
        Framework(in_tree_registry(), {"plugins": {"multiPoint": {"enabled": [{"name": "Nope"}]}}})
    with pytest.raises(FrameworkError, match="does not extend score"):
        Framework(in_tree_registry(), {"plugins": {"score": {"enabled": [{"name": "NodePorts"}]}}})
    with pytest.raises(FrameworkError, match="no queue sort"):
        Framework(in_tree_registry(), {"plugins": {"queueSort": {"disabled": [{"name": "*"}]}}})
    with pytest.raises(FrameworkError, match="bind plugin"):
        Framework(in_tree_registry(), {"plugins": {"bind": {"disabled": [{"name": "DefaultBinder"}]}}})


def test_merge_plugin_set_replaces_in_place() -> None:
    merged = merge_plugin_set({"enabled": [{"name": "A"}, {"name": "B"}, {"name": "C"}]},
                              {"enabled": [{"name": "X"}, {"name": "B", "weight": 4}], "disabled": [{"name": "C"}]})
    assert merged["enabled"] == [{"name": "A"}, {"name": "B", "weight": 4}, {"name": "X"}]


def test_events_to_register() -> None:
    f = fw([{"name": "Narrow"}, {"name": "Gate"}])
    ev = f.events_to_register()
    assert ev["Gate"] == []
    assert ev["Narrow"][0].event.resource == EventResource.WILDCARD and ev["Narrow"][0].hint is None
    assert "Sort" not in ev and "Binder" not in ev
    builtin = Framework(in_tree_registry()).events_to_register()
    assert "ImageLocality" not in builtin and "NodeResourcesBalancedAllocation" not in builtin
    assert {e.event.resource for e in builtin["NodeResourcesFit"]} == {EventResource.POD, EventResource.NODE}


# ------------------------------------------------------------------ running


def test_pre_enqueue_sets_plugin() -> None:
    f = fw([{"name": "Gate"}])
    assert f.run_pre_enqueue_plugins(pod("ok")) is None
    s = f.run_pre_enqueue_plugins(pod("gated"))
    assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and s.plugin == "Gate"


def test_pre_filter_results_are_intersected() -> None:
    f = fw([{"name": "Narrow"}, {"name": "Narrow2"}], {"Narrow": {"nodes": ["a", "b"]}, "Narrow2": {"nodes": ["b", "c"]}})
    r, s, _ = f.run_pre_filter_plugins(CycleState(), PodInfo(pod()), [])
    assert s is None and r is not None and r.node_names == {"b"}


def test_pre_filter_empty_intersection() -> None:
    f = fw([{"name": "Narrow"}, {"name": "Narrow2"}], {"Narrow": {"nodes": ["a"]}, "Narrow2": {"nodes": ["c"]}})
    _, s, plugins = f.run_pre_filter_plugins(CycleState(), PodInfo(pod()), [])
    assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert s.message() == "node(s) didn't satisfy plugin(s) [Narrow Narrow2] simultaneously"
    assert plugins == {"Narrow", "Narrow2"}
    f1 = fw([{"name": "Narrow"}], {"Narrow": {"nodes": []}})
    _, s1, _ = f1.run_pre_filter_plugins(CycleState(), PodInfo(pod()), [])
    assert s1 is not None and s1.message() == "node(s) didn't satisfy plugin Narrow"


def test_pre_filter_skip_reject_error() -> None:
    state = CycleState()
    f = fw([{"name": "Narrow"}, {"name": "Narrow2"}], {"Narrow": {"skip": True}})
    r, s, _ = f.run_pre_filter_plugins(state, PodInfo(pod()), [])
    assert s is None and r is None and state.skip_filter_plugins == {"Narrow"}
    assert f.run_filter_plugins(state, PodInfo(pod()), NodeInfo(node("a"))) is None
    assert CALLS == ["filter:Narrow2:a"]
    _, s, pl = fw([{"name": "Narrow"}], {"Narrow": {"fail": True}}).run_pre_filter_plugins(CycleState(), PodInfo(pod()), [])
    assert s is not None and s.code == Code.UNSCHEDULABLE and s.plugin == "Narrow" and pl == {"Narrow"}
    _, s, _ = fw([{"name": "Narrow"}], {"Narrow": {"error": True}}).run_pre_filter_plugins(CycleState(), PodInfo(pod()), [])
    assert s is not None and s.code == Code.ERROR and "running PreFilter plugin 'Narrow'" in s.message()


def test_filter_stops_at_first_failure() -> None:
    f = fw([{"name": "Narrow"}, {"name": "Narrow2"}], {"Narrow": {"reject": ["a"]}})
    s = f.run_filter_plugins(CycleState(), PodInfo(pod()), NodeInfo(node("a")))
    assert s is not None and s.plugin == "Narrow" and s.reasons == ["Narrow rejects"]
    assert CALLS == ["filter:Narrow:a"]


@dataclass
class Nominator:
    pods: dict[str, list[Any]]

    def nominated_pods_for_node(self, node_name: str) -> list[Any]:
        return self.pods.get(node_name, [])


def test_filter_with_nominated_pods() -> None:
    reg = in_tree_registry()
    high = pod("high", priority=10, cpu="3")
    low = pod("low", priority=0, cpu="3")
    handle = Handle(nominator=Nominator({"a": [PodInfo(high)], "b": [low]}))  # PodInfo or dict
    f = Framework(reg, None, handle)
    p = PodInfo(pod("me", priority=5, cpu="2"))
    state = CycleState()
    _, s, _ = f.run_pre_filter_plugins(state, p, [])
    assert s is None
    # node a has a higher-priority nominated pod using 3 of 4 cpus
    s = f.run_filter_plugins_with_nominated_pods(state, p, NodeInfo(node("a")))
    assert s is not None and s.reasons == ["Insufficient cpu"]
    # lower-priority nominated pods are ignored
    assert f.run_filter_plugins_with_nominated_pods(state, p, NodeInfo(node("b"))) is None
    assert f.run_filter_plugins_with_nominated_pods(state, PodInfo(high), NodeInfo(node("a"))) is None


def test_scores_weighted_and_summed() -> None:
    f = fw([{"name": "Narrow", "weight": 2}, {"name": "Narrow2", "weight": 3}],
           {"Narrow": {"scores": {"a": 10, "b": 50}}, "Narrow2": {"scores": {"a": 100, "b": 0}}})
    nodes = [NodeInfo(node("a")), NodeInfo(node("b"))]
    res, s = f.run_score_plugins(CycleState(), PodInfo(pod()), nodes)
    assert s is None
    assert [(r.name, r.total_score) for r in res] == [("a", 320), ("b", 100)]
    assert res[0].scores == [("Narrow", 20), ("Narrow2", 300)]


def test_score_out_of_range_after_normalize_is_an_error() -> None:
    f = fw([{"name": "Double"}], {"Double": {"scores": {"a": 60}}})
    _, s = f.run_score_plugins(CycleState(), PodInfo(pod()), [NodeInfo(node("a"))])
    assert s is not None and s.code == Code.ERROR and "invalid score 120" in s.message()


def test_skipped_score_plugins() -> None:
    f = fw([{"name": "Narrow"}], {"Narrow": {"scores": {"a": 60}}})
    state = CycleState()
    state.skip_score_plugins = {"Narrow"}
    res, _ = f.run_score_plugins(state, PodInfo(pod()), [NodeInfo(node("a"))])
    assert res[0].total_score == 0 and res[0].scores == []


def test_reserve_failure_and_reverse_unreserve() -> None:
    f = fw([{"name": "Res"}, {"name": "Res2"}], {"Res2": {"fail": True}})
    s = f.run_reserve_plugins_reserve(CycleState(), PodInfo(pod()), "a")
    assert s is not None and s.plugin == "Res2"
    f.run_reserve_plugins_unreserve(CycleState(), PodInfo(pod()), "a")
    assert CALLS == ["reserve:Res", "reserve:Res2", "unreserve:Res2", "unreserve:Res"]


async def test_permit_wait_then_allow() -> None:
    f = fw([{"name": "Waiter"}, {"name": "Waiter2"}])
    pi = PodInfo(pod())
    s = f.run_permit_plugins(CycleState(), pi, "a")
    assert s is not None and s.code == Code.WAIT
    wp = f.get_waiting_pod(pi.uid)
    assert wp is not None and wp.get_pending_plugins() == ["Waiter", "Waiter2"]
    task = asyncio.create_task(f.wait_on_permit(pi))
    await asyncio.sleep(0)
    wp.allow("Waiter")
    await asyncio.sleep(0)
    assert not task.done()
    wp.allow("Waiter2")
    assert await task is None
    assert f.get_waiting_pod(pi.uid) is None


async def test_permit_reject_and_timeout() -> None:
    f = fw([{"name": "Waiter"}])
    pi = PodInfo(pod())
    f.run_permit_plugins(CycleState(), pi, "a")
    f.get_waiting_pod(pi.uid).reject("Waiter", "go away")  # type: ignore[union-attr]
    s = await f.wait_on_permit(pi)
    assert s is not None and s.code == Code.UNSCHEDULABLE and s.plugin == "Waiter" and s.reasons == ["go away"]
    f2 = fw([{"name": "Waiter"}], {"Waiter": {"timeout": 0.01}})
    f2.run_permit_plugins(CycleState(), pi, "a")
    s = await asyncio.wait_for(f2.wait_on_permit(pi), 2)
    assert s is not None and s.is_rejected() and s.reasons == ["rejected due to timeout after waiting 10ms at plugin Waiter"]


async def test_permit_timeout_capped_and_rejection_wins() -> None:
    f = fw([{"name": "Waiter"}], {"Waiter": {"timeout": 10 ** 6}})
    pi = PodInfo(pod())
    f.run_permit_plugins(CycleState(), pi, "a")
    wp = f.get_waiting_pod(pi.uid)
    assert wp is not None and wp._timers[0].when() - asyncio.get_running_loop().time() <= MAX_PERMIT_TIMEOUT
    wp.allow("Waiter")
    assert await f.wait_on_permit(pi) is None
    f2 = fw([{"name": "Waiter"}, {"name": "Rejecter"}])
    s = f2.run_permit_plugins(CycleState(), pi, "a")
    assert s is not None and s.plugin == "Rejecter" and f2.get_waiting_pod(pi.uid) is None


async def test_bind_skips_to_next_binder() -> None:
    f = fw([], plugins={"bind": {"enabled": [{"name": "SkipBinder"}]}})
    assert f.list_plugins()["bind"] == ["Binder", "SkipBinder"]
    f = fw([], plugins={"bind": {"disabled": [{"name": "*"}], "enabled": [{"name": "SkipBinder"}, {"name": "Binder"}]}})
    assert await f.run_bind_plugins(CycleState(), PodInfo(pod()), "n1") is None
    assert CALLS == ["bind:SkipBinder", "bind:Binder:n1"]


def test_snapshot_lister_through_handle() -> None:
    snap = Snapshot.from_objects([node("a"), node("b")], [])
    h = Handle(snapshot=snap)
    f = Framework(in_tree_registry(), None, h)
    assert [ni.name for ni in f.handle.node_infos()] == ["a", "b"]
    assert h.framework is f


def test_skip_status_is_shared_and_read_only() -> None:
    from kubeplane.scheduler.framework.types import Code, Status

    s = Status.skip()
    assert s is Status.skip() and s.is_skip() and s == Status(Code.SKIP) and s.message() == ""
    with pytest.raises(AttributeError):
        s.plugin = "SomePlugin"
    with pytest.raises(AttributeError):
        s.with_plugin("SomePlugin")
    assert s.plugin == "" and Status.skip().plugin == ""
