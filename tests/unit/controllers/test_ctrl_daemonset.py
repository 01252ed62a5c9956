"""DaemonSet controller against a real registry (MemoryStore + InProcessClient + informers).

No scheduler runs here: a test binds a daemon pod to the node its affinity
names and marks it ready, as the scheduler and the kubelet would. Time
(minReadySeconds, the failed-pod backoff) is the controller's injected clock.
"""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.daemonset import (
    DAEMON_TOLERATIONS,
    DaemonSetsController,
    node_should_run_daemon_pod,
    replace_node_name_affinity,
    target_node_name,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
NODES = resource("nodes")
DS = resource("daemonsets")
REVS = resource("controllerrevisions")
EVENTS = resource("events")
NS = "default"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def make_ds(name: str = "agent", *, image: str = "agent:1", strategy: dict | None = None, **spec_extra) -> dict:
    labels = {"app": name}
    tspec: dict = {"containers": [{"name": "c", "image": image}]}
    for k in ("nodeSelector", "tolerations", "hostNetwork", "affinity"):
        if k in spec_extra:
            tspec[k] = spec_extra.pop(k)
    spec: dict = {"selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": tspec}, **spec_extra}
    if strategy is not None:
        spec["updateStrategy"] = strategy
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name}, "spec": spec}


def make_node(name: str, labels: dict | None = None, taints: list | None = None) -> dict:
    node: dict = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                  "spec": {}}
    if taints:
        node["spec"]["taints"] = taints
    return node


class Env:
    def __init__(self, client: InProcessClient, ctrl: DaemonSetsController, clock: Clock) -> None:
        self.client = client
        self.ctrl = ctrl
        self.clock = clock

    async def pods(self, *, active: bool = True) -> list[dict]:
        items = (await self.client.list(PODS, NS))["items"]
        if active:
            items = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return items

    async def by_node(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for p in await self.pods():
            out.setdefault(target_node_name(p) or "", []).append(p)
        return out

    async def ds(self, name: str = "agent") -> dict:
        return await self.client.get(DS, name, NS)

    async def revisions(self) -> list[dict]:
        return sorted((await self.client.list(REVS, NS))["items"], key=lambda r: r["revision"])

    async def events(self, reason: str) -> list[dict]:
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]

    async def run(self, pod: dict, *, ready: bool = True, since: dt.datetime | None = None) -> None:
        """Bind the pod to its node and report it running (and ready)."""
        name = pod["metadata"]["name"]
        if not pod["spec"].get("nodeName"):
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": target_node_name(pod)}}
            await self.client.create(PODS, binding, NS, subresource="binding", name=name)
        status: dict = {"phase": "Running"}
        if ready:
            status["conditions"] = [{"type": "Ready", "status": "True",
                                     "lastTransitionTime": format_time(since or self.clock())}]
        await self.client.patch(PODS, name, {"status": status}, NS, subresource="status")

    async def run_all(self) -> None:
        for p in await self.pods():
            if not p["spec"].get("nodeName"):
                await self.run(p)

    async def finish_terminating(self) -> None:
        """The kubelet's part of a graceful deletion: remove terminating pods."""
        for p in await self.pods(active=False):
            if p["metadata"].get("deletionTimestamp"):
                try:
                    await self.client.delete(PODS, p["metadata"]["name"], NS, grace_period_seconds=0)
                except StatusError as err:
                    if err.code != 404:
                        raise

    async def settle(self) -> None:
        c = self.ctrl
        await settled(c, self.client, (c.node_informer, NODES), delayed=True)
        await settled(c, self.client, (c.pod_informer, PODS), (c.ds_informer, DS), (c.history_informer, REVS),
                      namespace=NS, delayed=True)


@pytest.fixture
async def env():
    store = MemoryStore(history=5000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    clock = Clock()
    ctrl = DaemonSetsController(client, clock=clock)
    await ctrl.start(sync_timeout=1)
    yield Env(client, ctrl, clock)
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def _n_events(env: Env, reason: str, n: int) -> list[dict] | None:
    events = await env.events(reason)
    return events if len(events) == n else None


async def _n_pods(env: Env, n: int, exclude: str = "") -> list[dict] | bool:
    """The active pods when there are ``n`` of them (``True`` for none)."""
    pods = await env.pods()
    if exclude and exclude in {p["metadata"]["name"] for p in pods}:
        return False
    if len(pods) != n:
        return False
    return pods or True


async def _status(env: Env, **want) -> dict | None:
    ds = await env.ds()
    st = ds.get("status") or {}
    if all(st.get(k, 0) == v for k, v in want.items()):
        return ds
    return None


# ----------------------------------------------------------------- placement


async def test_one_pod_per_eligible_node_placed_through_affinity(env: Env) -> None:
    await env.client.create(NODES, make_node("n1"), None)
    await env.client.create(NODES, make_node("n2"), None)
    await env.client.create(NODES, make_node("n3", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
                            None)
    ds = await env.client.create(DS, make_ds(), NS)
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "1"
    pods = await eventually(lambda: _n_pods(env, 2))
    by_node = await env.by_node()
    assert sorted(by_node) == ["n1", "n2"]
    revs = await eventually(lambda: env.revisions())
    assert len(revs) == 1 and revs[0]["revision"] == 1
    hash_ = revs[0]["metadata"]["labels"]["controller-revision-hash"]
    assert revs[0]["metadata"]["name"] == f"agent-{hash_}"
    assert revs[0]["data"]["spec"]["template"]["$patch"] == "replace"
    assert revs[0]["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    for p in pods:
        md = p["metadata"]
        assert md["generateName"] == "agent-"
        assert md["labels"] == {"app": "agent", "controller-revision-hash": hash_, "pod-template-generation": "1"}
        assert md["ownerReferences"][0] == {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                            "uid": ds["metadata"]["uid"], "controller": True,
                                            "blockOwnerDeletion": True}
        assert not p["spec"].get("nodeName")  # the scheduler binds it
        terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                           "values": [target_node_name(p)]}]}]
        for t in DAEMON_TOLERATIONS:
            assert t in p["spec"]["tolerations"]
    got = await eventually(lambda: _status(env, desiredNumberScheduled=2, currentNumberScheduled=2,
                                           numberMisscheduled=0, numberReady=0, updatedNumberScheduled=2,
                                           numberUnavailable=2))
    assert got["status"]["observedGeneration"] == got["metadata"]["generation"]
    created = await eventually(lambda: _n_events(env, "SuccessfulCreate", 2))
    assert all(e["message"].startswith("Created pod: agent-") for e in created)
    await env.run_all()
    await eventually(lambda: _status(env, numberReady=2, numberAvailable=2, numberUnavailable=0))
    await env.settle()
    assert len(await env.pods()) == 2


async def test_new_node_gets_a_pod_and_relabelled_node_loses_it(env: Env) -> None:
    await env.client.create(NODES, make_node("n1", {"role": "edge"}), None)
    await env.client.create(NODES, make_node("n2"), None)
    await env.client.create(DS, make_ds(nodeSelector={"role": "edge"}), NS)
    await eventually(lambda: _n_pods(env, 1))
    assert list(await env.by_node()) == ["n1"]
    await env.client.create(NODES, make_node("n3", {"role": "edge"}), None)
    await eventually(lambda: _n_pods(env, 2))
    assert sorted(await env.by_node()) == ["n1", "n3"]
    await env.run_all()
    await eventually(lambda: _status(env, desiredNumberScheduled=2, numberReady=2))
    # n1 stops matching: its pod goes
    await env.client.patch(NODES, "n1", {"metadata": {"labels": {"role": "core"}}})
    await eventually(lambda: _n_pods(env, 1))
    assert list(await env.by_node()) == ["n3"]
    deleted = await eventually(lambda: env.events("SuccessfulDelete"))
    assert deleted[0]["message"].startswith("Deleted pod: agent-")
    await env.finish_terminating()
    await eventually(lambda: _status(env, desiredNumberScheduled=1, currentNumberScheduled=1, numberMisscheduled=0))


async def test_taints_noschedule_keeps_running_pod_noexecute_evicts(env: Env) -> None:
    await env.client.create(NODES, make_node("n1"), None)
    await env.client.create(DS, make_ds(), NS)
    await eventually(lambda: _n_pods(env, 1))
    await env.run_all()
    await eventually(lambda: _status(env, desiredNumberScheduled=1, numberReady=1))
    await env.client.patch(NODES, "n1", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
    # should not run any more, but continues: not deleted, and counted as
    # misscheduled when the DaemonSet is next synced (a node update that changes
    # nothing for a running pod does not sync it, as upstream)
    await env.settle()
    env.ctrl.enqueue(await env.ds())
    await eventually(lambda: _status(env, desiredNumberScheduled=0, numberMisscheduled=1))
    assert len(await env.pods()) == 1
    await env.client.patch(NODES, "n1", {"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}})
    await eventually(lambda: _n_pods(env, 0))
    # the taints every daemon pod tolerates do not keep it off a node
    await env.client.patch(NODES, "n1", {"spec": {"taints": [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}})
    await env.finish_terminating()
    await eventually(lambda: _n_pods(env, 1))


def test_node_should_run_daemon_pod_rules() -> None:
    ds = make_ds(nodeSelector={"disk": "ssd"})
    ssd = make_node("a", {"disk": "ssd"})
    assert node_should_run_daemon_pod(ssd, ds) == (True, True)
    assert node_should_run_daemon_pod(make_node("b"), ds) == (False, False)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}
    ds2 = make_ds(affinity=affinity)
    assert node_should_run_daemon_pod(make_node("c", {"zone": "z1"}), ds2) == (True, True)
    assert node_should_run_daemon_pod(make_node("d", {"zone": "z2"}), ds2) == (False, False)
    net = make_node("e", taints=[{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}])
    assert node_should_run_daemon_pod(net, make_ds()) == (False, True)
    assert node_should_run_daemon_pod(net, make_ds(hostNetwork=True)) == (True, True)
    tolerated = make_ds(tolerations=[{"key": "gpu", "operator": "Exists"}])
    gpu = make_node("f", taints=[{"key": "gpu", "value": "x", "effect": "NoExecute"}])
    assert node_should_run_daemon_pod(gpu, tolerated) == (True, True)
    assert node_should_run_daemon_pod(gpu, make_ds()) == (False, False)
    pinned = make_ds()
    pinned["spec"]["template"]["spec"]["nodeName"] = "a"
    assert node_should_run_daemon_pod(make_node("b"), pinned) == (False, False)
    # the template's own terms are replaced by the node's name
    replaced = replace_node_name_affinity(affinity, "c")
    assert replaced["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}]


# ------------------------------------------------------------------ updates


async def _three_running(env: Env, **ds_kw) -> None:
    for n in ("n1", "n2", "n3"):
        await env.client.create(NODES, make_node(n), None)
    await env.client.create(DS, make_ds(**ds_kw), NS)
    await eventually(lambda: _n_pods(env, 3))
    await env.run_all()
    await eventually(lambda: _status(env, numberAvailable=3))


async def _image_counts(env: Env) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in await env.pods():
        img = p["spec"]["containers"][0]["image"]
        out[img] = out.get(img, 0) + 1
    return out


async def test_rolling_update_replaces_one_node_at_a_time(env: Env) -> None:
    await _three_running(env)
    await env.client.patch(DS, "agent", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "agent:2"}]}}}}, NS)
    ds = await env.ds()
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "2"
    for step in range(3):
        # maxUnavailable 1: exactly one old pod goes at a time
        await eventually(lambda: _n_pods(env, 2))
        await env.settle()
        assert len(await env.pods()) == 2
        await env.finish_terminating()
        await eventually(lambda: _n_pods(env, 3))
        await env.run_all()
        counts = await eventually(lambda: _image_counts(env))
        assert counts.get("agent:2", 0) == step + 1
    got = await eventually(lambda: _status(env, updatedNumberScheduled=3, numberAvailable=3))
    assert got["status"]["observedGeneration"] == 2
    revs = await env.revisions()
    assert [r["revision"] for r in revs] == [1, 2]
    new_hash = revs[1]["metadata"]["labels"]["controller-revision-hash"]
    assert all(p["metadata"]["labels"]["controller-revision-hash"] == new_hash
               and p["metadata"]["labels"]["pod-template-generation"] == "2" for p in await env.pods())


async def test_rolling_update_with_surge_starts_new_pod_first(env: Env) -> None:
    await _three_running(env, strategy={"type": "RollingUpdate",
                                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    await env.client.patch(DS, "agent", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "agent:2"}]}}}}, NS)
    await eventually(lambda: _n_pods(env, 4))
    await env.settle()
    by_node = await env.by_node()
    surged = [n for n, ps in by_node.items() if len(ps) == 2]
    assert len(surged) == 1 and len(await env.pods()) == 4  # no old pod deleted yet
    node = surged[0]
    new_pod = next(p for p in by_node[node] if p["spec"]["containers"][0]["image"] == "agent:2")
    await env.run(new_pod)
    # the new pod is available: the old one on that node goes, the next node surges
    async def old_gone_on_node() -> bool:
        return len((await env.by_node()).get(node, [])) == 1
    await eventually(old_gone_on_node)
    await eventually(lambda: _n_pods(env, 4))
    counts = await _image_counts(env)
    assert counts == {"agent:1": 2, "agent:2": 2}


async def test_on_delete_waits_for_pods_to_be_deleted(env: Env) -> None:
    await _three_running(env, strategy={"type": "OnDelete"})
    await env.client.patch(DS, "agent", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "agent:2"}]}}}}, NS)
    await eventually(lambda: _status(env, observedGeneration=2, updatedNumberScheduled=0))
    await env.settle()
    assert await _image_counts(env) == {"agent:1": 3}
    victim = (await env.pods())[0]["metadata"]["name"]
    await env.client.delete(PODS, victim, NS, grace_period_seconds=0)
    await eventually(lambda: _n_pods(env, 3))
    assert await _image_counts(env) == {"agent:1": 2, "agent:2": 1}
    await env.run_all()
    await eventually(lambda: _status(env, updatedNumberScheduled=1))


async def test_history_limit_and_rollback_reuses_revision(env: Env) -> None:
    await env.client.create(NODES, make_node("n1"), None)
    await env.client.create(DS, make_ds(revisionHistoryLimit=1), NS)
    await eventually(lambda: _n_pods(env, 1))
    first = (await eventually(lambda: env.revisions()))[0]
    for image in ("agent:2", "agent:3"):
        await env.client.patch(DS, "agent", {"spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": image}]}}}}, NS)
        await env.finish_terminating()

        async def rolled(image: str = image) -> bool:
            await env.finish_terminating()
            return await _image_counts(env) == {image: 1}
        await eventually(rolled)
    await env.settle()
    revs = await env.revisions()
    # revision 1 is past the limit and unused; 2 is kept as the one old revision
    assert [r["revision"] for r in revs] == [2, 3]
    assert first["metadata"]["name"] not in {r["metadata"]["name"] for r in revs}
    # kubectl rollout undo: the old revision's data, as a strategic merge patch
    await env.client.patch(DS, "agent", revs[0]["data"], NS, patch_type="strategic")

    async def undone() -> bool:
        await env.finish_terminating()
        return await _image_counts(env) == {"agent:2": 1}
    await eventually(undone)
    await env.settle()
    revs2 = await env.revisions()
    assert [(r["metadata"]["name"], r["revision"]) for r in revs2] == [
        (revs[1]["metadata"]["name"], 3), (revs[0]["metadata"]["name"], 4)]


async def test_min_ready_seconds_counts_available_by_clock(env: Env) -> None:
    await env.client.create(NODES, make_node("n1"), None)
    await env.client.create(DS, make_ds(minReadySeconds=30), NS)
    await eventually(lambda: _n_pods(env, 1))
    await env.run_all()
    await eventually(lambda: _status(env, numberReady=1, numberAvailable=0, numberUnavailable=1))
    env.clock.advance(31)
    env.ctrl.enqueue(await env.ds())
    await eventually(lambda: _status(env, numberReady=1, numberAvailable=1, numberUnavailable=0))


async def test_failed_pod_is_replaced_with_backoff(env: Env) -> None:
    await env.client.create(NODES, make_node("n1"), None)
    await env.client.create(DS, make_ds(), NS)
    pod = (await eventually(lambda: _n_pods(env, 1)))[0]
    await env.run(pod)
    # the backoff is per (DaemonSet, observed generation, node): let the generation be observed first
    await eventually(lambda: _status(env, observedGeneration=1, numberReady=1))
    await env.settle()

    async def fail(p: dict) -> None:
        await env.client.patch(PODS, p["metadata"]["name"], {"status": {"phase": "Failed"}}, NS,
                               subresource="status")

    await fail(pod)
    events = await eventually(lambda: env.events("FailedDaemonPod"))
    assert events[0]["message"] == (f"Found failed daemon pod default/{pod['metadata']['name']} on node n1, "
                                    "will try to kill it")
    await env.finish_terminating()
    second = await eventually(lambda: _n_pods(env, 1))
    assert second[0]["metadata"]["name"] != pod["metadata"]["name"]
    await env.run(second[0])
    await fail(second[0])
    # within the 1 s backoff (the clock has not moved): the failed pod stays
    await env.settle()
    pods = await env.pods()
    assert [p["metadata"]["name"] for p in pods] == [second[0]["metadata"]["name"]]
    assert pods[0]["status"]["phase"] == "Failed"
    env.clock.advance(2)
    env.ctrl.enqueue(await env.ds())
    # deleted now, and at once replaced (a failed, deleted pod no longer holds the node)
    third = await eventually(lambda: _n_pods(env, 1, exclude=second[0]["metadata"]["name"]))
    assert third[0]["metadata"]["name"] not in (pod["metadata"]["name"], second[0]["metadata"]["name"])
    assert len(await env.events("FailedDaemonPod")) == 2


async def test_adopts_orphans_and_releases_relabelled_pods(env: Env) -> None:
    await env.client.create(NODES, make_node("n1"), None)
    orphan = {"metadata": {"name": "orphan", "labels": {"app": "agent"}},
              "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "agent:1"}]}}
    await env.client.create(PODS, orphan, NS)
    # OnDelete: the adopted pod (of no revision, not ready) is not rolled
    ds = await env.client.create(DS, make_ds(strategy={"type": "OnDelete"}), NS)

    async def adopted() -> bool:
        p = await env.client.get(PODS, "orphan", NS)
        return any(r["uid"] == ds["metadata"]["uid"] for r in p["metadata"].get("ownerReferences") or [])
    await eventually(adopted)
    await env.settle()
    assert [p["metadata"]["name"] for p in await env.pods()] == ["orphan"]
    await env.client.patch(PODS, "orphan", {"metadata": {"labels": {"app": "other"}}}, NS)

    async def released_and_replaced() -> bool:
        p = await env.client.get(PODS, "orphan", NS)
        return not p["metadata"].get("ownerReferences") and len(await env.pods()) == 2
    await eventually(released_and_replaced)


async def test_selecting_all_is_refused_with_an_event(env: Env) -> None:
    # validation refuses an empty selector; one left in storage gets the event
    with pytest.raises(StatusError) as err:
        bad = make_ds()
        bad["spec"]["selector"] = {}
        await env.client.create(DS, bad, NS)
    assert err.value.code == 422
    assert "empty selector is invalid for daemonset" in err.value.message


def test_revision_data_is_written_as_upstream() -> None:
    from kubeplane.controllers.daemonset import revision_patch
    from kubeplane.controllers.history import raw_data

    ds = make_ds()
    data = revision_patch(ds)
    # the typed template through a map: defaults in, keys sorted, creationTimestamp null,
    # resources {}, the replace directive
    assert raw_data(data) == (
        b'{"spec":{"template":{"$patch":"replace","metadata":{"creationTimestamp":null,"labels":{"app":"agent"}},'
        b'"spec":{"containers":[{"image":"agent:1","imagePullPolicy":"IfNotPresent","name":"c","resources":{},'
        b'"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File"}],'
        b'"dnsPolicy":"ClusterFirst","restartPolicy":"Always","schedulerName":"default-scheduler",'
        b'"securityContext":{},"terminationGracePeriodSeconds":30}}}}')
    assert list(data["spec"]["template"]) == ["$patch", "metadata", "spec"]
    assert "$patch" not in ds["spec"]["template"]  # the DaemonSet is not touched


async def test_template_node_name_and_no_history(env: Env) -> None:
    await env.client.create(NODES, make_node("n1"), None)
    await env.client.create(NODES, make_node("n2"), None)
    ds = make_ds(revisionHistoryLimit=0)
    ds["spec"]["template"]["spec"]["nodeName"] = "n2"
    await env.client.create(DS, ds, NS)
    pods = await eventually(lambda: _n_pods(env, 1))
    assert pods[0]["spec"]["nodeName"] == "n2" and target_node_name(pods[0]) == "n2"
    await eventually(lambda: _status(env, desiredNumberScheduled=1, currentNumberScheduled=1))
    await env.run_all()
    await env.client.patch(DS, "agent", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "agent:2"}]}}}}, NS)

    async def rolled() -> bool:
        await env.finish_terminating()
        return await _image_counts(env) == {"agent:2": 1}
    await eventually(rolled)
    await env.settle()
    # revisionHistoryLimit 0: only the current revision is kept
    assert [r["revision"] for r in await env.revisions()] == [2]


async def test_surge_percent_rounds_up(env: Env) -> None:
    await _three_running(env, strategy={"type": "RollingUpdate",
                                        "rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0}})
    await env.client.patch(DS, "agent", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "agent:2"}]}}}}, NS)
    # 10% of 3 nodes rounds up to one surge pod at a time
    await eventually(lambda: _n_pods(env, 4))
    await env.settle()
    assert await _image_counts(env) == {"agent:1": 3, "agent:2": 1}
