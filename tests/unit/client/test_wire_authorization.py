"""The local wire server asks the registry's authorizer, with the attributes
the REST request for the same call would have, and answers the same 403."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
from kubeplane.auth.user import UserInfo
from kubeplane.client.wire import WireClient
from kubeplane.client.wireserver import WireServer, wire_attributes
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CMS = resource("configmaps")
PODS = resource("pods")
NODES = resource("nodes")
G = "rbac.authorization.k8s.io"
ALICE = UserInfo("alice", groups=("system:authenticated",))


def key(attrs):
    return (attrs.verb, attrs.namespace, attrs.resource, attrs.subresource, attrs.name)


def test_wire_attributes():
    cm = {"metadata": {"name": "c", "namespace": "a"}}
    assert key(wire_attributes(ALICE, "get", CMS, {"name": "c", "namespace": "a"})) == ("get", "a", "configmaps", "", "c")
    assert key(wire_attributes(ALICE, "list", CMS, {"namespace": "a"})) == ("list", "a", "configmaps", "", "")
    assert key(wire_attributes(ALICE, "watch", CMS, {"namespace": "a", "field_selector": "metadata.name=c"})) == (
        "watch", "a", "configmaps", "", "c")
    assert key(wire_attributes(ALICE, "create", CMS, {"obj": cm})) == ("create", "a", "configmaps", "", "")
    assert key(wire_attributes(ALICE, "update", CMS, {"obj": cm})) == ("update", "a", "configmaps", "", "c")
    assert key(wire_attributes(ALICE, "update", PODS, {"obj": cm, "subresource": "status"})) == (
        "update", "a", "pods", "status", "c")
    assert key(wire_attributes(ALICE, "create", PODS, {"obj": {}, "namespace": "a", "name": "p",
                                                       "subresource": "binding"})) == ("create", "a", "pods", "binding", "p")
    assert key(wire_attributes(ALICE, "patch", NODES, {"name": "n", "namespace": "x"})) == ("patch", "", "nodes", "", "n")
    assert key(wire_attributes(ALICE, "delete", CMS, {"name": "c", "namespace": "a"})) == ("delete", "a", "configmaps", "", "c")


@pytest.fixture
async def rbac_registry():
    store = MemoryStore(history=1000)
    cache = PolicyCache(store)
    await cache.start()
    reg = Registry(store, CATALOGUE, authorizer=RBACAuthorizer(cache))
    await ensure_default_namespaces(reg)
    roles, bindings = resource("roles", G), resource("rolebindings", G)
    await reg.create(roles, {"metadata": {"name": "cm-reader", "namespace": "default"}, "rules": [
        {"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["configmaps"]}]})
    await reg.create(bindings, {"metadata": {"name": "alice", "namespace": "default"},
                                "roleRef": {"apiGroup": G, "kind": "Role", "name": "cm-reader"},
                                "subjects": [{"kind": "User", "name": "alice", "apiGroup": G}]})
    await reg.create(CMS, {"metadata": {"name": "c", "namespace": "default"}})
    assert await cache.wait_for_revision(store.revision)
    yield reg
    await cache.stop()
    await reg.close()
    await store.close()


async def test_requests_over_the_wire_are_authorized(rbac_registry, tmp_path):
    # the connection authenticates as alice with a token
    srv = WireServer(rbac_registry, str(tmp_path / "api.sock"), tokens={"alice-token": ALICE})
    await srv.start()
    client = WireClient(srv.path, token="alice-token")
    try:
        got = await client.get(CMS, "c", "default")
        assert got["metadata"]["name"] == "c"
        assert len((await client.list(CMS, "default"))["items"]) == 1
        with pytest.raises(StatusError) as err:
            await client.list(CMS, "kube-system")
        assert err.value.code == 403
        assert err.value.message == ('configmaps is forbidden: User "alice" cannot list resource "configmaps" '
                                     'in API group "" in the namespace "kube-system"')
        with pytest.raises(StatusError) as err:
            await client.create(CMS, {"metadata": {"name": "d", "namespace": "default"}})
        assert err.value.code == 403
        # a watch ends with an ERROR event carrying the 403
        events = []
        async for ev in client.watch(PODS, "default"):
            events.append(ev)
            break
        assert events[0].type == "ERROR"
        assert (events[0].object["code"], events[0].object["reason"]) == (403, "Forbidden")
    finally:
        await client.close()
        await srv.stop()
