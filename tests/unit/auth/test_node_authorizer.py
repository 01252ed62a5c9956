"""The Node authorizer: the graph of what pods bound to a node use, the
subdivided kinds with upstream's reasons, the static node rules, and the
union with RBAC."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.apiserver.bootstrappolicy import node_rules
from kubeplane.auth.authorizer import Attributes, Decision
from kubeplane.auth.node import NodeAuthorizer, NodeGraph, UnionAuthorizer, node_identity, pod_references
from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
from kubeplane.auth.user import UserInfo
from kubeplane.storage.memory import MemoryStore

N1 = UserInfo("system:node:n1", groups=("system:nodes", "system:authenticated"))
N2 = UserInfo("system:node:n2", groups=("system:nodes", "system:authenticated"))
ALICE = UserInfo("alice", groups=("system:authenticated",))


def attrs(user, verb, resource, *, ns="", name="", sub="", group="", selector=""):
    return Attributes(user, verb, True, ns, group, "v1", resource, sub, name, field_selector=selector)


def pod(name, node, ns="a", **spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], **spec}}


def test_node_identity():
    assert node_identity(N1) == ("n1", True)
    assert node_identity(UserInfo("system:node:n1", groups=("system:authenticated",))) == ("", False)
    assert node_identity(UserInfo("system:node:", groups=("system:nodes",))) == ("", True)
    assert node_identity(ALICE) == ("", False)


def test_pod_references_cover_upstreams_visitors():
    p = pod("p", "n1", serviceAccountName="sa", imagePullSecrets=[{"name": "pull"}],
            containers=[{"name": "c", "envFrom": [{"secretRef": {"name": "es"}}, {"configMapRef": {"name": "ec"}}],
                         "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "ks", "key": "k"}}},
                                 {"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "kc", "key": "k"}}}]}],
            initContainers=[{"name": "i", "envFrom": [{"secretRef": {"name": "is"}}]}],
            volumes=[{"name": "v1", "secret": {"secretName": "vs"}}, {"name": "v2", "configMap": {"name": "vc"}},
                     {"name": "v3", "projected": {"sources": [{"secret": {"name": "ps"}},
                                                              {"configMap": {"name": "pc"}}]}},
                     {"name": "v4", "persistentVolumeClaim": {"claimName": "claim"}},
                     {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                     {"name": "v5", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csis"}}}],
            resourceClaims=[{"name": "gpu", "resourceClaimName": "rc"}])
    assert pod_references(p) == {
        ("secret", "pull"), ("secret", "es"), ("configmap", "ec"), ("secret", "ks"), ("configmap", "kc"),
        ("secret", "is"), ("secret", "vs"), ("configmap", "vc"), ("secret", "ps"), ("configmap", "pc"),
        ("pvc", "claim"), ("pvc", "p-eph"), ("secret", "csis"), ("serviceAccount", "sa"), ("resourceclaim", "rc")}


@pytest.fixture
async def graph():
    store = MemoryStore()
    g = NodeGraph(store)
    await g.start()
    try:
        yield store, g
    finally:
        await g.stop()
        await store.close()


async def _put(store, g, key, obj):
    kv = await store.get(key)
    if kv is None:
        await store.create(key, obj)
    else:
        await store.update(key, obj)
    await _settle(store, g)


async def _settle(store, g):
    for _ in range(500):
        if g.revision >= store.revision:
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the graph did not catch up")


async def test_secrets_and_configmaps_of_the_nodes_pods_only(graph):
    store, g = graph
    authz = NodeAuthorizer(g, node_rules())
    p = pod("web", "n1", volumes=[{"name": "s", "secret": {"secretName": "mine"}}],
            containers=[{"name": "c", "envFrom": [{"configMapRef": {"name": "conf"}}]}])
    await _put(store, g, "/registry/core/pods/a/web", p)
    assert authz.authorize(attrs(N1, "get", "secrets", ns="a", name="mine")) == (Decision.ALLOW, "")
    assert authz.authorize(attrs(N1, "watch", "secrets", ns="a", name="mine")) == (Decision.ALLOW, "")
    assert authz.authorize(attrs(N1, "get", "configmaps", ns="a", name="conf")) == (Decision.ALLOW, "")
    assert authz.authorize(attrs(N1, "get", "secrets", ns="a", name="other")) == (
        Decision.NO_OPINION, "no relationship found between node 'n1' and this object")
    assert authz.authorize(attrs(N2, "get", "secrets", ns="a", name="mine"))[0] is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "get", "secrets", ns="b", name="mine"))[0] is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "list", "secrets", ns="a")) == (Decision.NO_OPINION, "No Object name found")
    assert authz.authorize(attrs(N1, "update", "secrets", ns="a", name="mine")) == (
        Decision.NO_OPINION, "can only read resources of this type")
    assert authz.authorize(attrs(N1, "get", "secrets", name="mine")) == (
        Decision.NO_OPINION, "can only read namespaced object of this type")
    # the pod moves away (deleted): the secret with it
    await store.delete("/registry/core/pods/a/web")
    await _settle(store, g)
    assert authz.authorize(attrs(N1, "get", "secrets", ns="a", name="mine"))[0] is Decision.NO_OPINION


async def test_a_pod_not_bound_yet_grants_nothing_then_binding_does(graph):
    store, g = graph
    authz = NodeAuthorizer(g, node_rules())
    p = pod("web", "", volumes=[{"name": "s", "secret": {"secretName": "mine"}}])
    await _put(store, g, "/registry/core/pods/a/web", p)
    assert authz.authorize(attrs(N1, "get", "secrets", ns="a", name="mine"))[0] is Decision.NO_OPINION
    p["spec"]["nodeName"] = "n1"
    await _put(store, g, "/registry/core/pods/a/web", p)
    assert authz.authorize(attrs(N1, "get", "secrets", ns="a", name="mine"))[0] is Decision.ALLOW


async def test_two_pods_share_a_secret(graph):
    store, g = graph
    authz = NodeAuthorizer(g)
    vol = [{"name": "s", "secret": {"secretName": "shared"}}]
    await _put(store, g, "/registry/core/pods/a/p1", pod("p1", "n1", volumes=vol))
    await _put(store, g, "/registry/core/pods/a/p2", pod("p2", "n1", volumes=vol))
    await store.delete("/registry/core/pods/a/p1")
    await _settle(store, g)
    assert authz.authorize(attrs(N1, "get", "secrets", ns="a", name="shared"))[0] is Decision.ALLOW


async def test_claims_volumes_and_their_secrets(graph):
    store, g = graph
    authz = NodeAuthorizer(g)
    await _put(store, g, "/registry/core/pods/a/db", pod("db", "n1", volumes=[
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]))
    await _put(store, g, "/registry/core/persistentvolumeclaims/a/data",
               {"metadata": {"name": "data", "namespace": "a"}, "spec": {"volumeName": "pv1"}})
    await _put(store, g, "/registry/core/persistentvolumes/pv1", {
        "metadata": {"name": "pv1"}, "spec": {"claimRef": {"namespace": "a", "name": "data"},
                                              "csi": {"driver": "d", "nodeStageSecretRef": {"name": "creds",
                                                                                           "namespace": "ops"}}}})
    assert authz.authorize(attrs(N1, "get", "persistentvolumeclaims", ns="a", name="data"))[0] is Decision.ALLOW
    assert authz.authorize(attrs(N1, "get", "persistentvolumes", name="pv1"))[0] is Decision.ALLOW
    assert authz.authorize(attrs(N1, "get", "secrets", ns="ops", name="creds"))[0] is Decision.ALLOW
    assert authz.authorize(attrs(N2, "get", "persistentvolumes", name="pv1"))[0] is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "list", "persistentvolumes")) == (
        Decision.NO_OPINION, "can only get individual resources of this type")
    assert authz.authorize(attrs(N1, "update", "persistentvolumeclaims", ns="a", name="data", sub="status"))[0] \
        is Decision.ALLOW


async def test_tokens_only_for_the_service_accounts_of_its_pods(graph):
    store, g = graph
    authz = NodeAuthorizer(g)
    await _put(store, g, "/registry/core/pods/a/web", pod("web", "n1", serviceAccountName="runner"))
    assert authz.authorize(attrs(N1, "create", "serviceaccounts", ns="a", name="runner", sub="token"))[0] \
        is Decision.ALLOW
    assert authz.authorize(attrs(N1, "create", "serviceaccounts", ns="a", name="admin", sub="token"))[0] \
        is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "create", "serviceaccounts", ns="a", name="runner")) == (
        Decision.NO_OPINION, "can only create token subresource of serviceaccount")


async def test_its_node_pods_and_lease(graph):
    store, g = graph
    authz = NodeAuthorizer(g, node_rules())
    await _put(store, g, "/registry/core/pods/a/web", pod("web", "n1"))
    ok = Decision.ALLOW
    assert authz.authorize(attrs(N1, "get", "nodes", name="n1"))[0] is ok
    assert authz.authorize(attrs(N1, "get", "nodes", name="n2")) == (
        Decision.NO_OPINION, "node 'n1' cannot read 'n2', only its own Node object")
    assert authz.authorize(attrs(N1, "list", "nodes")) == (
        Decision.NO_OPINION, "node 'n1' cannot read all nodes, only its own Node object")
    assert authz.authorize(attrs(N1, "create", "nodes"))[0] is ok
    assert authz.authorize(attrs(N1, "patch", "nodes", name="n1", sub="status"))[0] is ok
    assert authz.authorize(attrs(N1, "list", "pods", selector="spec.nodeName=n1"))[0] is ok
    assert authz.authorize(attrs(N1, "list", "pods", selector="status.phase!=Failed,spec.nodeName==n1"))[0] is ok
    assert authz.authorize(attrs(N1, "list", "pods", selector="spec.nodeName!=n1"))[0] is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "list", "pods", selector="spec.nodeName=n1,x=\\q"))[0] is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "watch", "pods", selector="spec.nodeName=n2")) == (
        Decision.NO_OPINION, "can only list/watch pods with spec.nodeName field selector")
    assert authz.authorize(attrs(N1, "list", "pods")) == (
        Decision.NO_OPINION, "can only list/watch pods with spec.nodeName field selector")
    assert authz.authorize(attrs(N1, "get", "pods", ns="a", name="web"))[0] is ok
    assert authz.authorize(attrs(N2, "get", "pods", ns="a", name="web"))[0] is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "patch", "pods", ns="a", name="web", sub="status"))[0] is ok
    assert authz.authorize(attrs(N1, "delete", "pods", ns="a", name="web"))[0] is ok
    assert authz.authorize(attrs(N1, "update", "pods", ns="a", name="web"))[0] is Decision.NO_OPINION
    lease = dict(group="coordination.k8s.io")
    assert authz.authorize(attrs(N1, "update", "leases", ns="kube-node-lease", name="n1", **lease))[0] is ok
    assert authz.authorize(attrs(N1, "update", "leases", ns="kube-node-lease", name="n2", **lease)) == (
        Decision.NO_OPINION, "can only access node lease with the same name as the requesting node")
    assert authz.authorize(attrs(N1, "create", "leases", ns="default", **lease)) == (
        Decision.NO_OPINION, 'can only access leases in the "kube-node-lease" system namespace')
    # the static rules: events, services, CSRs; not deployments
    assert authz.authorize(attrs(N1, "create", "events", ns="a"))[0] is ok
    assert authz.authorize(attrs(N1, "watch", "services"))[0] is ok
    assert authz.authorize(attrs(N1, "create", "certificatesigningrequests", group="certificates.k8s.io"))[0] is ok
    assert authz.authorize(attrs(N1, "create", "deployments", ns="a", group="apps"))[0] is Decision.NO_OPINION
    # no opinion on anyone else; an unidentifiable node says why
    assert authz.authorize(attrs(ALICE, "get", "secrets", ns="a", name="x")) == (Decision.NO_OPINION, "")
    nameless = UserInfo("system:node:", groups=("system:nodes",))
    assert authz.authorize(attrs(nameless, "get", "nodes", name="x")) == (
        Decision.NO_OPINION, 'unknown node for user "system:node:"')


async def test_resource_slices_of_its_own(graph):
    store, g = graph
    authz = NodeAuthorizer(g)
    await _put(store, g, "/registry/resource.k8s.io/resourceslices/s1",
               {"metadata": {"name": "s1"}, "spec": {"nodeName": "n1", "driver": "d"}})
    rs = dict(group="resource.k8s.io")
    assert authz.authorize(attrs(N1, "update", "resourceslices", name="s1", **rs))[0] is Decision.ALLOW
    assert authz.authorize(attrs(N2, "update", "resourceslices", name="s1", **rs))[0] is Decision.NO_OPINION
    assert authz.authorize(attrs(N1, "list", "resourceslices", selector="spec.nodeName=n1", **rs))[0] \
        is Decision.ALLOW


async def test_the_graph_starts_from_what_is_stored():
    store = MemoryStore()
    await store.create("/registry/core/pods/a/web", pod("web", "n1", volumes=[
        {"name": "s", "secret": {"secretName": "mine"}}]))
    g = NodeGraph(store)
    await g.start()
    try:
        assert g.uses("n1", "secret", "a", "mine") and not g.uses("n2", "secret", "a", "mine")
    finally:
        await g.stop()
        await store.close()


async def test_union_node_first_then_rbac(graph):
    store, g = graph
    cache = PolicyCache(store)
    await cache.start()
    try:
        union = UnionAuthorizer(NodeAuthorizer(g, node_rules()), RBACAuthorizer(cache))
        await _put(store, g, "/registry/core/pods/a/web", pod("web", "n1", volumes=[
            {"name": "s", "secret": {"secretName": "mine"}}]))
        assert union.authorize(attrs(N1, "get", "secrets", ns="a", name="mine"))[0] is Decision.ALLOW
        decision, reason = union.authorize(attrs(N1, "get", "secrets", ns="a", name="other"))
        assert decision is Decision.NO_OPINION
        assert reason == "no relationship found between node 'n1' and this object"
        # RBAC may still grant a node more (a binding naming it)
        await store.create("/registry/rbac.authorization.k8s.io/clusterroles/reader", {
            "metadata": {"name": "reader"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]}]})
        await store.create("/registry/rbac.authorization.k8s.io/clusterrolebindings/reader", {
            "metadata": {"name": "reader"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                        "kind": "ClusterRole", "name": "reader"},
            "subjects": [{"kind": "User", "name": "system:node:n1", "apiGroup": "rbac.authorization.k8s.io"}]})
        assert await cache.wait_for_revision(store.revision)
        assert union.authorize(attrs(N1, "get", "secrets", ns="a", name="other"))[0] is Decision.ALLOW
        from kubeplane.auth.requestinfo import request_info

        info = request_info("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=n2"})
        assert union.decide(N1, info)[0] is Decision.NO_OPINION
        info = request_info("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=n1"})
        assert union.decide(N1, info)[0] is Decision.ALLOW
    finally:
        await cache.stop()


async def test_nodes_list_nodes_for_their_routes_and_the_policy_agent_account_reads_the_rest(graph):
    from kubeplane.apiserver.bootstrappolicy import policy

    store, g = graph
    cache = PolicyCache(store)
    await cache.start()
    agent = UserInfo("system:serviceaccount:kube-system:kubeplane-network-policy",
                     groups=("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"))
    try:
        roles, bindings = policy()
        for obj in roles + bindings:
            kind = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
            await store.create(f"/registry/rbac.authorization.k8s.io/{kind}/{obj['metadata']['name']}", obj)
        assert await cache.wait_for_revision(store.revision)
        union = UnionAuthorizer(NodeAuthorizer(g, node_rules()), RBACAuthorizer(cache))
        for verb in ("list", "watch"):
            # a node: every Node for its pod routes, but not every pod (upstream's Node authorizer)
            assert union.authorize(attrs(N1, verb, "nodes"))[0] is Decision.ALLOW
            assert union.authorize(attrs(N1, verb, "pods"))[0] is Decision.NO_OPINION
            assert union.authorize(attrs(N1, verb, "networkpolicies", group="networking.k8s.io"))[0] \
                is Decision.NO_OPINION
            # the policy agent's account: every pod, namespace and policy
            assert union.authorize(attrs(agent, verb, "pods"))[0] is Decision.ALLOW
            assert union.authorize(attrs(agent, verb, "namespaces"))[0] is Decision.ALLOW
            assert union.authorize(attrs(agent, verb, "networkpolicies", group="networking.k8s.io"))[0] \
                is Decision.ALLOW
        # reading, no more: no Node or pod by name, no writes, nothing else
        assert union.authorize(attrs(N1, "get", "nodes", name="n2"))[0] is Decision.NO_OPINION
        assert union.authorize(attrs(agent, "get", "pods", ns="a", name="theirs"))[0] is Decision.NO_OPINION
        assert union.authorize(attrs(agent, "update", "networkpolicies", ns="a", name="p",
                                     group="networking.k8s.io"))[0] is Decision.NO_OPINION
        assert union.authorize(attrs(agent, "list", "secrets"))[0] is Decision.NO_OPINION
        assert union.authorize(attrs(ALICE, "list", "pods"))[0] is Decision.NO_OPINION
    finally:
        await cache.stop()


class _Failing:
    """A watch whose next read raises ``exc`` (then it is closed)."""

    def __init__(self, inner, exc):
        self.inner, self.exc = inner, exc

    async def next_batch(self, timeout=None):
        self.inner.close()
        raise self.exc

    def close(self):
        self.inner.close()


async def test_the_graph_keeps_following_the_store_when_a_watch_ends(graph, monkeypatch, caplog):
    import kubeplane.auth.node as node_mod

    monkeypatch.setattr(node_mod, "RELIST_BACKOFF_INITIAL", 0.01)
    store, g = graph
    authz = NodeAuthorizer(g, node_rules())
    vol = [{"name": "s", "secret": {"secretName": "s1"}}]

    def allowed(name):
        return authz.authorize(attrs(N1, "get", "secrets", ns="a", name=name))[0] is Decision.ALLOW

    async def fail_next_read(exc):
        # the graph's reader is parked in the current watch: the event of an
        # unrelated pod hands it over to the failing one
        g._watches[0] = _Failing(g._watches[0], exc)
        await _put(store, g, "/registry/core/pods/b/other", pod("other", "n2", ns="b", hostname=type(exc).__name__.lower()))
        await asyncio.sleep(0.01)

    # closed under the graph (next_batch answers None)
    g._watches[0].close()
    await asyncio.sleep(0.01)
    await _put(store, g, "/registry/core/pods/a/p1", pod("p1", "n1", volumes=vol))
    assert allowed("s1")
    # any error, not only the storage's own
    await fail_next_read(RuntimeError("connection reset"))
    await store.delete("/registry/core/pods/a/p1")
    await _settle(store, g)
    assert not allowed("s1")
    # the relist itself failing for a while: retried with backoff
    real_list, fails = store.list, []

    async def flaky_list(prefix, **kw):
        if len(fails) < 3:
            fails.append(prefix)
            raise OSError("store unavailable")
        return await real_list(prefix, **kw)

    monkeypatch.setattr(store, "list", flaky_list)
    await fail_next_read(ValueError("bad frame"))
    await _put(store, g, "/registry/core/pods/a/p2", pod("p2", "n1", volumes=vol))
    for _ in range(200):
        if allowed("s1"):
            break
        await asyncio.sleep(0.01)
    assert allowed("s1") and fails == ["/registry/core/pods/"] * 3
    assert all(not t.done() for t in g._tasks)
    assert "relisting /registry/core/pods/ for the node authorizer failed" in caplog.text
