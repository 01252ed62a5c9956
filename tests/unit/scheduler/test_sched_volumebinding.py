"""VolumeBinding plugin and VolumeBinder: every phase, the hints, and the requeue race."""

from __future__ import annotations

import asyncio
import copy
import random

import pytest

from kubeplane.volume.matching import ANN_BOUND_BY_CONTROLLER, ANN_SELECTED_NODE
from kubeplane.scheduler.assumecache import AssumeCache
from kubeplane.scheduler.framework.nodeinfo import PodInfo
from kubeplane.scheduler.framework.types import Code, CycleState, QueueingHint
from kubeplane.scheduler.plugins.volumebinding.passivecache import PV_STORAGE_CLASS_INDEX, pv_storage_class_index
from kubeplane.scheduler.plugins.volumebinding.volume_binding import (
    MSG_UNBOUND_IMMEDIATE,
    build_broken_linear_function,
)
from kubeplane.scheduler.plugins.volumebinding.binder import (
    REASON_BIND_CONFLICT,
    REASON_NODE_CONFLICT,
    REASON_NOT_ENOUGH_SPACE,
    REASON_PV_NOT_EXIST,
)
from fake_client import FakeInformer
from helpers import eventually
from volume_binding_env import Env, node, pod, pv, pvc, random_volume, sc


def reasons(st) -> list[str]:
    assert st is not None and st.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE, st
    return st.reasons


# --------------------------------------------------------------------------- PreFilter


def test_prefilter_skips_pods_without_claims() -> None:
    env = Env()
    state, _, (_, st) = env.cycle({"metadata": {"name": "p", "namespace": "default"},
                                   "spec": {"volumes": [{"name": "e", "emptyDir": {}}]}})
    assert st is not None and st.code == Code.SKIP
    assert env.plugin.filter(state, PodInfo(pod("p")), env.node_info("n1")) is None


def test_prefilter_rejects_missing_lost_deleting_and_foreign_claims() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    assert reasons(env.cycle(pod("p", "nope"))[2][1]) == ['persistentvolumeclaim "nope" not found']
    assert reasons(env.cycle(pod("p", ephemeral="scratch"))[2][1]) == [
        'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-scratch"']
    lost = pvc("lost", volume="gone")
    lost["status"]["phase"] = "Lost"
    env.put("persistentvolumeclaims", lost)
    assert reasons(env.cycle(pod("p", "lost"))[2][1]) == [
        'persistentvolumeclaim "lost" bound to non-existent persistentvolume "gone"']
    dying = pvc("dying")
    dying["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    env.put("persistentvolumeclaims", dying)
    assert reasons(env.cycle(pod("p", "dying"))[2][1]) == ['persistentvolumeclaim "dying" is being deleted']
    env.put("persistentvolumeclaims", pvc("p-scratch"))  # exists but not owned by the pod
    assert "was not created for pod" in reasons(env.cycle(pod("p", ephemeral="scratch"))[2][1])[0]


def test_prefilter_unbound_immediate_claim_is_unresolvable() -> None:
    env = Env()
    env.put("storageclasses", sc("fast", mode="Immediate"))
    env.put("persistentvolumeclaims", pvc("c", cls="fast"))
    assert reasons(env.cycle(pod("p", "c"))[2][1]) == [MSG_UNBOUND_IMMEDIATE]
    # A claim without class is not delayed either.
    env.put("persistentvolumeclaims", pvc("nocls", cls=""))
    assert reasons(env.cycle(pod("p", "nocls"))[2][1]) == [MSG_UNBOUND_IMMEDIATE]


def test_prefilter_class_without_binding_mode_is_an_error() -> None:
    env = Env()
    env.put("storageclasses", sc("weird", mode=None))
    env.put("persistentvolumeclaims", pvc("c", cls="weird"))
    st = env.cycle(pod("p", "c"))[2][1]
    assert st is not None and st.code == Code.ERROR
    assert 'VolumeBindingMode not set for StorageClass "weird"' in st.message()


def test_prefilter_narrows_nodes_for_bound_local_volumes() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    c = pvc("c", volume="pv1", bound=True)
    env.put("persistentvolumeclaims", c)
    env.put("persistentvolumes", pv("pv1", on="n2", claim=c, phase="Bound"))
    _, _, (result, st) = env.cycle(pod("p", "c"))
    assert st is None and result is not None and result.node_names == {"n2"}


# --------------------------------------------------------------------------- Filter


def test_filter_bound_volume_node_affinity_and_missing_pv() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    c = pvc("c", volume="pv1", bound=True)
    env.put("persistentvolumeclaims", c)
    env.put("persistentvolumes", pv("pv1", on="n1", claim=c, phase="Bound"))
    res = env.feasible(pod("p", "c"))
    assert res["n1"] is None and reasons(res["n2"]) == [REASON_NODE_CONFLICT]
    env.put("persistentvolumeclaims", pvc("d", volume="ghost", bound=True))
    res = env.feasible(pod("p", "d"))
    assert reasons(res["n1"]) == [REASON_PV_NOT_EXIST]


def test_filter_static_matches_per_node_smallest_first() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("c", size="2Gi"))
    env.put("persistentvolumes", pv("small-n1", size="1Gi", on="n1"))
    res = env.feasible(pod("p", "c"))
    assert reasons(res["n1"]) == [REASON_BIND_CONFLICT] and reasons(res["n2"]) == [REASON_BIND_CONFLICT]
    env.put("persistentvolumes", pv("big-n2", size="10Gi", on="n2"))
    env.put("persistentvolumes", pv("mid-n2", size="3Gi", on="n2"))
    state, pi, (_, st) = env.cycle(pod("p", "c"))
    assert st is None
    assert reasons(env.plugin.filter(state, pi, env.node_info("n1"))) == [REASON_BIND_CONFLICT]
    assert env.plugin.filter(state, pi, env.node_info("n2")) is None
    chosen = state.read("VolumeBinding").pod_volumes_by_node["n2"].static_bindings
    assert [b.pv["metadata"]["name"] for b in chosen] == ["mid-n2"]


def test_filter_two_claims_do_not_share_one_volume() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumeclaims", pvc("b"))
    env.put("persistentvolumes", pv("only", on="n1"))
    assert reasons(env.feasible(pod("p", "a", "b"))["n1"]) == [REASON_BIND_CONFLICT]
    env.put("persistentvolumes", pv("second", on="n1"))
    assert env.feasible(pod("p", "a", "b"))["n1"] is None


def test_filter_dynamic_provisioning_rules() -> None:
    env = Env()
    env.put("nodes", node("n1", zone="a"))
    env.put("nodes", node("n2", zone="b"))
    # No provisioner: only static volumes could help.
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("c"))
    assert reasons(env.feasible(pod("p", "c"))["n1"]) == [REASON_BIND_CONFLICT]
    # A provisioner restricted to zone a.
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local",
                                 allowedTopologies=[{"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}]))
    res = env.feasible(pod("p", "c"))
    assert res["n1"] is None and reasons(res["n2"]) == [REASON_BIND_CONFLICT]


def test_filter_published_capacity() -> None:
    env = Env()
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local"))
    env.put("persistentvolumeclaims", pvc("c", size="2Gi"))
    assert env.feasible(pod("p", "c")) == {"n1": None, "n2": None}  # nothing published: not tracked
    cap = {"metadata": {"name": "cap-n1", "namespace": "kube-system"}, "storageClassName": "local",
           "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": "n1"}}, "capacity": "5Gi"}
    env.put("csistoragecapacities", cap)
    res = env.feasible(pod("p", "c"))
    assert res["n1"] is None and reasons(res["n2"]) == [REASON_NOT_ENOUGH_SPACE]
    small = dict(cap, maximumVolumeSize="1Gi")  # the per-volume limit wins over the total
    env.put("csistoragecapacities", small)
    assert reasons(env.feasible(pod("p", "c"))["n1"]) == [REASON_NOT_ENOUGH_SPACE]


def test_filter_selected_node_pins_the_claim() -> None:
    env = Env()
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local"))
    env.put("persistentvolumeclaims", pvc("c", **{ANN_SELECTED_NODE: "n2"}))
    env.put("persistentvolumes", pv("free-n1", on="n1"))
    res = env.feasible(pod("p", "c"))
    assert reasons(res["n1"]) == [REASON_BIND_CONFLICT] and res["n2"] is None


# --------------------------------------------------------------------------- Reserve / Unreserve


def _reserve(env: Env, p: dict, node_name: str) -> CycleState:
    state, pi, (_, st) = env.cycle(p)
    assert st is None
    assert env.plugin.filter(state, pi, env.node_info(node_name)) is None
    assert env.plugin.reserve(state, pi, node_name) is None
    return state


def test_reserve_assumes_without_api_writes_and_assumed_pv_is_taken() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumeclaims", pvc("b"))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    state_a = _reserve(env, pod("pa", "a"), "n1")
    binder = env.plugin.binder
    assert binder is not None
    assumed = binder.pv_cache.get("pv1")
    assert assumed["spec"]["claimRef"]["name"] == "a" and assumed["spec"]["claimRef"]["uid"] == "uid-a"
    assert assumed["metadata"]["annotations"][ANN_BOUND_BY_CONTROLLER] == "yes"
    assert "claimRef" not in env.get("persistentvolumes", "pv1")["spec"]  # informer untouched
    assert env.client.updates == []
    # Pod b sees pv1 as taken through the passive cache.
    assert reasons(env.feasible(pod("pb", "b"))["n1"]) == [REASON_BIND_CONFLICT]
    env.plugin.unreserve(state_a, PodInfo(pod("pa", "a")), "n1")
    assert "claimRef" not in binder.pv_cache.get("pv1")["spec"]
    assert env.feasible(pod("pb", "b"))["n1"] is None


def test_reserve_find_again_returns_same_binding() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    _reserve(env, pod("pa", "a"), "n1")
    # The same pod's claim finds its assumed (pre-bound) PV again.
    state, pi, _ = env.cycle(pod("pa", "a"))
    assert env.plugin.filter(state, pi, env.node_info("n1")) is None
    b = state.read("VolumeBinding").pod_volumes_by_node["n1"].static_bindings[0]
    assert b.pv["metadata"]["name"] == "pv1"


def test_reserve_all_bound_and_provision_annotation() -> None:
    env = Env()
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local"))
    c = pvc("c", volume="pv1", bound=True)
    env.put("persistentvolumeclaims", c)
    env.put("persistentvolumes", pv("pv1", claim=c, phase="Bound"))
    state = _reserve(env, pod("p", "c"), "n1")
    assert state.read("VolumeBinding").all_bound is True
    env.put("persistentvolumeclaims", pvc("d"))
    state = _reserve(env, pod("q", "d"), "n2")
    assert state.read("VolumeBinding").all_bound is False
    binder = env.plugin.binder
    assert binder is not None
    assert binder.pvc_cache.get("default/d")["metadata"]["annotations"][ANN_SELECTED_NODE] == "n2"
    assert ANN_SELECTED_NODE not in env.get("persistentvolumeclaims", "default/d")["metadata"]["annotations"]


def test_reserve_out_of_sync_restores_everything() -> None:
    env = Env()
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumeclaims", pvc("b", size="5Gi"))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    state, pi, _ = env.cycle(pod("p", "a", "b"))
    assert env.plugin.filter(state, pi, env.node_info("n1")) is None
    # The informer moves on for claim b between Filter and Reserve.
    env.put("persistentvolumeclaims", pvc("b", size="5Gi", note="x"))
    st = env.plugin.reserve(state, pi, "n1")
    assert st is not None and st.code == Code.ERROR and "out of sync" in st.message()
    binder = env.plugin.binder
    assert binder is not None
    assert "claimRef" not in binder.pv_cache.get("pv1")["spec"]  # pv1's assumption was rolled back
    assert len(binder.pv_cache) == 0 and len(binder.pvc_cache) == 0


# --------------------------------------------------------------------------- PreBind


async def test_prebind_static_waits_for_pv_controller() -> None:
    env = Env()
    env.put("pods", pod("pa", "a"))
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    state = _reserve(env, pod("pa", "a"), "n1")
    task = asyncio.create_task(env.plugin.pre_bind(state, PodInfo(pod("pa", "a")), "n1"))
    binder = env.plugin.binder
    await eventually(lambda: binder.is_waiting(pod("pa", "a")), what="PreBind waiting")
    assert not task.done()
    assert [(r, o["metadata"]["name"]) for r, o in env.client.updates] == [("persistentvolumes", "pv1")]
    written = env.client.updates[0][1]
    assert written["spec"]["claimRef"]["uid"] == "uid-a"
    # The PV controller: PV bound, then the claim fully bound.
    done_pv = copy.deepcopy(written)
    done_pv["status"]["phase"] = "Bound"
    env.put("persistentvolumes", done_pv)
    assert not binder.is_waiting(pod("pa", "a"))  # the PV's event woke it
    await eventually(lambda: binder.is_waiting(pod("pa", "a")), what="PreBind re-checked and waiting")
    assert not task.done()
    env.put("persistentvolumeclaims", pvc("a", volume="pv1", bound=True))
    assert await asyncio.wait_for(task, 1) is None
    assert len(env.plugin.binder.pv_cache) == 0  # assumption expired by the informer update


async def test_prebind_wakes_only_for_its_own_volumes() -> None:
    """A waiting PreBind re-checks when one of its own PVs or PVCs changes, not
    on every PV/PVC event (many waiting pods would make that quadratic)."""
    env = Env()
    env.put("storageclasses", sc("local"))
    for name in ("a", "b"):
        env.put("pods", pod(f"p{name}", name))
        env.put("persistentvolumeclaims", pvc(name))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    env.put("persistentvolumes", pv("pv2", on="n1"))
    binder = env.plugin.binder
    checks: list[str] = []
    real_check = binder.check_bindings

    def counting(p, node_name, pod_volumes):
        checks.append(p["metadata"]["name"])
        return real_check(p, node_name, pod_volumes)

    binder.check_bindings = counting
    state_a = _reserve(env, pod("pa", "a"), "n1")
    task_a = asyncio.create_task(env.plugin.pre_bind(state_a, PodInfo(pod("pa", "a")), "n1"))
    await eventually(lambda: binder.is_waiting(pod("pa", "a")), what="PreBind waiting")
    assert checks == ["pa"]
    # Changes of other objects: claim b, the other PV, an unrelated claim.
    env.put("persistentvolumeclaims", pvc("b", note="x"))
    env.put("persistentvolumeclaims", pvc("c"))
    other = [o for r, o in env.client.updates if o["metadata"]["name"] == "pv1"]
    env.put("persistentvolumes", pv("pv3", on="n2"))
    # Informer handlers run synchronously: a wake would have resolved its future by now.
    assert binder.is_waiting(pod("pa", "a"))
    assert checks == ["pa"] and not task_a.done() and other
    # Its own PV moves on: one re-check; then its claim completes.
    done_pv = copy.deepcopy(other[0])
    done_pv["status"]["phase"] = "Bound"
    env.put("persistentvolumes", done_pv)
    assert not binder.is_waiting(pod("pa", "a"))
    await eventually(lambda: binder.is_waiting(pod("pa", "a")), what="PreBind re-checked and waiting")
    assert checks == ["pa", "pa"]
    env.put("persistentvolumeclaims", pvc("a", volume="pv1", bound=True))
    assert await asyncio.wait_for(task_a, 1) is None
    assert checks == ["pa", "pa", "pa"]
    assert binder._waiters == {}


async def test_prebind_wakes_for_the_provisioned_pv_its_node_and_its_pod() -> None:
    """Everything the binding check reads wakes a waiting PreBind at once, long
    before the poll interval: the PV provisioned for its claim (which the
    informer may deliver after the claim naming it), its node, its pod."""
    env = Env()
    assert env.plugin.binder.poll_interval >= 5
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local"))
    for name in ("c", "d", "e"):
        env.put("pods", pod(f"p{name}", name))
        env.put("persistentvolumeclaims", pvc(name))
    tasks = {}
    for name, node_name in (("c", "n1"), ("d", "n2"), ("e", "n1")):
        state = _reserve(env, pod(f"p{name}", name), node_name)
        tasks[name] = asyncio.create_task(env.plugin.pre_bind(state, PodInfo(pod(f"p{name}", name)), node_name))
    binder = env.plugin.binder
    await eventually(lambda: all(binder.is_waiting(pod(f"p{n}", n)) for n in tasks), what="every PreBind waiting")
    assert not any(t.done() for t in tasks.values())
    # The claim names its new PV before the PV informer has it: not done yet.
    claim_c = pvc("c", volume="pv-c", bound=True, **{ANN_SELECTED_NODE: "n1"})
    env.put("persistentvolumeclaims", claim_c)
    assert not binder.is_waiting(pod("pc", "c"))  # the claim's event woke it
    await eventually(lambda: binder.is_waiting(pod("pc", "c")), what="PreBind re-checked and waiting")
    assert not tasks["c"].done()
    # The PV arrives, bound to the claim: its event wakes the claim's PreBind.
    env.put("persistentvolumes", pv("pv-c", on="n1", claim=claim_c, phase="Bound"))
    assert await asyncio.wait_for(tasks["c"], 1) is None
    # Node n2 goes away: d's PreBind fails now, not at the next poll.
    env.inf("nodes").remove(env.get("nodes", "n2"))
    st = await asyncio.wait_for(tasks["d"], 1)
    assert st is not None and "failed to get node" in st.message()
    # Pod pe is deleted: its PreBind stops.
    env.inf("pods").remove(env.get("pods", "default/pe"))
    st = await asyncio.wait_for(tasks["e"], 1)
    assert st is not None and "pod does not exist" in st.message()
    assert env.plugin.binder._waiters == {}


async def test_prebind_provisioning_and_rescheduling_request() -> None:
    env = Env()
    env.put("pods", pod("p", "c"))
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local"))
    env.put("persistentvolumeclaims", pvc("c"))
    state = _reserve(env, pod("p", "c"), "n1")
    task = asyncio.create_task(env.plugin.pre_bind(state, PodInfo(pod("p", "c")), "n1"))
    await eventually(lambda: env.plugin.binder.is_waiting(pod("p", "c")), what="PreBind waiting")
    assert env.client.updates[0][0] == "persistentvolumeclaims"
    assert env.client.updates[0][1]["metadata"]["annotations"][ANN_SELECTED_NODE] == "n1"
    # The provisioner gives up on n1 and asks for another node.
    env.put("persistentvolumeclaims", pvc("c", **{ANN_SELECTED_NODE: "n2"}))
    st = await asyncio.wait_for(task, 1)
    assert st is not None and st.code == Code.ERROR
    assert st.message() == 'binding volumes: provisioning failed for PVC "default/c"'


async def test_prebind_provisioned_claim_bound() -> None:
    env = Env()
    env.put("pods", pod("p", "c"))
    env.put("storageclasses", sc("local", provisioner="kubeplane.io/local"))
    env.put("persistentvolumeclaims", pvc("c"))
    state = _reserve(env, pod("p", "c"), "n1")
    task = asyncio.create_task(env.plugin.pre_bind(state, PodInfo(pod("p", "c")), "n1"))
    await eventually(lambda: env.plugin.binder.is_waiting(pod("p", "c")), what="PreBind waiting")
    assert not task.done()
    env.put("persistentvolumes", pv("pvc-1", on="n1", claim=env.get("persistentvolumeclaims", "default/c"),
                                    phase="Bound"))
    env.put("persistentvolumeclaims", pvc("c", volume="pvc-1", bound=True, **{ANN_SELECTED_NODE: "n1"}))
    assert await asyncio.wait_for(task, 1) is None


async def test_prebind_conflict_fails_cleanly() -> None:
    env = Env()
    env.put("pods", pod("p", "a", "b"))
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumeclaims", pvc("b", size="2Gi"))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    env.put("persistentvolumes", pv("pv2", size="2Gi", on="n1"))
    env.client.conflict_on.add("pv2")
    state = _reserve(env, pod("p", "a", "b"), "n1")
    st = await env.plugin.pre_bind(state, PodInfo(pod("p", "a", "b")), "n1")
    assert st is not None and st.code == Code.ERROR and "the object has been modified" in st.message()
    binder = env.plugin.binder
    assert binder is not None
    # pv1 was written (the server copy has a new RV, its old assumption stays until
    # the informer catches up); pv2 was never written, so its assumption is gone.
    assert [o["metadata"]["name"] for _, o in env.client.updates] == ["pv1"]
    assert "claimRef" not in binder.pv_cache.get("pv2")["spec"]
    env.plugin.unreserve(state, PodInfo(pod("p", "a", "b")), "n1")  # idempotent, harmless
    assert "claimRef" not in binder.pv_cache.get("pv2")["spec"]


async def test_prebind_times_out_and_claimref_reset_fails() -> None:
    env = Env({"bindTimeoutSeconds": 0.05})
    env.put("pods", pod("p", "a"))
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    state = _reserve(env, pod("p", "a"), "n1")
    st = await env.plugin.pre_bind(state, PodInfo(pod("p", "a")), "n1")
    assert st is not None and st.code == Code.ERROR and "timed out" in st.message()
    # The informer shows the PV unbound again (PV controller reset claimRef).
    env2 = Env()
    env2.put("pods", pod("p", "a"))
    env2.put("storageclasses", sc("local"))
    env2.put("persistentvolumeclaims", pvc("a"))
    env2.put("persistentvolumes", pv("pv1", on="n1"))
    state = _reserve(env2, pod("p", "a"), "n1")
    task = asyncio.create_task(env2.plugin.pre_bind(state, PodInfo(pod("p", "a")), "n1"))
    await eventually(lambda: env2.plugin.binder.is_waiting(pod("p", "a")), what="PreBind waiting")
    assert not task.done()
    env2.put("persistentvolumes", pv("pv1", on="n1"))
    st = await asyncio.wait_for(task, 1)
    assert st is not None and 'ClaimRef got reset for pv "pv1"' in st.message()


async def test_prebind_fails_when_pod_is_gone() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumes", pv("pv1", on="n1"))
    state = _reserve(env, pod("p", "a"), "n1")
    st = await env.plugin.pre_bind(state, PodInfo(pod("p", "a")), "n1")
    assert st is not None and "pod does not exist any more" in st.message()


# --------------------------------------------------------------------------- scoring


def test_broken_linear_function() -> None:
    fn = build_broken_linear_function([(0, 100), (100, 0)])
    assert [fn(x) for x in (-5, 0, 10, 55, 100, 120)] == [100, 100, 90, 45, 0, 0]
    up = build_broken_linear_function([(20, 0), (60, 80)])
    assert [up(0), up(40), up(70)] == [0, 40, 80]


def test_score_only_when_shape_configured() -> None:
    for args, expected in ((None, None), ({"shape": []}, {"n1": 90, "n2": 50})):
        env = Env(args)
        env.put("storageclasses", sc("local"))
        env.put("persistentvolumeclaims", pvc("c", size="1Gi"))
        env.put("persistentvolumes", pv("big", size="10Gi", on="n1"))
        env.put("persistentvolumes", pv("tight", size="2Gi", on="n2"))
        state, pi, _ = env.cycle(pod("p", "c"))
        nis = [env.node_info("n1"), env.node_info("n2")]
        for ni in nis:
            assert env.plugin.filter(state, pi, ni) is None
        st = env.plugin.pre_score(state, pi, nis)
        if expected is None:
            assert st is not None and st.code == Code.SKIP
            continue
        assert st is None
        assert {ni.name: env.plugin.score(state, pi, ni)[0] for ni in nis} == expected


# --------------------------------------------------------------------------- hints


def test_queueing_hints() -> None:
    pl = Env().plugin
    p = pod("p", "c")
    topo = [{"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}]
    assert pl.is_schedulable_after_storage_class_change(p, None, sc("x")) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_storage_class_change(p, sc("x"), sc("x", reclaimPolicy="Retain")) == QueueingHint.SKIP
    assert pl.is_schedulable_after_storage_class_change(p, sc("x"), sc("x", allowedTopologies=topo)) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pvc_change(p, None, pvc("c")) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pvc_change(p, None, pvc("other")) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pvc_change(p, None, pvc("c", ns="elsewhere")) == QueueingHint.SKIP
    eph = pod("q", ephemeral="data")
    assert pl.is_schedulable_after_pvc_change(eph, None, pvc("q-data")) == QueueingHint.QUEUE
    cap = {"metadata": {"name": "k"}, "capacity": "1Gi"}
    assert pl.is_schedulable_after_capacity_change(p, None, cap) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_capacity_change(p, cap, dict(cap, capacity="2Gi")) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_capacity_change(p, cap, dict(cap, capacity="512Mi")) == QueueingHint.SKIP
    assert pl.is_schedulable_after_capacity_change(
        p, cap, dict(cap, capacity="2Gi", maximumVolumeSize="1Gi")) == QueueingHint.SKIP
    n1 = {"metadata": {"name": "n1", "annotations": {}}}
    n1m = {"metadata": {"name": "n1", "annotations": {"storage.alpha.kubernetes.io/migrated-plugins": "x"}}}
    assert pl.is_schedulable_after_csi_node_change(p, None, n1) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_csi_node_change(p, n1, n1) == QueueingHint.SKIP
    assert pl.is_schedulable_after_csi_node_change(p, n1, n1m) == QueueingHint.QUEUE
    regs = {e.event.resource.value: e for e in pl.events_to_register()}
    assert regs["PersistentVolume"].hint is not None  # PVs that could serve one of the pod's claims
    names = set(regs)
    assert names == {"storage.k8s.io/StorageClass", "PersistentVolumeClaim", "PersistentVolume", "Node",
                     "storage.k8s.io/CSINode", "storage.k8s.io/CSIDriver", "storage.k8s.io/CSIStorageCapacity"}


# --------------------------------------------------------------------------- the requeue race


class EventDispatchingPVCache:
    """The old design in the PV cache's place: its own copy, fed by its own informer handler."""

    def __init__(self, informer: FakeInformer) -> None:
        self.inner = AssumeCache(informer, description="v1.PersistentVolume",  # type: ignore[arg-type]
                                 indexers={PV_STORAGE_CLASS_INDEX: pv_storage_class_index})

    def get(self, key: str) -> dict:
        return self.inner.get(key)

    def get_api_obj(self, key: str) -> dict:
        return self.inner.get_api_obj(key)

    def list_pvs(self, cls: str) -> list[dict]:
        return self.inner.list(PV_STORAGE_CLASS_INDEX, cls)

    def assume(self, obj: dict) -> None:
        self.inner.assume(obj)

    def restore(self, obj: dict) -> None:
        self.inner.restore(obj["metadata"]["name"])


def _race(seed: int, old_design: bool) -> tuple[bool, bool]:
    """A pod rejected for lack of a PV is requeued by the PV's add event and
    scheduled at once. Returns (queue handler ran before the cache's, attempt succeeded)."""
    env = Env()
    pv_inf = env.inf("persistentvolumes")
    binder = env.plugin.binder
    assert binder is not None
    cache_idx = 0  # the passive cache registered the PV informer's first handler
    if old_design:
        binder.pv_cache = EventDispatchingPVCache(pv_inf)
        cache_idx = len(pv_inf.handlers) - 1
    cache_handlers = list(range(len(pv_inf.handlers)))
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("c"))
    p = pod("p", "c")
    assert reasons(env.feasible(p)["n1"]) == [REASON_BIND_CONFLICT]  # rejected: no PV yet
    outcome: list[bool] = []

    def queue_on_add(obj: dict) -> None:
        # The scheduling queue moves the pod to activeQ and it is popped right away.
        outcome.append(env.feasible(p)["n1"] is None)

    queue_idx = pv_inf.add_event_handler(on_add=queue_on_add)
    order = cache_handlers + [queue_idx]
    random.Random(seed).shuffle(order)
    new_pv = env.put("persistentvolumes", pv("pv1", on="n1"), notify=False)  # indexer first, as informers do
    for i in order:
        pv_inf.deliver(i, None, new_pv)
    queue_first = order.index(queue_idx) < order.index(cache_idx)
    return queue_first, outcome[0]


@pytest.mark.parametrize("seed", range(16))
def test_requeued_pod_sees_the_pv_of_its_event_whatever_the_handler_order(seed: int) -> None:
    queue_first, ok = _race(seed, old_design=False)
    assert ok, f"passive cache read a stale PV (queue handler first: {queue_first})"


def test_event_dispatching_cache_shows_the_stale_read() -> None:
    results = [_race(seed, old_design=True) for seed in range(16)]
    assert any(q for q, _ in results) and any(not q for q, _ in results)  # both orders exercised
    for queue_first, ok in results:
        # Exactly when the queue's handler runs before the cache's, the pod is rejected again.
        assert ok is not queue_first


def test_pv_hint_queues_only_pvs_that_can_serve_a_claim():
    from kubeplane.scheduler.framework.types import QueueingHint
    from kubeplane.scheduler.plugins.volumebinding.volume_binding import pv_change_hint

    claim = {"metadata": {"name": "c", "namespace": "ns"},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                      "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem",
                      "selector": {"matchLabels": {"for": "p"}}}}
    claims = {("ns", "c"): claim}

    def lookup(ns, name):
        return claims.get((ns, name))

    def pv(phase="Available", labels=None, size="2Gi", cls="local", ref=None):
        spec = {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": cls,
                "volumeMode": "Filesystem"}
        if ref:
            spec["claimRef"] = ref
        return {"metadata": {"name": "pv", "labels": labels or {"for": "p"}}, "spec": spec,
                "status": {"phase": phase}}

    pod = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}}
    assert pv_change_hint(pod, pv(), lookup) == QueueingHint.QUEUE
    assert pv_change_hint(pod, pv(phase="Pending"), lookup) == QueueingHint.SKIP  # not matchable yet
    assert pv_change_hint(pod, pv(labels={"for": "other"}), lookup) == QueueingHint.SKIP  # selector
    assert pv_change_hint(pod, pv(size="512Mi"), lookup) == QueueingHint.SKIP  # too small
    assert pv_change_hint(pod, pv(cls="fast"), lookup) == QueueingHint.SKIP  # other class
    assert pv_change_hint(pod, pv(phase="Pending", ref={"name": "c", "namespace": "ns"}), lookup) == \
        QueueingHint.QUEUE  # pre-bound to this pod's claim
    assert pv_change_hint({"metadata": {"name": "q", "namespace": "ns"}, "spec": {}}, pv(), lookup) == \
        QueueingHint.SKIP  # no claims at all
    claims.clear()
    assert pv_change_hint(pod, pv(), lookup) == QueueingHint.QUEUE  # unknown claim: let the cycle decide


# --------------------------------------------------------------------------- per-claim volume index


@pytest.mark.parametrize("seed", range(40))
def test_claim_volume_index_matches_linear_search(seed: int) -> None:
    from kubeplane.volume.matching import VolumeFactsCache, find_matching_volume, index_volumes_for_claim

    rng = random.Random(seed)
    claims = [pvc(f"c{i}", size=rng.choice(["1Gi", "2Gi", "600Mi"])) for i in range(3)]
    claims[1]["spec"]["accessModes"] = ["ReadOnlyMany"]
    claims[2]["spec"]["selector"] = {"matchLabels": {"tier": "gold"}}
    vols = [random_volume(rng, i, claims) for i in range(rng.randrange(1, 40))]
    nodes = [node("n1", zone="a"), node("n2", zone="b"), node("n3", zone="a"),
             {"metadata": {"name": "bare", "labels": {"zone": "b"}}}]
    facts = VolumeFactsCache()
    for claim in claims:
        index = index_volumes_for_claim(claim, vols, facts)
        again = index_volumes_for_claim(claim, vols, facts)  # served from the facts cache
        for n in nodes:
            for excluded in (set(), {f"pv{rng.randrange(len(vols))}"}, {v["metadata"]["name"] for v in vols[:3]}):
                want = find_matching_volume(claim, vols, n, excluded, True)
                assert index.find(n, excluded) is want
                assert again.find(n, excluded) is want


def test_facts_cache_sees_replaced_volume_and_stays_bounded() -> None:
    from kubeplane.volume.matching import VolumeFactsCache, index_volumes_for_claim

    claim = pvc("c")
    v1 = pv("v", size="500Mi")
    v1["metadata"]["resourceVersion"] = "1"
    facts = VolumeFactsCache()
    assert index_volumes_for_claim(claim, [v1], facts).find(node("n1")) is None
    v2 = copy.deepcopy(v1)
    v2["spec"]["capacity"]["storage"] = "1Gi"
    v2["metadata"]["resourceVersion"] = "2"
    assert index_volumes_for_claim(claim, [v2], facts).find(node("n1")) is v2
    for i in range(10):
        facts.get(pv(f"x{i}"))
    assert len(facts) == 11
    facts.prune(5)
    assert len(facts) == 0


def test_filter_shared_and_pinned_volumes_on_many_nodes() -> None:
    env = Env()
    for n in ("n3", "n4"):
        env.put("nodes", node(n))
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumeclaims", pvc("b", size="2Gi"))
    env.put("persistentvolumes", pv("any-3g", size="3Gi"))
    env.put("persistentvolumes", pv("any-2g", size="2Gi"))
    env.put("persistentvolumes", pv("n2-1g", size="1Gi", on="n2"))
    env.put("persistentvolumes", pv("n3-2g", size="2Gi", on="n3"))
    state, pi, (_, st) = env.cycle(pod("p", "a", "b"))
    assert st is None
    for n in ("n1", "n2", "n3", "n4", "n1"):
        assert env.plugin.filter(state, pi, env.node_info(n)) is None
    by_node = state.read("VolumeBinding").pod_volumes_by_node

    def chosen(n: str) -> list[str]:
        return [b.pv["metadata"]["name"] for b in by_node[n].static_bindings]

    # smallest claim first, each volume used once, pinned volumes only on their node
    assert chosen("n1") == chosen("n4") == ["any-2g", "any-3g"]
    assert chosen("n2") == ["n2-1g", "any-2g"]
    assert chosen("n3") == ["any-2g", "n3-2g"]
    assert by_node["n1"].static_bindings is not by_node["n4"].static_bindings
    # only two unpinned volumes: a third claim fits on n2/n3 only
    env.put("persistentvolumeclaims", pvc("c", size="1Gi"))
    res_state, pi, (_, st) = env.cycle(pod("q", "a", "b", "c"))
    assert st is None
    got = {n: env.plugin.filter(res_state, pi, env.node_info(n)) for n in ("n1", "n2", "n3", "n4")}
    assert reasons(got["n1"]) == [REASON_BIND_CONFLICT] and reasons(got["n4"]) == [REASON_BIND_CONFLICT]
    assert got["n2"] is None and got["n3"] is None


def test_filter_assumed_volume_is_excluded_from_the_shared_match() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumeclaims", pvc("b"))
    env.put("persistentvolumes", pv("v1"))
    env.put("persistentvolumes", pv("v2", size="2Gi"))
    state = _reserve(env, pod("p1", "a"), "n1")
    assert state.read("VolumeBinding").pod_volumes_by_node["n1"].static_bindings[0].pv["metadata"]["name"] == "v1"
    state2, pi, (_, st) = env.cycle(pod("p2", "b"))
    assert st is None
    assert env.plugin.filter(state2, pi, env.node_info("n2")) is None
    assert env.plugin.filter(state2, pi, env.node_info("n1")) is None
    for n in ("n1", "n2"):
        names = [b.pv["metadata"]["name"] for b in state2.read("VolumeBinding").pod_volumes_by_node[n].static_bindings]
        assert names == ["v2"]
