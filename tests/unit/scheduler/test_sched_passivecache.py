"""The passive assume cache: every rule, upstream's scenarios, and the handler race."""

from __future__ import annotations

import asyncio
import copy
import inspect
from pathlib import Path
from typing import Any

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import DeletedFinalStateUnknown, SharedInformer
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.scheduler.plugins.volumebinding import passivecache
from kubeplane.scheduler.plugins.volumebinding.passivecache import (
    AssumeError,
    NotFoundError,
    OutOfSyncError,
    PassiveAssumeCache,
    new_pv_assume_cache,
    new_pvc_assume_cache,
)
from kubeplane.storage.memory import MemoryStore
from fake_client import FakeInformer
from helpers import eventually as wait_for


def obj(name: str, rv: str, ns: str = "ns", **annotations: str) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "annotations": dict(annotations)}}


def annotated(o: dict, **annotations: str) -> dict:
    new = copy.deepcopy(o)
    new["metadata"]["annotations"].update(annotations)
    return new


def index_by_test_annotation(o: dict) -> list[str]:
    return [o["metadata"]["annotations"].get("test", "")]


def make_cache(**kw: Any) -> tuple[FakeInformer, PassiveAssumeCache]:
    inf = FakeInformer()
    return inf, PassiveAssumeCache(inf, description="v1.Test", resource="tests", **kw)


def test_source_never_parses_resource_versions_as_numbers() -> None:
    src = Path(inspect.getfile(passivecache)).read_text()
    assert "int(" not in src


def test_basic_get_list_update_delete() -> None:
    inf, cache = make_cache()
    with pytest.raises(NotFoundError) as exc:
        cache.get("ns/nothere")
    assert exc.value.status_error.code == 404
    objs = [obj(f"test-{i}", "1") for i in range(10)]
    for o in objs:
        inf.add(o)
    listed = cache.list()
    assert len(listed) == 10 and all(any(x is o for o in objs) for x in listed)
    # No copies: the very dicts of the indexer come back.
    assert cache.get("ns/test-3") is objs[3]
    newer = obj("test-3", "1", new="yes")
    inf.add(newer)
    assert cache.get("ns/test-3") is newer and any(x is newer for x in cache.list())
    inf.delete(objs[7])
    assert "ns/test-7" not in {f"ns/{x['metadata']['name']}" for x in cache.list()}
    assert len(cache) == 0


def test_list_by_index_evaluates_on_indexer_objects() -> None:
    inf, cache = make_cache(indexers={"testIndex": index_by_test_annotation})
    for i in range(10):
        inf.add(obj(f"a-{i}", "1", test="test1"))
        inf.add(obj(f"b-{i}", "1", test="test2"))
    assert {o["metadata"]["name"] for o in cache.list("testIndex", "test1")} == {f"a-{i}" for i in range(10)}
    inf.add(obj("a-3", "2", test="test1"))
    inf.delete(obj("a-7", "1", test="test1"))
    names1 = {o["metadata"]["name"] for o in cache.by_index("testIndex", "test1")}
    assert names1 == {f"a-{i}" for i in range(10) if i != 7}
    assert len(cache.list("testIndex", "test2")) == 10
    # An assumption that would change index membership does not move the object.
    cache.assume(obj("b-0", "1", test="test1", mark="assumed"))
    assert "b-0" not in {o["metadata"]["name"] for o in cache.list("testIndex", "test1")}
    b0 = [o for o in cache.list("testIndex", "test2") if o["metadata"]["name"] == "b-0"][0]
    assert b0["metadata"]["annotations"]["mark"] == "assumed"


@pytest.mark.parametrize(
    "stored, new, ok",
    [
        (obj("pvc1", "5"), obj("pvc1", "5", x="y"), True),
        (obj("pvc1", "5"), obj("pvc1", "6", x="y"), False),
        (obj("pvc2", "5"), obj("pvc1", "5", x="y"), False),
        (obj("pvc1", "5"), obj("pvc1", "4", x="y"), False),
        (obj("pvc1", "5"), obj("pvc1", "a", x="y"), False),
        (obj("pvc1", "a"), obj("pvc1", "5", x="y"), False),
    ],
    ids=["same-rv", "newer", "missing", "older", "non-numeric-new", "non-numeric-stored"],
)
def test_assume(stored: dict, new: dict, ok: bool) -> None:
    inf, cache = make_cache()
    inf.add(stored)
    if ok:
        cache.assume(new)
        assert cache.get("ns/pvc1") is new
        assert cache.get_api_obj("ns/pvc1") is stored
        assert cache.is_assumed("ns/pvc1")
    else:
        with pytest.raises(AssumeError) as exc:
            cache.assume(new)
        if stored["metadata"]["name"] != new["metadata"]["name"]:
            assert isinstance(exc.value, NotFoundError) and "not found" in str(exc.value)
        else:
            assert isinstance(exc.value, OutOfSyncError) and "out of sync" in str(exc.value)
            with pytest.raises(AssumeError):
                cache.get("ns/pvc2")
            assert cache.get("ns/pvc1") is stored
        assert len(cache) == 0


def test_restore_rules() -> None:
    inf, cache = make_cache()
    cache.restore(obj("unknown", ""))  # harmless no-op
    old = obj("pvc1", "5")
    inf.add(old)
    cache.restore(old)
    assert cache.get("ns/pvc1") is old
    new = annotated(old, sel="n1")
    cache.assume(new)
    assert cache.get("ns/pvc1") is new
    # Restoring with a different version leaves the assumption alone.
    cache.restore(obj("pvc1", "4"))
    assert cache.get("ns/pvc1") is new
    cache.restore(new)
    assert cache.get("ns/pvc1") is old and len(cache) == 0
    # Key form needs an explicit version.
    cache.assume(new)
    with pytest.raises(ValueError):
        cache.restore("ns/pvc1")
    cache.restore("ns/pvc1", resource_version="5")
    assert cache.get("ns/pvc1") is old


def test_get_after_informer_update_and_restore_after_update() -> None:
    inf, cache = make_cache()
    v5 = obj("pv", "5")
    inf.add(v5, notify=False)
    assumed = annotated(v5, claim="a")
    cache.assume(assumed)
    # The indexer moves on without the handler having run yet: reads see v6.
    v6 = obj("pv", "6", other="update")
    inf.add(v6, notify=False)
    assert cache.get("ns/pv") is v6
    assert cache.list() == [v6]
    assert not cache.is_assumed("ns/pv")
    # restore() of the old assumption after the update is fine and drops it.
    cache.restore(assumed)
    assert cache.get("ns/pv") is v6 and len(cache) == 0


def test_concurrent_assume_late_restore_keeps_newer_assumption() -> None:
    inf, cache = make_cache()
    inf.add(obj("pvc", "5"))
    a = obj("pvc", "5", pod="A")
    cache.assume(a)
    assert cache.get("ns/pvc") is a
    inf.add(obj("pvc", "7"))  # expires A
    assert len(cache) == 0
    b = obj("pvc", "7", pod="B")
    cache.assume(b)
    cache.restore(a)  # pod A's late cleanup
    assert cache.get("ns/pvc") is b


def test_resync_keeps_assumed_object() -> None:
    inf, cache = make_cache()
    v1 = obj("pvc", "1")
    inf.add(v1)
    assumed = annotated(v1, **{"volume.kubernetes.io/selected-node": "node-1"})
    cache.assume(assumed)
    inf.add(copy.deepcopy(v1))  # resync: same version delivered again
    assert cache.get("ns/pvc") is assumed and len(cache) == 1


def test_update_drops_assumption() -> None:
    inf, cache = make_cache()
    inf.add(obj("pvc", "1"))
    cache.assume(obj("pvc", "1", a="b"))
    v2 = obj("pvc", "2")
    inf.add(v2)
    assert len(cache) == 0 and cache.get("ns/pvc") is v2


def test_delete_drops_assumption_including_tombstones() -> None:
    inf, cache = make_cache()
    v1 = obj("pvc", "1")
    inf.add(v1)
    cache.assume(annotated(v1, a="b"))
    inf.delete(v1)
    assert len(cache) == 0
    with pytest.raises(NotFoundError):
        cache.get("ns/pvc")
    # A relist-detected deletion arrives as a tombstone.
    v2 = obj("other", "3")
    inf.add(v2)
    cache.assume(annotated(v2, a="b"))
    inf.indexer.delete(v2)
    for _, _, on_delete in inf.handlers:
        on_delete(DeletedFinalStateUnknown("ns/other", v2))
    assert len(cache) == 0


def test_delayed_stale_events_judged_against_indexer() -> None:
    inf, cache = make_cache()
    v1 = obj("pvc", "1")
    v2 = obj("pvc", "2")
    inf.add(v2, notify=False)  # the indexer already holds v2, no event delivered yet
    assumed = annotated(v2, a="b")
    cache.assume(assumed)
    add, _, delete = inf.handlers[0]
    add(v1)
    delete(v1)
    add(v2)
    assert cache.get("ns/pvc") is assumed and len(cache) == 1


def test_shared_informer_index_registered_once() -> None:
    inf = FakeInformer()
    pvs1 = new_pv_assume_cache(inf)
    pvs2 = new_pv_assume_cache(inf)  # second profile on the same informer
    pv = {"metadata": {"name": "pv1", "resourceVersion": "3"}, "spec": {"storageClassName": "fast"}}
    inf.add(pv)
    assert pvs1.list_pvs("fast") == [pv] and pvs2.list_pvs("fast") == [pv] and pvs1.list_pvs("") == []
    pvcs = new_pvc_assume_cache(inf)
    with pytest.raises(NotFoundError) as exc:
        pvcs.get("ns/none")
    assert 'persistentvolumeclaims "none" not found' in exc.value.status_error.message


def test_handler_order_does_not_matter_fake() -> None:
    """The queue's handler runs before the cache's: it still reads the new object."""
    inf = FakeInformer()
    seen: list[dict] = []
    cache_box: list[PassiveAssumeCache] = []
    # Queue handler registered first, so it is called first.
    inf.add_event_handler(on_add=lambda o: seen.append(cache_box[0].get("ns/pv")),
                          on_update=lambda old, new: seen.append(cache_box[0].get("ns/pv")),
                          on_delete=lambda o: None)
    cache = PassiveAssumeCache(inf)
    cache_box.append(cache)
    v1 = obj("pv", "1")
    inf.add(v1)
    cache.assume(annotated(v1, claim="x"))
    v2 = obj("pv", "2", bound="yes")
    inf.add(v2)
    assert seen[-1] is v2


# ---------------------------------------------------------------- real informer race

PVS = resource("persistentvolumes")


def make_pv(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "hostPath": {"path": "/data/pv1"}, "storageClassName": "local"}}


async def test_race_delayed_queue_handler_reads_newest_object() -> None:
    store = MemoryStore(history=100)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    informer = SharedInformer(client, PVS)
    cache = new_pv_assume_cache(informer)
    gate = asyncio.Event()
    observed: list[tuple[str, str]] = []

    async def queue_on_update(old: dict, new: dict) -> None:
        await gate.wait()  # this handler is delayed behind the cache's
        got = cache.get(new["metadata"]["name"])
        observed.append((new["metadata"]["resourceVersion"], got["metadata"]["resourceVersion"]))

    informer.add_event_handler(on_update=queue_on_update)
    informer.start()
    try:
        assert await informer.wait_for_sync(1)
        created = await client.create(PVS, make_pv("pv1"))
        await wait_for(lambda: "pv1" in informer.indexer)
        stale = copy.deepcopy(informer.indexer.get_by_key("pv1"))
        stale["spec"]["claimRef"] = {"namespace": "default", "name": "c1", "uid": "u1"}
        cache.assume(stale)
        assert cache.get("pv1")["spec"]["claimRef"]["name"] == "c1"
        # Someone else binds the PV through the API.
        upd = copy.deepcopy(created)
        upd["spec"]["claimRef"] = {"namespace": "default", "name": "other", "uid": "u2"}
        written = await client.update(PVS, upd)
        await wait_for(lambda: cache.get_api_obj("pv1")["metadata"]["resourceVersion"]
                       == written["metadata"]["resourceVersion"])
        # Even before the queue handler runs, the assumption is superseded.
        assert cache.get("pv1")["spec"]["claimRef"]["name"] == "other"
        gate.set()
        await wait_for(lambda: bool(observed))
        event_rv, read_rv = observed[0]
        assert event_rv == read_rv == written["metadata"]["resourceVersion"]
        await wait_for(lambda: len(cache) == 0)
    finally:
        await informer.stop()
        await client.close()
        await registry.close()
        await store.close()
