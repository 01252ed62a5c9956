"""DELETE as upstream answers it: DeleteOptions of the wrong type are a 400
naming the field, the namespaces upstream protects cannot be deleted (and come
back if they go missing), namespaces have no deletecollection, and concurrent
deletions of one namespace never end in a 500."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import APIServer, APIServerConfig, ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.cluster import namespace_controller
from kubeplane.registry.registry import Registry
from kubeplane.storage import open_store
from kubeplane.storage.interface import StorageError

NAMESPACES = resource("namespaces")
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
       "spec": {"containers": [{"name": "c", "image": "i"}]}}


@pytest.fixture(params=["memory", "sqlite"])
async def api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    store = await open_store(request.param, str(tmp_path))
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    ns_controller = namespace_controller(registry)
    await ns_controller.start()
    server = TestServer(build_app(registry, CATALOGUE), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession(str(server.make_url(""))) as session:
        yield session
    await server.close()
    await ns_controller.stop()
    await registry.close()
    await store.close()


async def _call(s: aiohttp.ClientSession, method: str, path: str, body=None) -> tuple[int, dict]:
    data = None if body is None else orjson.dumps(body)
    async with s.request(method, path, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, orjson.loads(await r.read())


BAD_DELETE_OPTIONS = [
    ({"dryRun": 5}, "json: cannot unmarshal number into Go struct field DeleteOptions.dryRun of type []string"),
    ({"dryRun": "All"}, "json: cannot unmarshal string into Go struct field DeleteOptions.dryRun of type []string"),
    ({"dryRun": [1]}, "json: cannot unmarshal number into Go struct field DeleteOptions.dryRun of type string"),
    ({"gracePeriodSeconds": "0"},
     "json: cannot unmarshal string into Go struct field DeleteOptions.gracePeriodSeconds of type int64"),
    ({"gracePeriodSeconds": 1.5},
     "json: cannot unmarshal number 1.5 into Go struct field DeleteOptions.gracePeriodSeconds of type int64"),
    ({"gracePeriodSeconds": True},
     "json: cannot unmarshal bool into Go struct field DeleteOptions.gracePeriodSeconds of type int64"),
    ({"propagationPolicy": 1},
     "json: cannot unmarshal number into Go struct field DeleteOptions.propagationPolicy of type v1.DeletionPropagation"),
    ({"orphanDependents": "yes"},
     "json: cannot unmarshal string into Go struct field DeleteOptions.orphanDependents of type bool"),
    ({"preconditions": []},
     "json: cannot unmarshal array into Go struct field DeleteOptions.preconditions of type v1.Preconditions"),
    ({"preconditions": {"uid": 7}},
     "json: cannot unmarshal number into Go struct field Preconditions.preconditions.uid of type types.UID"),
    ({"preconditions": {"resourceVersion": {}}},
     "json: cannot unmarshal object into Go struct field Preconditions.preconditions.resourceVersion of type string"),
    ({"kind": 5}, "couldn't get version/kind; json parse error: "
                  "json: cannot unmarshal number into Go struct field .kind of type string"),
    ({"apiVersion": ["v1"]}, "couldn't get version/kind; json parse error: "
                             "json: cannot unmarshal array into Go struct field .apiVersion of type string"),
    ({"kind": "Pod", "apiVersion": "v1"}, 'no kind "Pod" is registered for version "v1"'),
    ([1], "json: cannot unmarshal array into Go value of type v1.DeleteOptions"),
]


async def test_delete_options_of_the_wrong_type_are_a_400_naming_the_field(api: aiohttp.ClientSession) -> None:
    assert (await _call(api, "POST", "/api/v1/namespaces/default/pods", POD))[0] == 201
    for body, message in BAD_DELETE_OPTIONS:
        for path in ("/api/v1/namespaces/default/pods/p", "/api/v1/namespaces/default/pods"):
            code, status = await _call(api, "DELETE", path, body)
            assert (code, status["reason"], status["message"]) == (400, "BadRequest", message), (body, path)
    assert (await _call(api, "GET", "/api/v1/namespaces/default/pods/p"))[0] == 200  # nothing was deleted
    code, status = await _call(api, "DELETE", "/api/v1/namespaces/default/pods/p",
                               {"orphanDependents": True, "propagationPolicy": "Background"})
    assert code == 422 and status["reason"] == "Invalid"
    assert status["message"] == ('DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Invalid value: '
                                 '"Background": orphanDependents and deletionPropagation cannot be both set')
    assert (status["details"]["kind"], status["details"]["group"]) == ("DeleteOptions", "meta.k8s.io")
    # well-typed options still work, orphanDependents among them
    code, _ = await _call(api, "DELETE", "/api/v1/namespaces/default/pods/p",
                          {"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"], "gracePeriodSeconds": 0,
                           "preconditions": {"uid": None, "resourceVersion": None}})
    assert code == 200
    assert (await _call(api, "POST", "/api/v1/namespaces/default/configmaps",
                        {"metadata": {"name": "c", "finalizers": ["example.com/keep"]}}))[0] == 201
    # Held by finalizers: upstream answers 200 with the object (not 202)
    # unless the client asked for orphanDependents=false.
    code, cm = await _call(api, "DELETE", "/api/v1/namespaces/default/configmaps/c", {"orphanDependents": True})
    assert code == 200 and "orphan" in cm["metadata"]["finalizers"] and cm["metadata"]["deletionTimestamp"]


async def test_namespaces_have_no_deletecollection(api: aiohttp.ClientSession) -> None:
    code, status = await _call(api, "DELETE", "/api/v1/namespaces")
    assert (code, status["reason"]) == (405, "MethodNotAllowed")
    code, names = await _call(api, "GET", "/api/v1/namespaces")
    assert code == 200 and {"default", "kube-system", "kube-public"} <= {
        n["metadata"]["name"] for n in names["items"]}
    _, core = await _call(api, "GET", "/api/v1")
    verbs = {r["name"]: r["verbs"] for r in core["resources"]}
    assert "deletecollection" not in verbs["namespaces"] and "delete" in verbs["namespaces"]
    assert "deletecollection" in verbs["pods"]
    async with api.get("/api", headers={"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}) as r:
        agg = orjson.loads(await r.read())
    (ns,) = [res for g in agg["items"] for v in g["versions"] for res in v["resources"] if res["resource"] == "namespaces"]
    assert "deletecollection" not in ns["verbs"]
    async with api.get("/openapi/v3/api/v1") as r:
        doc = orjson.loads(await r.read())
    assert "delete" not in doc["paths"]["/api/v1/namespaces"]
    assert "delete" in doc["paths"]["/api/v1/namespaces/{name}"]


async def test_the_namespaces_upstream_protects_cannot_be_deleted(api: aiohttp.ClientSession) -> None:
    for name in ("default", "kube-system", "kube-public"):
        for body in (None, {"dryRun": ["All"]}):
            code, status = await _call(api, "DELETE", f"/api/v1/namespaces/{name}", body)
            assert (code, status["reason"], status["message"]) == (
                403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted')
            assert status["details"] == {"name": name, "kind": "namespaces"}
        assert (await _call(api, "GET", f"/api/v1/namespaces/{name}"))[1]["status"]["phase"] == "Active"
    code, ns = await _call(api, "DELETE", "/api/v1/namespaces/kube-node-lease")  # not protected
    assert code in (200, 202) and ns["status"]["phase"] == "Terminating"


async def test_concurrent_deletions_of_a_namespace_never_fail(api: aiohttp.ClientSession) -> None:
    for i in range(10):
        ns = f"gone-{i}"
        assert (await _call(api, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}}))[0] == 201
        assert (await _call(api, "POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "c"}}))[0] == 201
        results = await asyncio.gather(*(_call(api, "DELETE", f"/api/v1/namespaces/{ns}") for _ in range(4)))
        for code, body in results:
            assert code in (200, 202, 404), (code, body)


async def _server(tmp_path: Path, interval: float) -> APIServer:
    server = APIServer(APIServerConfig(insecure_http=True, data_dir=str(tmp_path), listen="127.0.0.1:0", storage="memory",
                                       system_namespaces_interval=interval), in_process=[namespace_controller])
    await server.start()
    return server


async def _wait_for_namespace(server: APIServer, name: str, timeout: float = 5.0) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        kv = await server.store.get(NAMESPACES.storage_key(name))
        if kv is not None:
            return kv.value
        await asyncio.sleep(0.01)
    raise AssertionError(f"namespace {name} was not re-created")


async def test_a_missing_system_namespace_is_recreated_at_once(tmp_path: Path) -> None:
    server = await _server(tmp_path, interval=3600)  # the periodic check cannot be what brings them back
    try:
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            old = await server.store.get(NAMESPACES.storage_key(name))
            await server.store.delete(NAMESPACES.storage_key(name))
            new = await _wait_for_namespace(server, name, timeout=2.0)
            assert new["metadata"]["uid"] != old.value["metadata"]["uid"]
        # deleted through the API (finalized, then gone) and created again
        async with aiohttp.ClientSession(server.url) as s:
            code, _ = await _call(s, "DELETE", "/api/v1/namespaces/kube-node-lease")
            assert code in (200, 202)
            for _ in range(500):
                code, ns = await _call(s, "GET", "/api/v1/namespaces/kube-node-lease")
                if code == 200 and ns["status"]["phase"] == "Active":
                    break
                await asyncio.sleep(0.01)
            assert (code, ns["status"]["phase"]) == (200, "Active")
            # and creating in default works again
            assert (await _call(s, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "c"}}))[0] == 201
    finally:
        await server.stop()


async def test_system_namespaces_are_rechecked_periodically_without_a_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await _server(tmp_path, interval=0.1)
    try:
        def no_watch(prefix: str, revision: int):
            raise StorageError("watch unavailable")

        monkeypatch.setattr(server.store, "watch", no_watch)
        await asyncio.sleep(0.15)  # the keeper is now waiting without a watch
        old = await server.store.get(NAMESPACES.storage_key("kube-system"))
        await server.store.delete(NAMESPACES.storage_key("kube-system"))
        new = await _wait_for_namespace(server, "kube-system", timeout=3.0)
        assert new["metadata"]["uid"] != old.value["metadata"]["uid"]
    finally:
        await server.stop()



async def _patch_labels(s: aiohttp.ClientSession, name: str) -> int:
    async with s.patch(f"/api/v1/namespaces/default/pods/{name}",
                       data=orjson.dumps({"metadata": {"labels": {"x": "y"}}}),
                       headers={"Content-Type": "application/merge-patch+json"}) as r:
        return r.status


def _binding(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"kind": "Node", "name": node}}


async def test_concurrent_bindings_over_http_store_what_they_answer(api: aiohttp.ClientSession) -> None:
    # two bindings of one pod and a label patch, all at once, through the HTTP front end
    false_successes = doubles = 0
    for i in range(100):
        name = f"b{i}"
        assert (await _call(api, "POST", "/api/v1/namespaces/default/pods",
                            {**POD, "metadata": {"name": name}}))[0] == 201
        path = f"/api/v1/namespaces/default/pods/{name}/binding"
        (c1, _), (c2, _), c3 = await asyncio.gather(
            _call(api, "POST", path, _binding(name, "n1")), _call(api, "POST", path, _binding(name, "n2")),
            _patch_labels(api, name))
        _, pod = await _call(api, "GET", f"/api/v1/namespaces/default/pods/{name}")
        wins = [n for n, c in (("n1", c1), ("n2", c2)) if c == 201]
        doubles += len(wins) != 1
        false_successes += sum(n != pod["spec"].get("nodeName") for n in wins)
        assert sorted((c1, c2)) == [201, 409] and c3 == 200 and pod["metadata"]["labels"] == {"x": "y"}
    assert (false_successes, doubles) == (0, 0)


async def test_a_namespace_left_terminating_by_a_restart_is_finished(tmp_path: Path) -> None:
    config = APIServerConfig(insecure_http=True, data_dir=str(tmp_path), listen="127.0.0.1:0", storage="sqlite")
    server = APIServer(config, in_process=[namespace_controller])
    await server.start()
    try:
        key = NAMESPACES.storage_key("left")
        await server.registry.create(NAMESPACES, {"metadata": {"name": "left"}})
        await server.registry.create(resource("configmaps"), {"metadata": {"name": "c"}}, "left")
        # terminating as a delete leaves it, but with nobody finalizing it (the process died)
        ns = dict((await server.store.get(key)).value)
        ns["metadata"] = {**ns["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}
        ns["status"] = {"phase": "Terminating"}
        await server.store.update(key, ns)
    finally:
        await server.stop()
    server = APIServer(config, in_process=[namespace_controller])
    await server.start()
    try:
        for _ in range(500):
            if await server.store.get(key) is None:
                break
            await asyncio.sleep(0.01)
        assert await server.store.get(key) is None
        assert (await server.store.list(resource("configmaps").storage_prefix("left"))).items == []
    finally:
        await server.stop()
