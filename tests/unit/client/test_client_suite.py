"""One suite, three transports: the in-process client, the HTTP client and the
local wire client must behave the same against the same registry."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.cluster import namespace_controller
from kubeplane.apiserver.server import HANDLER_KEY, build_app
from kubeplane.client.wireserver import WireServer
from kubeplane.client.http import HttpClient
from kubeplane.client.inprocess import InProcessClient
from kubeplane.client.kubeconfig import ClientConfig
from kubeplane.client.wire import WireClient
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

PODS = resource("pods")
CMS = resource("configmaps")
NODES = resource("nodes")
DEPLOY = resource("deployments")
NS = resource("namespaces")


def pod(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}


@pytest.fixture(params=["inprocess", "http", "wire"])
async def client(request):
    store = MemoryStore(history=50)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    # the API server's process runs the namespace controller (as `kubeplane apiserver` does)
    ns_controller = namespace_controller(registry)
    await ns_controller.start()
    if request.param == "inprocess":
        c = InProcessClient(registry)
        yield c
        await c.close()
    elif request.param == "wire":
        with tempfile.TemporaryDirectory() as tmp:
            server = WireServer(registry, os.path.join(tmp, "api.sock"))
            await server.start()
            c = WireClient(server.path)
            yield c
            await c.close()
            await server.stop()
    else:
        app = build_app(registry, CATALOGUE)
        app[HANDLER_KEY].watch_bookmark_interval = 0.2
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        c = HttpClient(ClientConfig(server=str(server.make_url("")).rstrip("/")))
        yield c
        await c.close()
        await server.close()
    await ns_controller.stop()
    await registry.close()
    await store.close()


async def test_create_get_defaults(client):
    created = await client.create(PODS, pod("a", app="x"), "default")
    md = created["metadata"]
    assert md["uid"] and md["resourceVersion"] and md["creationTimestamp"].endswith("Z")
    assert md["namespace"] == "default" and md["generation"] == 1
    spec = created["spec"]
    assert spec["restartPolicy"] == "Always" and spec["schedulerName"] == "default-scheduler"
    assert spec["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    got = await client.get(PODS, "a", "default")
    assert got == created


async def test_generate_name_and_missing_namespace(client):
    obj = pod("")
    obj["metadata"] = {"generateName": "web-"}
    created = await client.create(PODS, obj, "default")
    name = created["metadata"]["name"]
    assert name.startswith("web-") and len(name) == len("web-") + 5
    with pytest.raises(StatusError) as exc:
        await client.create(PODS, pod("x"), "nowhere")
    assert exc.value.code == 404 and exc.value.message == 'namespaces "nowhere" not found'


async def test_conflicts_and_already_exists(client):
    created = await client.create(CMS, {"metadata": {"name": "c"}, "data": {"a": "1"}}, "default")
    with pytest.raises(StatusError) as exc:
        await client.create(CMS, {"metadata": {"name": "c"}}, "default")
    assert exc.value.code == 409 and exc.value.reason == "AlreadyExists"
    upd = dict(created, data={"a": "2"})
    second = await client.update(CMS, upd)
    assert second["data"] == {"a": "2"}
    with pytest.raises(StatusError) as exc:
        await client.update(CMS, dict(created, data={"a": "3"}))
    assert exc.value.code == 409 and exc.value.reason == "Conflict"
    assert "the object has been modified" in exc.value.message


async def test_generation_moves_only_with_spec(client):
    d = {"metadata": {"name": "d"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}},
         "template": {"metadata": {"labels": {"app": "d"}},
                      "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}
    created = await client.create(DEPLOY, d, "default")
    assert created["metadata"]["generation"] == 1
    labelled = await client.patch(DEPLOY, "d", {"metadata": {"labels": {"x": "y"}}}, "default")
    assert labelled["metadata"]["generation"] == 1
    scaled = await client.patch(DEPLOY, "d", {"spec": {"replicas": 3}}, "default")
    assert scaled["metadata"]["generation"] == 2
    # Status writes through the main resource are ignored.
    ignored = await client.patch(DEPLOY, "d", {"status": {"replicas": 9}}, "default")
    assert "replicas" not in ignored.get("status", {})
    st = await client.patch(DEPLOY, "d", {"status": {"replicas": 9}}, "default", subresource="status")
    assert st["status"]["replicas"] == 9 and st["metadata"]["generation"] == 2
    scale = await client.get(DEPLOY, "d", "default", subresource="scale")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["selector"] == "app=d"


async def test_strategic_merge_keeps_other_containers(client):
    p = pod("m")
    p["spec"]["containers"].append({"name": "side", "image": "busybox"})
    await client.create(PODS, p, "default")
    out = await client.patch(PODS, "m", {"spec": {"containers": [{"name": "c", "image": "nginx:1.28"}]}},
                             "default", patch_type="strategic")
    assert [(c["name"], c["image"]) for c in out["spec"]["containers"]] == [("c", "nginx:1.28"), ("side", "busybox")]
    with pytest.raises(StatusError) as exc:
        await client.patch(PODS, "m", {"spec": {"restartPolicy": "Never"}}, "default", patch_type="merge")
    assert exc.value.code == 422


async def test_binding_sets_node_once(client):
    await client.create(PODS, pod("b"), "default")
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "b"},
               "target": {"kind": "Node", "name": "n1"}}
    await client.create(PODS, binding, "default", subresource="binding", name="b")
    bound = await client.get(PODS, "b", "default")
    assert bound["spec"]["nodeName"] == "n1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][0].items()
    with pytest.raises(StatusError) as exc:
        await client.create(PODS, dict(binding, target={"kind": "Node", "name": "n2"}), "default",
                            subresource="binding", name="b")
    assert exc.value.code == 409 and 'already assigned to node "n1"' in exc.value.message


async def test_finalizers_and_graceful_pod_delete(client):
    await client.create(CMS, {"metadata": {"name": "f", "finalizers": ["example.com/x"]}}, "default")
    lingering = await client.delete(CMS, "f", "default")
    assert lingering["metadata"]["deletionTimestamp"]
    await client.get(CMS, "f", "default")
    await client.patch(CMS, "f", {"metadata": {"finalizers": None}}, "default")
    with pytest.raises(StatusError) as exc:
        await client.get(CMS, "f", "default")
    assert exc.value.code == 404
    # A pod on a node terminates gracefully; grace 0 removes it.
    await client.create(PODS, dict(pod("g"), spec={**pod("g")["spec"], "nodeName": "n1"}), "default")
    term = await client.delete(PODS, "g", "default")
    assert term["metadata"]["deletionGracePeriodSeconds"] == 30
    await client.delete(PODS, "g", "default", grace_period_seconds=0)
    with pytest.raises(StatusError):
        await client.get(PODS, "g", "default")


async def test_list_selectors_and_pagination(client):
    for i in range(7):
        await client.create(PODS, pod(f"p{i}", app="a" if i % 2 else "b"), "default")
    page = await client.list(PODS, "default", limit=3)
    names = [p["metadata"]["name"] for p in page["items"]]
    token = page["metadata"]["continue"]
    await client.create(PODS, pod("p99"), "default")  # not visible to the paginated list
    while token:
        page = await client.list(PODS, "default", limit=3, continue_token=token)
        names += [p["metadata"]["name"] for p in page["items"]]
        token = page["metadata"].get("continue")
    assert names == [f"p{i}" for i in range(7)]
    only_a = await client.list(PODS, "default", label_selector="app=a")
    assert [p["metadata"]["name"] for p in only_a["items"]] == ["p1", "p3", "p5"]
    notin = await client.list(PODS, "default", label_selector="app notin (a),app")
    assert [p["metadata"]["name"] for p in notin["items"]] == ["p0", "p2", "p4", "p6"]
    by_name = await client.list(PODS, None, field_selector="metadata.name=p3")
    assert [p["metadata"]["name"] for p in by_name["items"]] == ["p3"]
    with pytest.raises(StatusError) as exc:
        await client.list(PODS, "default", field_selector="spec.bogus=1")
    assert exc.value.code == 400


async def _collect(stream, n: int, timeout: float = 5.0) -> list:
    out = []
    async def run():
        async for ev in stream:
            out.append(ev)
            if len(out) >= n:
                break
    await asyncio.wait_for(run(), timeout)
    await stream.close()
    return out


async def test_watch_from_revision_with_selector_transitions(client):
    first = await client.create(PODS, pod("w", app="in"), "default")
    rv = first["metadata"]["resourceVersion"]
    stream = client.watch(PODS, "default", resource_version=rv, label_selector="app=in", allow_bookmarks=False)
    await client.patch(PODS, "w", {"metadata": {"labels": {"app": "out"}}}, "default")
    await client.patch(PODS, "w", {"metadata": {"labels": {"app": "in"}}}, "default")
    await client.create(PODS, pod("other", app="out"), "default")
    await client.delete(PODS, "w", "default")
    events = await _collect(stream, 3)
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("DELETED", "w"), ("ADDED", "w"), ("DELETED", "w")]
    assert all(e.object["kind"] == "Pod" for e in events)


async def test_watch_initial_events_and_bookmarks(client):
    await client.create(CMS, {"metadata": {"name": "i1"}}, "default")
    stream = client.watch(CMS, "default", resource_version="0", allow_bookmarks=True)
    events = await _collect(stream, 1)
    assert events[0].type == "ADDED" and events[0].object["metadata"]["name"] == "i1"
    stream = client.watch(CMS, "default", send_initial_events=True, allow_bookmarks=True)
    events = await _collect(stream, 2)
    assert events[0].type == "ADDED"
    assert events[1].type == "BOOKMARK"
    assert events[1].object["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_watch_expired_is_error_event(client):
    first = await client.create(CMS, {"metadata": {"name": "old"}}, "default")
    for i in range(80):  # history is 50 revisions in this fixture
        await client.create(CMS, {"metadata": {"name": f"n{i}"}}, "default")
    stream = client.watch(CMS, "default", resource_version=first["metadata"]["resourceVersion"])
    events = await _collect(stream, 1)
    assert events[0].type == "ERROR"
    assert events[0].object["code"] == 410 and events[0].object["reason"] == "Expired"


async def test_server_side_apply_creates_then_conflicts(client):
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}}
    created = await client.patch(CMS, "ssa", cfg, "default", patch_type="apply", field_manager="one")
    assert created["data"] == {"a": "1"}
    assert [m["manager"] for m in created["metadata"]["managedFields"]] == ["one"]
    with pytest.raises(StatusError) as exc:
        await client.patch(CMS, "ssa", dict(cfg, data={"a": "2"}), "default", patch_type="apply",
                           field_manager="two")
    assert exc.value.code == 409 and exc.value.causes[0].field == ".data.a"
    forced = await client.patch(CMS, "ssa", dict(cfg, data={"a": "2"}), "default", patch_type="apply",
                                field_manager="two", force=True)
    assert forced["data"] == {"a": "2"}


async def test_namespace_finalize_subresource(client):
    ns = await client.create(NS, {"metadata": {"name": "fin", "finalizers": ["example.com/meta"]}})
    assert ns["spec"]["finalizers"] == ["kubernetes"]
    out = await client.update(NS, {**ns, "spec": {"finalizers": ["example.com/own"]}}, subresource="finalize")
    assert out["spec"]["finalizers"] == ["example.com/own"] and out["kind"] == "Namespace"
    # the main endpoint leaves them as they are
    out = await client.update(NS, {**out, "spec": {"finalizers": []}})
    assert out["spec"]["finalizers"] == ["example.com/own"]
    await client.delete(NS, "fin")
    ns = await client.patch(NS, "fin", {"metadata": {"finalizers": None}})
    assert ns["status"]["phase"] == "Terminating"  # held by its own spec finalizer
    await client.update(NS, {**ns, "spec": {"finalizers": []}}, subresource="finalize")
    with pytest.raises(StatusError) as exc:
        await client.get(NS, "fin")
    assert exc.value.code == 404


async def test_namespace_deletion_removes_contents(client):
    await client.create(NS, {"metadata": {"name": "gone"}})
    await client.create(CMS, {"metadata": {"name": "c"}}, "gone")
    await client.create(CMS, {"metadata": {"name": "held", "finalizers": ["example.com/x"]}}, "gone")
    ns = await client.delete(NS, "gone")
    assert ns["status"]["phase"] == "Terminating"
    with pytest.raises(StatusError) as exc:
        await client.create(CMS, {"metadata": {"name": "d"}}, "gone")
    assert exc.value.code == 403 and "being terminated" in exc.value.message
    for _ in range(100):
        held = await client.get(CMS, "held", "gone")
        if held["metadata"].get("deletionTimestamp"):
            break
        await asyncio.sleep(0.02)
    assert (await client.get(NS, "gone"))["status"]["phase"] == "Terminating"
    await client.patch(CMS, "held", {"metadata": {"finalizers": None}}, "gone")
    for _ in range(100):
        try:
            await client.get(NS, "gone")
        except StatusError as err:
            assert err.code == 404
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("namespace was not finalized")
    assert (await client.list(CMS, "gone"))["items"] == []


async def test_dry_run_persists_nothing(client):
    out = await client.create(CMS, {"metadata": {"name": "dry"}}, "default", dry_run=True)
    assert out["metadata"]["name"] == "dry"
    with pytest.raises(StatusError):
        await client.get(CMS, "dry", "default")


async def test_delete_collection_with_a_selector(client):
    for name, app in (("a", "x"), ("b", "x"), ("c", "y")):
        await client.create(CMS, {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": name, "labels": {"app": app}}}, "default")
    out = await client.delete_collection(CMS, "default", label_selector="app=x")
    assert out["kind"] == "ConfigMapList" and sorted(o["metadata"]["name"] for o in out["items"]) == ["a", "b"]
    left = await client.list(CMS, "default", label_selector="app")
    assert [o["metadata"]["name"] for o in left["items"]] == ["c"]
    with pytest.raises(StatusError) as err:
        await client.delete_collection(NS)  # namespaces serve no deletecollection
    assert err.value.code == 405
