"""The namespace controller: it empties a terminating namespace through the
API, retries with backoff while content lingers, finalizes after the last
object, and finishes namespaces left terminating before it started."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.namespace import NamespaceController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

NS = resource("namespaces")
CMS = resource("configmaps")
SECRETS = resource("secrets")
PODS = resource("pods")


@pytest.fixture
async def env():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    controllers: list[NamespaceController] = []

    def start(**kwargs) -> NamespaceController:
        ctrl = NamespaceController(client, **kwargs)
        controllers.append(ctrl)
        return ctrl

    yield store, client, start
    for ctrl in controllers:
        await ctrl.stop()
    await client.close()
    await registry.close()
    await store.close()


async def _until(pred, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await pred():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _gone(client, name: str) -> bool:
    try:
        await client.get(NS, name)
    except StatusError as err:
        return err.code == 404
    return False


async def _fill(client, name: str) -> None:
    await client.create(NS, {"metadata": {"name": name}})
    await client.create(CMS, {"metadata": {"name": "c"}}, name)
    await client.create(SECRETS, {"metadata": {"name": "s"}}, name)
    await client.create(PODS, {"metadata": {"name": "p"}, "spec": {"nodeName": "n",
                               "containers": [{"name": "c", "image": "i"}]}}, name)


async def test_the_content_is_deleted_then_the_namespace(env) -> None:
    _, client, start = env
    await start().start()
    await _fill(client, "gone")
    await _fill(client, "kept")
    ns = await client.delete(NS, "gone")
    assert ns["status"]["phase"] == "Terminating" and ns["spec"]["finalizers"] == ["kubernetes"]
    await _until(lambda: _gone(client, "gone"))
    for res in (CMS, SECRETS, PODS):
        assert (await client.list(res, "gone"))["items"] == []
        assert len((await client.list(res, "kept"))["items"]) == 1  # other namespaces are left alone
    assert (await client.get(NS, "kept"))["status"]["phase"] == "Active"


async def test_lingering_content_is_retried_with_backoff_and_finalized_after_the_last_object(env) -> None:
    _, client, start = env
    ctrl = start(retry_seconds=0.01, retry_max_seconds=0.05)
    await ctrl.start()
    await client.create(NS, {"metadata": {"name": "held"}})
    await client.create(CMS, {"metadata": {"name": "c", "finalizers": ["example.com/x"]}}, "held")
    await client.create(CMS, {"metadata": {"name": "free"}}, "held")
    await client.delete(NS, "held")

    async def retried() -> bool:
        return ctrl.work.num_requeues("held") >= 3

    await _until(retried)
    # while the configmap lingers the namespace keeps its finalizer
    ns = await client.get(NS, "held")
    assert ns["status"]["phase"] == "Terminating" and ns["spec"]["finalizers"] == ["kubernetes"]
    cms = (await client.list(CMS, "held"))["items"]
    assert [c["metadata"]["name"] for c in cms] == ["c"] and cms[0]["metadata"]["deletionTimestamp"]
    await client.patch(CMS, "c", {"metadata": {"finalizers": None}}, "held")
    await _until(lambda: _gone(client, "held"))
    assert ctrl.work.num_requeues("held") == 0  # forgotten once done


async def test_a_namespace_left_terminating_before_the_controller_started_is_finished(env) -> None:
    store, client, start = env
    await _fill(client, "left")
    await client.delete(NS, "left")  # nobody runs the controller yet: it stays
    await asyncio.sleep(0)
    assert (await client.get(NS, "left"))["status"]["phase"] == "Terminating"
    assert len((await client.list(CMS, "left"))["items"]) == 1
    await start().start()  # the informer's initial list holds it
    await _until(lambda: _gone(client, "left"))
    assert (await store.list(CMS.storage_prefix("left"))).items == []


async def test_a_namespace_without_its_finalizer_is_not_touched(env) -> None:
    _, client, start = env
    await client.create(NS, {"metadata": {"name": "other", "finalizers": ["example.com/keep"]}})
    await client.create(CMS, {"metadata": {"name": "c"}}, "other")
    ns = await client.get(NS, "other")
    await client.update(NS, {**ns, "spec": {"finalizers": ["example.com/own"]}}, subresource="finalize")
    await client.delete(NS, "other")
    ctrl = start()
    await ctrl.start()
    ns = await client.get(NS, "other")
    assert ns["spec"]["finalizers"] == ["example.com/own"] and ns["status"]["phase"] == "Terminating"
    await ctrl.sync("other")  # it has nothing to do here
    assert len((await client.list(CMS, "other"))["items"]) == 1


async def test_one_namespace_controller_runs_in_a_test_cluster_with_or_without_the_controllers() -> None:
    from kubeplane.testing import Cluster

    for controllers in (False, True):
        async with Cluster(controllers=controllers) as c:
            in_server = [x for x in c._server._started if isinstance(x, NamespaceController)]
            in_comps = [x for x in (c._comps.items if c._comps else []) if isinstance(x, NamespaceController)]
            assert len(in_server) + len(in_comps) == 1, controllers
            assert bool(in_comps) == controllers  # with the controllers it is one of them
            client = c._client
            await client.create(NS, {"metadata": {"name": "x"}})
            await client.create(CMS, {"metadata": {"name": "c"}}, "x")
            await client.delete(NS, "x")
            await _until(lambda: _gone(client, "x"))


def test_the_controller_set_has_the_namespace_controller_unless_told_otherwise() -> None:
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.cluster import ControllerOptions, build_controllers

    client = InProcessClient(Registry(MemoryStore(), CATALOGUE))
    factory = SharedInformerFactory(client)
    assert sum(isinstance(c, NamespaceController)
               for c in build_controllers(client, factory, ControllerOptions())) == 1
    assert not any(isinstance(c, NamespaceController)
                   for c in build_controllers(client, factory, ControllerOptions(namespace=False)))
