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
