"""The bootstrap policy lets the controller manager's garbage collector and
namespace controller act on any resource, custom resources included (as
upstream's system:controller:generic-garbage-collector and
system:controller:namespace-controller roles: ``*`` on ``*``)."""

from __future__ import annotations

import pytest

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.bootstrappolicy import policy, reconcile
from kubeplane.auth.authorizer import Attributes, Decision
from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
from kubeplane.auth.user import UserInfo
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

KCM = UserInfo("system:kube-controller-manager", groups=("system:authenticated",))


@pytest.fixture()
async def authorizer():
    store = MemoryStore(history=1000)
    registry = Registry(store, CATALOGUE)
    cache = PolicyCache(store)
    await cache.start()
    await reconcile(registry)
    assert await cache.wait_for_revision(store.revision)
    yield RBACAuthorizer(cache)
    await cache.stop()
    await registry.close()
    await store.close()


def _rules(name):
    roles, _ = policy()
    (role,) = [r for r in roles if r["metadata"]["name"] == name]
    return role["rules"]


def test_the_collector_and_namespace_roles_cover_every_resource():
    gc = _rules("system:controller:generic-garbage-collector")
    assert any(r["apiGroups"] == ["*"] and r["resources"] == ["*"]
               and {"get", "list", "watch", "patch", "update", "delete"} <= set(r["verbs"]) for r in gc)
    ns = _rules("system:controller:namespace-controller")
    assert any(r["apiGroups"] == ["*"] and r["resources"] == ["*"]
               and {"get", "list", "watch", "delete", "deletecollection"} <= set(r["verbs"]) for r in ns)


@pytest.mark.parametrize("verb", ["get", "list", "watch", "patch", "update", "delete", "deletecollection"])
async def test_the_controller_manager_may_handle_custom_resources(authorizer, verb):
    for ns in ("default", "team-a"):
        attrs = Attributes(KCM, verb, True, ns, "gc.example.com", "v1", "gadgets")
        assert authorizer.authorize(attrs)[0] is Decision.ALLOW, (verb, ns)
    # cluster-scoped custom resources too
    assert authorizer.authorize(Attributes(KCM, verb, True, "", "example.org", "v1alpha1", "clusterthings"))[0] \
        is Decision.ALLOW
    # and it reads discovery to find them
    for path in ("/api", "/apis"):
        assert authorizer.authorize(Attributes(KCM, "get", False, path=path))[0] is Decision.ALLOW


async def test_others_may_not(authorizer):
    alice = UserInfo("alice", groups=("system:authenticated",))
    assert authorizer.authorize(Attributes(alice, "delete", True, "default", "gc.example.com", "v1",
                                           "gadgets"))[0] is not Decision.ALLOW
