"""The event recorder: never blocks its caller, writes in the background, counts
repeats, drops beyond its queue bound, records related objects, drains on close."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.events import EventRecorder
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CMS = resource("configmaps")
EVENTS = resource("events")


@pytest.fixture
async def client():
    store = MemoryStore(history=1000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    yield c
    await c.close()
    await registry.close()
    await store.close()


class GatedClient:
    """Lets creates through only once ``gate`` is set; counts them."""

    def __init__(self, inner: InProcessClient) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.creates = 0

    async def create(self, res, obj, namespace=None, **kw):
        await self.gate.wait()
        self.creates += 1
        return await self.inner.create(res, obj, namespace, **kw)

    async def patch(self, *a, **kw):
        return await self.inner.patch(*a, **kw)


async def _events(client) -> list[dict]:
    return (await client.list(EVENTS, "default"))["items"]


async def test_event_returns_before_the_write_and_the_writer_catches_up(client) -> None:
    gated = GatedClient(client)
    rec = EventRecorder(gated, "tester")
    cm = await client.create(CMS, {"metadata": {"name": "cm"}}, "default")
    for i in range(10):
        rec.event(cm, "Normal", f"R{i}", "m")  # does not wait for the (blocked) API
    assert gated.creates == 0 and await _events(client) == []
    assert not await rec.flush(0.05)
    gated.gate.set()
    assert await rec.flush(5)
    items = await _events(client)
    assert sorted(e["reason"] for e in items) == sorted(f"R{i}" for i in range(10))
    assert all(e["involvedObject"]["uid"] == cm["metadata"]["uid"] for e in items)


async def test_queue_bound_drops_new_events(client) -> None:
    gated = GatedClient(client)
    rec = EventRecorder(gated, "tester")
    rec.max_queued = 5
    cm = await client.create(CMS, {"metadata": {"name": "cm"}}, "default")
    await asyncio.sleep(0)
    for i in range(20):
        rec.event(cm, "Normal", f"R{i}", "m")
        await asyncio.sleep(0)  # writers take one each and block on the gate
    held = rec.writers + rec.max_queued
    assert rec.dropped == 20 - held
    gated.gate.set()
    assert await rec.flush(5)
    assert len(await _events(client)) == held


async def test_eventf_records_action_and_related_object_and_kind_defaults(client) -> None:
    rec = EventRecorder(client, "default-scheduler", instance="sched-1", kind="Pod", api_version="v1")
    victim = {"metadata": {"name": "victim", "namespace": "default", "uid": "u1"}}
    preemptor = {"metadata": {"name": "big", "namespace": "default", "uid": "u2"}}
    rec.eventf(victim, preemptor, "Normal", "Preempted", "Preempting", "Preempted by pod u2 on node n1")
    assert await rec.flush(5)
    [ev] = await _events(client)
    assert ev["involvedObject"]["kind"] == "Pod" and ev["involvedObject"]["name"] == "victim"
    assert ev["related"]["name"] == "big" and ev["action"] == "Preempting"
    assert ev["reportingComponent"] == "default-scheduler" and ev["reportingInstance"] == "sched-1"


async def test_a_failed_write_is_logged_and_later_events_still_go_out(client) -> None:
    class Failing(GatedClient):
        async def create(self, res, obj, namespace=None, **kw):
            if obj["reason"] == "Bad":
                raise StatusError(500, "InternalError", "boom")
            return await self.inner.create(res, obj, namespace, **kw)

    rec = EventRecorder(Failing(client), "tester")
    rec.writers = 1
    cm = await client.create(CMS, {"metadata": {"name": "cm"}}, "default")
    rec.event(cm, "Warning", "Bad", "x")
    rec.event(cm, "Normal", "Good", "y")
    assert await rec.flush(5)
    assert [e["reason"] for e in await _events(client)] == ["Good"]


async def test_close_writes_what_is_queued_and_without_a_loop_nothing_is_queued(client) -> None:
    rec = EventRecorder(client, "tester")
    cm = await client.create(CMS, {"metadata": {"name": "cm"}}, "default")
    for i in range(30):
        rec.event(cm, "Normal", f"R{i}", "m")
    await rec.close()
    assert len(await _events(client)) == 30

    other = EventRecorder(client, "tester")
    await asyncio.get_running_loop().run_in_executor(None, other.event, cm, "Normal", "X", "m")
    assert not other._pending and await other.flush(1)


async def test_field_path_names_the_part_of_the_object_and_keeps_repeats_apart(client) -> None:
    rec = EventRecorder(client, "kubelet", host="n1", kind="Pod", api_version="v1")
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}}
    rec.event(pod, "Normal", "Pulled", "already present", field_path="spec.containers{a}")
    assert await rec.flush(5)
    rec.event(pod, "Normal", "Pulled", "already present", field_path="spec.containers{a}")
    rec.event(pod, "Normal", "Pulled", "already present", field_path="spec.initContainers{b}")
    rec.event(pod, "Normal", "Pulled", "already present")
    assert await rec.flush(5)
    got = {e["involvedObject"].get("fieldPath"): e["count"] for e in await _events(client)}
    # the same event about another container is another event, as upstream's correlator keys them
    assert got == {"spec.containers{a}": 2, "spec.initContainers{b}": 1, None: 1}
