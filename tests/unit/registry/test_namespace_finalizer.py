"""The namespace controller the API server runs waits for lingering content
without listing it in a loop, and finishes soon after the last object goes."""

import asyncio

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.cluster import namespace_controller
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

NS = resource("namespaces")
CMS = resource("configmaps")


class CountingStore(MemoryStore):
    lists = 0

    async def list(self, *args, **kwargs):
        self.lists += 1
        return await super().list(*args, **kwargs)


@pytest.fixture
async def env():
    store = CountingStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    ns_controller = namespace_controller(registry)
    await ns_controller.start()
    yield store, registry
    await ns_controller.stop()
    await registry.close()
    await store.close()


async def _until(pred, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await pred():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_lingering_content_is_awaited_by_watch_then_the_namespace_goes(env):
    store, registry = env
    await registry.create(NS, {"metadata": {"name": "gone"}})
    await registry.create(CMS, {"metadata": {"name": "held", "finalizers": ["example.com/x"]}}, "gone")
    await registry.delete(NS, "gone")

    async def held_terminating():
        return bool((await registry.get(CMS, "held", "gone"))["metadata"].get("deletionTimestamp"))

    await _until(held_terminating)
    # The finalizer is now waiting: it must not list the namespace's content in a loop.
    before = store.lists
    await asyncio.sleep(0.5)
    assert store.lists - before <= len([r for r in CATALOGUE.resources if r.namespaced])
    assert (await registry.get(NS, "gone"))["status"]["phase"] == "Terminating"

    await registry.patch(CMS, "held", {"metadata": {"finalizers": None}}, "gone")

    async def ns_gone():
        try:
            await registry.get(NS, "gone")
        except StatusError as err:
            return err.code == 404
        return False

    await _until(ns_gone, timeout=5.0)  # the first retries come within seconds
