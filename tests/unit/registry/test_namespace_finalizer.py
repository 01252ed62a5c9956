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
from helpers import caught_up

NS = resource("namespaces")
CMS = resource("configmaps")


class CountingStore(MemoryStore):
    lists = 0

    async def list(self, *args, **kwargs):
        self.lists += 1
        return await super().list(*args, **kwargs)


#: the namespace controller of the running test
CONTROLLERS: list = []


@pytest.fixture
async def env():
    store = CountingStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    ns_controller = namespace_controller(registry)
    await ns_controller.start()
    CONTROLLERS[:] = [ns_controller]
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

    async def waiting():
        ns = await registry.get(NS, "gone")
        remaining = any(c.get("type") == "NamespaceContentRemaining" and c.get("status") == "True"
                        for c in (ns.get("status") or {}).get("conditions") or [])
        ctrl = CONTROLLERS[0]
        work = ctrl.work
        # the controller's informer has seen the namespace as it is now (its
        # own last write included), and the controller is between syncs
        return (remaining and caught_up(ctrl, ctrl.namespaces, ns["metadata"]["resourceVersion"], delayed=True)
                and "gone" in work._timers and "gone" not in work._processing and "gone" not in work._dirty)
    # The controller found the content held: it waits for the retry (a
    # second or more away, backing off) instead of listing it in a loop, and
    # lists nothing meanwhile.
    await _until(waiting)
    when, _ = CONTROLLERS[0].work._timers["gone"]
    assert when - asyncio.get_running_loop().time() > 0.5
    before = store.lists
    await asyncio.sleep(0.2)
    assert store.lists == before
    assert (await registry.get(NS, "gone"))["status"]["phase"] == "Terminating"

    await registry.patch(CMS, "held", {"metadata": {"finalizers": None}}, "gone")

    async def ns_gone():
        try:
            await registry.get(NS, "gone")
        except StatusError as err:
            return err.code == 404
        return False

    await _until(ns_gone, timeout=5.0)  # the first retries come within seconds
