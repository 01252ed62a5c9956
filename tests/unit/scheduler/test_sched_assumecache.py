"""The event-dispatching AssumeCache (scenarios after upstream's assume cache tests)."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.client.informer import DeletedFinalStateUnknown, SharedInformer
from kubeplane.scheduler.assumecache import (
    AssumeCache,
    InvalidResourceVersionError,
    NotFoundError,
    ObjectVersionError,
    compare_resource_versions,
)


def obj(name, rv, ns="ns", **extra):
    o = {"metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv)}}
    o.update(extra)
    return o


class Recorder:
    def __init__(self, cache=None):
        self.events = []
        self.cache = cache
        self.seen_latest = []

    def on_add(self, o):
        self.events.append(("add", o["metadata"]["name"], o["metadata"]["resourceVersion"]))
        self._read(o)

    def on_update(self, old, new):
        self.events.append(("update", old["metadata"]["resourceVersion"], new["metadata"]["resourceVersion"]))
        self._read(new)

    def on_delete(self, o):
        self.events.append(("delete", o["metadata"]["name"], o["metadata"]["resourceVersion"]))

    def _read(self, o):
        if self.cache is not None:
            # Handlers run outside the lock: reading the cache must not deadlock.
            key = f'{o["metadata"]["namespace"]}/{o["metadata"]["name"]}'
            self.seen_latest.append(self.cache.get(key)["metadata"]["resourceVersion"])


def test_compare_resource_versions():
    assert compare_resource_versions("9", "10") == -1
    assert compare_resource_versions("10", "10") == 0
    assert compare_resource_versions("11", "10") == 1
    with pytest.raises(InvalidResourceVersionError):
        compare_resource_versions("abc", "1")


def test_assume_newer_and_equal_ok_older_rejected():
    c = AssumeCache()
    c.informer_add(obj("a", 5))
    c.assume(obj("a", 5, spec={"x": 1}))
    assert c.get("ns/a")["spec"] == {"x": 1}
    c.assume(obj("a", 6))
    assert c.get("ns/a")["metadata"]["resourceVersion"] == "6"
    with pytest.raises(ObjectVersionError):
        c.assume(obj("a", 4))
    assert c.get("ns/a")["metadata"]["resourceVersion"] == "6"
    assert c.get_api_obj("ns/a")["metadata"]["resourceVersion"] == "5"
    with pytest.raises(NotFoundError):
        c.assume(obj("missing", 1))
    with pytest.raises(InvalidResourceVersionError):
        c.assume(obj("a", "x"))


def test_informer_older_or_equal_does_not_overwrite_assumed():
    c = AssumeCache()
    c.informer_add(obj("a", 5))
    c.assume(obj("a", 7, assumed=True))
    c.informer_update(obj("a", 5), obj("a", 6))
    assert c.get("ns/a")["assumed"] is True
    c.informer_update(obj("a", 6), obj("a", 7))  # the echo of the assumed write
    assert c.get("ns/a")["assumed"] is True
    c.informer_update(obj("a", 7), obj("a", 8))
    assert "assumed" not in c.get("ns/a")
    assert c.get_api_obj("ns/a")["metadata"]["resourceVersion"] == "8"


def test_restore_and_delete():
    c = AssumeCache()
    rec = Recorder()
    c.add_event_handler(rec)
    c.informer_add(obj("a", 1))
    c.assume(obj("a", 2))
    c.restore("ns/a")
    assert c.get("ns/a")["metadata"]["resourceVersion"] == "1"
    c.restore("ns/a")  # nothing assumed: no event
    c.restore("ns/unknown")
    c.informer_delete(DeletedFinalStateUnknown("ns/a", obj("a", 1)))
    with pytest.raises(NotFoundError):
        c.get("ns/a")
    with pytest.raises(NotFoundError):
        c.get_api_obj("ns/a")
    assert rec.events == [("add", "a", "1"), ("update", "1", "2"), ("update", "2", "1"), ("delete", "a", "1")]


def test_delete_reports_latest_object():
    c = AssumeCache()
    rec = Recorder()
    c.add_event_handler(rec)
    c.informer_add(obj("a", 1))
    c.assume(obj("a", 3))
    c.informer_delete(obj("a", 1))
    assert rec.events[-1] == ("delete", "a", "3")
    assert len(c) == 0


def test_list_with_index_uses_latest_objects():
    c = AssumeCache(indexers={"by-node": lambda o: [o.get("node", "")]})
    c.informer_add(obj("a", 1, node="n1"))
    c.informer_add(obj("b", 1, node="n2"))
    assert [o["metadata"]["name"] for o in c.list("by-node", "n1")] == ["a"]
    c.assume(obj("b", 2, node="n1"))
    assert sorted(o["metadata"]["name"] for o in c.list("by-node", "n1")) == ["a", "b"]
    assert c.list("by-node", "n2") == []
    c.restore("ns/b")
    assert [o["metadata"]["name"] for o in c.list("by-node", "n2")] == ["b"]
    assert len(c.list()) == 2


def test_handler_added_late_gets_existing_objects():
    c = AssumeCache()
    c.informer_add(obj("a", 1))
    rec = Recorder()
    c.add_event_handler(on_add=rec.on_add)
    assert rec.events == [("add", "a", "1")]


def test_events_ordered_when_handler_mutates_cache():
    c = AssumeCache()
    first = Recorder(c)
    second = Recorder(c)

    def mutate_on_add(o):
        first.on_add(o)
        # A handler causing more changes: they are delivered after this event,
        # to every handler, in order.
        c.assume(obj(o["metadata"]["name"], 2))
        c.restore(f'ns/{o["metadata"]["name"]}')

    c.add_event_handler(on_add=mutate_on_add, on_update=first.on_update, on_delete=first.on_delete)
    c.add_event_handler(second)
    c.informer_add(obj("a", 1))
    expected = [("add", "a", "1"), ("update", "1", "2"), ("update", "2", "1")]
    assert first.events == expected
    assert second.events == expected
    # The second handler sees the add after the assume already happened: it
    # reads the cache's current state, which is the restored object.
    assert second.seen_latest == ["1", "1", "1"]


def test_failing_handler_does_not_stop_others():
    c = AssumeCache()

    def boom(o):
        raise RuntimeError("boom")

    rec = Recorder()
    c.add_event_handler(on_add=boom)
    c.add_event_handler(rec)
    c.informer_add(obj("a", 1))
    assert rec.events == [("add", "a", "1")]


def test_invalid_informer_rv_ignored():
    c = AssumeCache()
    c.informer_add(obj("a", 1))
    c.informer_add(obj("a", "garbage"))
    assert c.get("ns/a")["metadata"]["resourceVersion"] == "1"


async def test_built_on_shared_informer():
    class _NoClient:
        pass

    res = type("R", (), {"qualified": "resourceclaims.resource.k8s.io", "api_version": "resource.k8s.io/v1",
                         "kind": "ResourceClaim", "group": "resource.k8s.io", "version": "v1", "plural": "resourceclaims"})()
    inf = SharedInformer(_NoClient(), res)  # type: ignore[arg-type]
    c = AssumeCache(inf, description="ResourceClaim")
    rec = Recorder()
    c.add_event_handler(rec)
    inf._started = True
    reg = inf._handlers[0]
    reg._start()
    inf.replace([obj("a", 1)], "1")
    inf.on_modified(obj("a", 2))
    inf.on_deleted(obj("a", 2))
    for _ in range(20):
        await asyncio.sleep(0)
    await reg._stop()
    assert rec.events == [("add", "a", "1"), ("update", "1", "2"), ("delete", "a", "2")]
