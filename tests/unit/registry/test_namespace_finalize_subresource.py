"""``namespaces/{name}/finalize`` as upstream serves it: spec.finalizers is
written through it only, a terminating namespace goes once it and
metadata.finalizers are empty, and only PUT is served."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

NS = resource("namespaces")
CMS = resource("configmaps")


@pytest.fixture
async def registry():
    store = MemoryStore()
    reg = Registry(store, CATALOGUE)
    await ensure_default_namespaces(reg)
    yield reg
    await reg.close()
    await store.close()


async def test_create_ensures_the_kubernetes_finalizer(registry: Registry) -> None:
    assert (await registry.create(NS, {"metadata": {"name": "a"}}))["spec"]["finalizers"] == ["kubernetes"]
    b = await registry.create(NS, {"metadata": {"name": "b"}, "spec": {"finalizers": ["example.com/x"]}})
    assert b["spec"]["finalizers"] == ["example.com/x", "kubernetes"]
    c = await registry.create(NS, {"metadata": {"name": "c"}, "spec": {"finalizers": []}})
    assert c["spec"]["finalizers"] == ["kubernetes"]


async def test_spec_finalizers_change_through_finalize_only(registry: Registry) -> None:
    ns = await registry.create(NS, {"metadata": {"name": "a"}})
    updated = await registry.update(NS, {**ns, "spec": {"finalizers": []}})
    assert updated["spec"]["finalizers"] == ["kubernetes"]  # the main endpoint keeps them
    patched, _ = await registry.patch(NS, "a", {"spec": {"finalizers": None}})
    assert patched["spec"]["finalizers"] == ["kubernetes"]
    finalized = await registry.update(NS, {**patched, "spec": {"finalizers": ["example.com/y"]},
                                           "status": {"phase": "Terminating"}}, subresource="finalize")
    assert finalized["spec"]["finalizers"] == ["example.com/y"]
    assert finalized["status"]["phase"] == "Active"  # status is not written through finalize
    with pytest.raises(StatusError) as info:
        await registry.update(CMS, {"metadata": {"name": "x", "namespace": "a"}}, subresource="finalize")
    assert info.value.code == 404


async def test_a_terminating_namespace_goes_once_finalized(registry: Registry) -> None:
    await registry.create(NS, {"metadata": {"name": "a", "finalizers": ["example.com/meta"]}})
    ns, finished = await registry.delete(NS, "a")
    assert not finished and ns["status"]["phase"] == "Terminating"
    # the metadata finalizer goes first: the spec finalizer still holds it
    ns, _ = await registry.patch(NS, "a", {"metadata": {"finalizers": None}})
    assert ns["spec"]["finalizers"] == ["kubernetes"]
    assert (await registry.get(NS, "a"))["metadata"]["deletionTimestamp"]
    await registry.update(NS, {**ns, "spec": {"finalizers": []}}, subresource="finalize")
    with pytest.raises(StatusError) as info:
        await registry.get(NS, "a")
    assert info.value.code == 404


async def test_finalize_is_served_for_put_only(registry: Registry) -> None:
    server = TestServer(build_app(registry, CATALOGUE), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(str(server.make_url(""))) as s:
            await registry.create(NS, {"metadata": {"name": "a"}})
            async with s.get("/api/v1/namespaces/a") as r:
                ns = orjson.loads(await r.read())
            for method in ("GET", "PATCH", "POST", "DELETE"):
                async with s.request(method, "/api/v1/namespaces/a/finalize", data=b"{}",
                                     headers={"Content-Type": "application/merge-patch+json"}) as r:
                    assert (r.status, orjson.loads(await r.read())["reason"]) == (405, "MethodNotAllowed"), method
            body = {**ns, "spec": {"finalizers": []}}
            async with s.put("/api/v1/namespaces/a/finalize", data=orjson.dumps(body),
                             headers={"Content-Type": "application/json"}) as r:
                out = orjson.loads(await r.read())
                assert r.status == 200 and out["spec"]["finalizers"] == [] and out["kind"] == "Namespace"
            async with s.get("/api/v1/namespaces/a/status") as r:  # the other subresource of a namespace
                assert r.status == 200 and orjson.loads(await r.read())["status"]["phase"] == "Active"
            async with s.get("/api/v1") as r:
                core = orjson.loads(await r.read())
            (sub,) = [x for x in core["resources"] if x["name"] == "namespaces/finalize"]
            assert sub["verbs"] == ["update"] and sub["kind"] == "Namespace"
    finally:
        await server.close()
