"""The RBAC authorizer: upstream's rule matching, subjects, the privileged
group, reasons, and a policy cache fed by the store's watch."""

from __future__ import annotations

import pytest

from kubeplane.auth.authorizer import Attributes, Decision
from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer, Rule, uncovered
from kubeplane.auth.user import UserInfo
from kubeplane.storage.memory import MemoryStore

G = "rbac.authorization.k8s.io"
ALICE = UserInfo("alice", groups=("devs", "system:authenticated"))


def res_attrs(verb, resource, *, group="", ns="", name="", sub="", user=ALICE):
    return Attributes(user, verb, True, ns, group, "v1", resource, sub, name)


def path_attrs(verb, path, user=ALICE):
    return Attributes(user, verb, resource_request=False, path=path)


@pytest.mark.parametrize("rule, attrs, allowed", [
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, res_attrs("get", "pods"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, res_attrs("list", "pods"), False),
    ({"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}, res_attrs("delete", "pods"), True),
    ({"verbs": ["get"], "apiGroups": ["apps"], "resources": ["pods"]}, res_attrs("get", "pods"), False),
    ({"verbs": ["get"], "apiGroups": ["*"], "resources": ["deployments"]},
     res_attrs("get", "deployments", group="apps"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["*"]}, res_attrs("get", "pods", sub="log"), True),
    # a subresource is named with its resource; the resource alone does not grant it
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, res_attrs("get", "pods", sub="log"), False),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}, res_attrs("get", "pods", sub="log"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}, res_attrs("get", "pods"), False),
    # "*/scale": the scale subresource of every resource
    ({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*/scale"]},
     res_attrs("get", "deployments", group="apps", sub="scale"), True),
    ({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*/scale"]},
     res_attrs("get", "deployments", group="apps", sub="status"), False),
    # upstream has no "resource/*" wildcard: "pods/*" names only itself
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/*"]}, res_attrs("get", "pods", sub="log"), False),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     res_attrs("get", "pods", name="a"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     res_attrs("get", "pods", name="b"), False),
    ({"verbs": ["list"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     res_attrs("list", "pods"), False),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}, path_attrs("get", "/healthz"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}, path_attrs("get", "/healthz/etcd"), False),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz/*"]}, path_attrs("get", "/healthz/etcd"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["/apis*"]}, path_attrs("get", "/apis/apps"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["*"]}, path_attrs("get", "/anything"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}, path_attrs("post", "/healthz"), False),
    # a resource rule never grants a path, nor a path rule a resource
    ({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]}, path_attrs("get", "/healthz"), False),
    ({"verbs": ["get"], "nonResourceURLs": ["*"]}, res_attrs("get", "pods"), False),
])
def test_rule_matching(rule, attrs, allowed):
    assert Rule(rule).allows(attrs) is allowed


async def _policy(objs):
    store = MemoryStore(history=100)
    for kind, obj in objs:
        md = obj["metadata"]
        ns = md.get("namespace")
        key = f"/registry/{G}/{kind}/{ns}/{md['name']}" if ns else f"/registry/{G}/{kind}/{md['name']}"
        await store.create(key, obj)
    cache = PolicyCache(store)
    await cache.start()
    return store, cache, RBACAuthorizer(cache)


def cluster_role(name, rules):
    return "clusterroles", {"metadata": {"name": name}, "rules": rules}


def role(ns, name, rules):
    return "roles", {"metadata": {"name": name, "namespace": ns}, "rules": rules}


def binding(ns, name, kind, ref, subjects):
    plural = "rolebindings" if ns else "clusterrolebindings"
    md = {"name": name, **({"namespace": ns} if ns else {})}
    return plural, {"metadata": md, "roleRef": {"apiGroup": G, "kind": kind, "name": ref}, "subjects": subjects}


READ_PODS = [{"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods"]}]


async def test_bindings_subjects_and_scopes():
    store, cache, authz = await _policy([
        cluster_role("pod-reader", READ_PODS),
        role("a", "cm-writer", [{"verbs": ["create"], "apiGroups": [""], "resources": ["configmaps"]}]),
        binding("a", "alice-reads", "ClusterRole", "pod-reader", [{"kind": "User", "name": "alice", "apiGroup": G}]),
        binding("a", "devs-write", "Role", "cm-writer", [{"kind": "Group", "name": "devs", "apiGroup": G}]),
        binding("", "sa-reads", "ClusterRole", "pod-reader",
                [{"kind": "ServiceAccount", "name": "robot", "namespace": "b"}]),
    ])
    try:
        # a RoleBinding to a ClusterRole grants its rules in its namespace only
        assert authz.authorize(res_attrs("list", "pods", ns="a"))[0] is Decision.ALLOW
        assert authz.authorize(res_attrs("list", "pods", ns="b"))[0] is Decision.NO_OPINION
        assert authz.authorize(res_attrs("list", "pods"))[0] is Decision.NO_OPINION
        # through a group
        assert authz.authorize(res_attrs("create", "configmaps", ns="a"))[0] is Decision.ALLOW
        bob = UserInfo("bob")
        assert authz.authorize(res_attrs("create", "configmaps", ns="a", user=bob))[0] is Decision.NO_OPINION
        # a ServiceAccount subject names system:serviceaccount:<ns>:<name>, cluster-wide here
        robot = UserInfo("system:serviceaccount:b:robot", groups=("system:serviceaccounts",))
        decision, reason = authz.authorize(res_attrs("get", "pods", ns="z", name="p", user=robot))
        assert decision is Decision.ALLOW
        assert reason == ('RBAC: allowed by ClusterRoleBinding "sa-reads" of ClusterRole "pod-reader" '
                          'to ServiceAccount "robot/b"')
        assert authz.authorize(res_attrs("list", "pods", ns="a"))[1] == (
            'RBAC: allowed by RoleBinding "alice-reads/a" of ClusterRole "pod-reader" to User "alice"')
        # system:masters needs no binding at all
        admin = UserInfo("root", groups=("system:masters",))
        assert authz.authorize(res_attrs("delete", "nodes", user=admin)) == (Decision.ALLOW, "")
    finally:
        await cache.stop()
        await store.close()


async def test_missing_roles_are_the_reason():
    store, cache, authz = await _policy([
        binding("", "x", "ClusterRole", "gone", [{"kind": "User", "name": "alice", "apiGroup": G}]),
        binding("a", "y", "Role", "absent", [{"kind": "User", "name": "alice", "apiGroup": G}]),
    ])
    try:
        assert authz.authorize(res_attrs("get", "pods")) == (
            Decision.NO_OPINION, 'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found')
        assert authz.authorize(res_attrs("get", "pods", ns="a")) == (
            Decision.NO_OPINION, 'RBAC: [clusterrole.rbac.authorization.k8s.io "gone" not found, '
                                 'role.rbac.authorization.k8s.io "absent" not found]')
        # no binding for this user: no reason
        assert authz.authorize(res_attrs("get", "pods", user=UserInfo("bob"))) == (Decision.NO_OPINION, "")
    finally:
        await cache.stop()
        await store.close()


async def test_rbac_alone_grants_nodes_nothing_unbound():
    """As upstream: the system:node role is bound to no one; nodes get their
    rights from the Node authorizer in front of RBAC."""
    store, cache, authz = await _policy([
        cluster_role("system:node", [{"verbs": ["patch"], "apiGroups": [""], "resources": ["nodes/status"]}]),
    ])
    try:
        node = UserInfo("system:node:n1", groups=("system:nodes", "system:authenticated"))
        assert authz.authorize(res_attrs("patch", "nodes", name="n1", sub="status", user=node))[0] \
            is Decision.NO_OPINION
    finally:
        await cache.stop()
        await store.close()


async def test_the_cache_follows_the_store():
    store, cache, authz = await _policy([cluster_role("pod-reader", READ_PODS)])
    try:
        attrs = res_attrs("list", "pods", ns="a")
        assert authz.authorize(attrs)[0] is Decision.NO_OPINION  # cached as a decision too
        _, obj = binding("a", "b", "ClusterRole", "pod-reader", [{"kind": "User", "name": "alice", "apiGroup": G}])
        kv = await store.create(f"/registry/{G}/rolebindings/a/b", obj)
        assert await cache.wait_for_revision(kv.mod_revision)
        assert authz.authorize(attrs)[0] is Decision.ALLOW
        # a change of the role's rules reaches bound users
        kv = await store.update(f"/registry/{G}/clusterroles/pod-reader",
                                {"metadata": {"name": "pod-reader"}, "rules": []})
        assert await cache.wait_for_revision(kv.mod_revision)
        assert authz.authorize(attrs)[0] is Decision.NO_OPINION
        kv = await store.delete(f"/registry/{G}/rolebindings/a/b")
        assert await cache.wait_for_revision(kv.mod_revision)
        assert cache.bindings == {}
    finally:
        await cache.stop()
        await store.close()


def test_covers_breaks_rules_down():
    owner = [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "*/status"]},
             {"verbs": ["get"], "nonResourceURLs": ["/healthz/*"]}]
    assert uncovered(owner, [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods", "nodes/status"]}]) == []
    assert uncovered(owner, [{"verbs": ["get", "delete"], "apiGroups": [""], "resources": ["pods"]}]) == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    assert uncovered(owner, [{"verbs": ["get"], "nonResourceURLs": ["/healthz/etcd", "/metrics"]}]) == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # a rule limited to names does not cover one that is not
    named = [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]}]
    assert uncovered(named, [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]) != []
    assert uncovered(named, [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]}]) == []


async def test_decide_from_request_info_follows_the_policy():
    from kubeplane.auth.requestinfo import request_info

    store, cache, authz = await _policy([cluster_role("pod-reader", READ_PODS)])
    try:
        info = request_info("GET", "/api/v1/namespaces/a/pods", {})
        assert authz.decide(ALICE, info) == (Decision.NO_OPINION, "")
        _, obj = binding("a", "b", "ClusterRole", "pod-reader", [{"kind": "User", "name": "alice", "apiGroup": G}])
        kv = await store.create(f"/registry/{G}/rolebindings/a/b", obj)
        assert await cache.wait_for_revision(kv.mod_revision)
        assert authz.decide(ALICE, info)[0] is Decision.ALLOW
        assert authz.decide(ALICE, request_info("DELETE", "/api/v1/namespaces/a/pods/x", {}))[0] \
            is Decision.NO_OPINION
        assert authz.decide(UserInfo("bob"), info)[0] is Decision.NO_OPINION
        assert authz.decide(UserInfo("root", groups=("system:masters",)), info) == (Decision.ALLOW, "")
    finally:
        await cache.stop()
        await store.close()
