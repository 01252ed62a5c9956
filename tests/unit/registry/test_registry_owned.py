"""Who may keep a created object: the registry copies callers' objects unless
they are handed over (freshly decoded request bodies)."""

from __future__ import annotations

import copy

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver import codec
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CMS = resource("configmaps")


async def test_create_copies_unless_owned() -> None:
    store = MemoryStore(history=100)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    try:
        mine = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}}
        before = copy.deepcopy(mine)
        stored = await registry.create(CMS, mine, "default", field_manager="m")
        assert mine == before and stored is not mine  # the caller's object is untouched
        handed = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"k": "v"}}
        stored = await registry.create(CMS, handed, "default", field_manager="m", owned=True)
        assert stored["metadata"]["uid"] and stored["data"] == {"k": "v"}
        # the copying client keeps its caller's object; the wire server's one hands it over
        obj = {"metadata": {"name": "c"}, "data": {}}
        await InProcessClient(registry).create(CMS, obj, "default")
        assert obj == {"metadata": {"name": "c"}, "data": {}}
        assert (await registry.get(CMS, "c", "default"))["metadata"]["name"] == "c"
    finally:
        await registry.close()
        await store.close()


def test_only_json_bodies_are_fresh_trees() -> None:
    # YAML aliases can make two places of a body one object: such bodies are copied
    assert codec.fresh_tree("application/json")
    assert codec.fresh_tree("application/json; charset=utf-8")
    assert not codec.fresh_tree("application/yaml")
    assert not codec.fresh_tree("application/vnd.kubernetes.protobuf")
    assert not codec.fresh_tree("application/merge-patch+json")


PODS = resource("pods")
PVCS = resource("persistentvolumeclaims")


def _pod(name: str, image: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": image}]}}


async def test_update_copies_unless_owned_and_a_retried_owned_update_is_the_same() -> None:
    store = MemoryStore(history=100)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    try:
        for name in ("copied", "handed"):
            await registry.create(PODS, _pod(name, "img:1"), "default", field_manager="m")
        # not owned: the caller's object is left as it was
        mine = _pod("copied", "img:2")
        before = copy.deepcopy(mine)
        copied = await registry.update(PODS, mine, namespace="default", field_manager="u")
        assert mine == before

        # owned, and the first attempt loses a race with another writer: the
        # retry starts again from the handed-over object, not from what the
        # first attempt made of it
        real_update = store.update
        raced = []

        async def racing_update(key, value, expected_revision=None):
            if not raced and key.endswith("/handed"):
                raced.append(True)
                current = await store.get(key)
                # another manager takes over a field the update leaves as it is
                racer = {"manager": "racer", "operation": "Update", "apiVersion": "v1",
                         "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                         "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}
                md = current.value["metadata"]
                other = {**current.value, "metadata": {**md, "managedFields": [*md["managedFields"], racer]}}
                await real_update(key, other, expected_revision=current.mod_revision)
            return await real_update(key, value, expected_revision=expected_revision)

        store.update = racing_update  # type: ignore[method-assign]
        handed = await registry.update(PODS, _pod("handed", "img:2"), namespace="default", field_manager="u",
                                       owned=True)
        store.update = real_update  # type: ignore[method-assign]
        assert raced
        assert handed["spec"] == copied["spec"]
        assert handed["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
        strip = [{k: v for k, v in e.items() if k != "time"} for e in handed["metadata"]["managedFields"]]
        want = [{k: v for k, v in e.items() if k != "time"} for e in copied["metadata"]["managedFields"]]
        # the retry tracked fields against the racing writer's version
        assert [e for e in strip if e["manager"] == "racer"] == [
            {"manager": "racer", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]
        assert [e for e in strip if e["manager"] != "racer"] == want
    finally:
        await registry.close()
        await store.close()


async def test_binding_leaves_the_stored_version_unchanged() -> None:
    store = MemoryStore(history=100)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    try:
        await registry.create(PODS, _pod("p", "img:1"), "default", field_manager="m")
        stored = await registry.get(PODS, "p", "default")
        snapshot = copy.deepcopy(stored)
        await registry.bind("p", "default", {"target": {"name": "n1"}, "metadata": {"annotations": {"k": "v"}}})
        assert stored == snapshot  # readers of the old version see it unchanged
        bound = await registry.get(PODS, "p", "default")
        assert bound["spec"]["nodeName"] == "n1" and bound["metadata"]["annotations"] == {"k": "v"}
        assert [c["type"] for c in bound["status"]["conditions"]] == ["PodScheduled"]
        assert bound["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]
    finally:
        await registry.close()
        await store.close()


async def test_writes_leave_no_reference_cycles() -> None:
    """Creates, updates, status updates, merge patches and server-side applies
    free what they build by reference counting: the garbage collector finds
    nothing unreachable afterwards (a nested walk that calls itself is such a
    cycle, and it keeps everything it built alive until a collection)."""
    import gc

    from kubeplane.bench.workloads import pod_with_claim, pvc_wffc

    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry, copies=False)

    async def writes(i: int) -> None:
        claim = await client.create(PVCS, pvc_wffc(f"pvc-{i}", "csi"), "default")
        await client.create(PODS, pod_with_claim(f"pod-{i}", f"pvc-{i}"), "default")
        c = copy.deepcopy(claim)
        c["metadata"].setdefault("annotations", {})["volume.kubernetes.io/selected-node"] = "node-1"
        claim = await client.update(PVCS, c, field_manager="scheduler")
        c = copy.deepcopy(claim)
        c["status"] = {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}
        await client.update(PVCS, c, subresource="status", field_manager="pv-controller")
        await client.patch(PODS, f"pod-{i}", {"metadata": {"labels": {"x": str(i)}}}, "default",
                           patch_type="merge", field_manager="kubectl")
        applied = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}", "labels": {"y": "1"}}}
        await client.patch(PODS, f"pod-{i}", applied, "default", patch_type="apply", field_manager="tool",
                           force=True)

    await writes(0)  # first use fills caches and memos
    gc.collect()
    gc.disable()
    try:
        for i in range(1, 6):
            await writes(i)
        assert gc.collect() == 0
    finally:
        gc.enable()
    await registry.close()
    await store.close()
