"""The RBAC bootstrap policy (reconciled as upstream's autoupdate does) and
the ClusterRole aggregation controller."""

from __future__ import annotations

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.bootstrappolicy import AUTOUPDATE, policy, reconcile
from kubeplane.apiserver.clusterroleaggregation import ClusterRoleAggregator, aggregated_rules
from kubeplane.auth.rbac import PolicyCache
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

G = "rbac.authorization.k8s.io"
ROLES = resource("clusterroles", G)
BINDINGS = resource("clusterrolebindings", G)


@pytest.fixture()
async def registry():
    store = MemoryStore(history=1000)
    reg = Registry(store, CATALOGUE)
    yield reg
    await reg.close()
    await store.close()


async def test_policy_is_created_then_left_alone(registry):
    counts = await reconcile(registry)
    roles, bindings = policy()
    assert counts == {"created": len(roles) + len(bindings)}
    for name in ("cluster-admin", "admin", "edit", "view", "system:basic-user", "system:discovery",
                 "system:public-info-viewer", "system:kube-scheduler", "system:kube-controller-manager",
                 "system:node", "system:volume-scheduler", "system:monitoring",
                 "system:service-account-issuer-discovery", "system:controller:deployment-controller"):
        obj = await registry.get(ROLES, name)
        assert obj["metadata"]["annotations"][AUTOUPDATE] == "true"
        assert obj["metadata"]["labels"]["kubernetes.io/bootstrapping"] == "rbac-defaults"
    piv = await registry.get(BINDINGS, "system:public-info-viewer")
    assert [s["name"] for s in piv["subjects"]] == ["system:authenticated", "system:unauthenticated"]
    assert (await registry.get(BINDINGS, "cluster-admin"))["subjects"] == [
        {"apiGroup": G, "kind": "Group", "name": "system:masters"}]
    ctrl = await registry.get(BINDINGS, "system:controller:replicaset-controller")
    assert ctrl["subjects"] == [{"kind": "ServiceAccount", "name": "replicaset-controller",
                                 "namespace": "kube-system"}]
    edit = await registry.get(ROLES, "edit")
    assert edit["aggregationRule"] == {"clusterRoleSelectors": [
        {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}]}
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert await reconcile(registry) == {"unchanged": len(roles) + len(bindings)}


async def test_reconcile_adds_what_is_missing_and_keeps_additions(registry):
    await reconcile(registry)
    # an administrator trims a role, adds a rule and a subject, and turns one role's autoupdate off
    basic = await registry.get(ROLES, "system:basic-user")
    extra_rule = {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"]}
    await registry.update(ROLES, {**basic, "rules": [basic["rules"][1], extra_rule]}, name="system:basic-user")
    monitoring = await registry.get(ROLES, "system:monitoring")
    md = {**monitoring["metadata"], "annotations": {AUTOUPDATE: "false"}}
    await registry.update(ROLES, {**monitoring, "metadata": md, "rules": []}, name="system:monitoring")
    disc = await registry.get(BINDINGS, "system:discovery")
    other = {"apiGroup": G, "kind": "Group", "name": "extra"}
    await registry.update(BINDINGS, {**disc, "subjects": [other]}, name="system:discovery")
    # and points a bootstrap binding elsewhere (by recreating it)
    await registry.delete(BINDINGS, "system:kube-dns")
    moved = {"apiVersion": f"{G}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:kube-dns"},
             "roleRef": {"apiGroup": G, "kind": "ClusterRole", "name": "view"}}
    await registry.create(BINDINGS, moved)

    counts = await reconcile(registry)
    assert (counts["updated"], counts["created"], counts["skipped"]) == (2, 1, 1)
    basic = await registry.get(ROLES, "system:basic-user")
    assert extra_rule in basic["rules"]
    # the missing rule comes back broken down, as upstream's Covers reports it
    assert {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews"]} in basic["rules"]
    assert (await registry.get(ROLES, "system:monitoring"))["rules"] == []
    subjects = (await registry.get(BINDINGS, "system:discovery"))["subjects"]
    assert subjects == [other, {"apiGroup": G, "kind": "Group", "name": "system:authenticated"}]
    assert (await registry.get(BINDINGS, "system:kube-dns"))["roleRef"]["name"] == "system:kube-dns"


def test_aggregated_rules_follow_labels_in_name_order():
    sel = {"clusterRoleSelectors": [{"matchLabels": {"agg": "x"}}, {"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["b"]}]}]}
    r1 = {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}
    r2 = {"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}
    r3 = {"verbs": ["watch"], "apiGroups": [""], "resources": ["pods"]}
    roles = {
        "agg": {"metadata": {"name": "agg", "labels": {"agg": "x"}}, "aggregationRule": sel, "rules": []},
        "b": {"metadata": {"name": "b", "labels": {"agg": "x"}}, "rules": [r2, r1]},
        "a": {"metadata": {"name": "a", "labels": {"agg": "x", "tier": "b"}}, "rules": [r1]},
        "c": {"metadata": {"name": "c", "labels": {"tier": "b"}}, "rules": [r3, r1]},
        "d": {"metadata": {"name": "d", "labels": {"tier": "c"}}, "rules": [{"verbs": ["delete"]}]},
    }
    assert aggregated_rules(roles["agg"], roles) == [r1, r2, r3]
    assert aggregated_rules(roles["a"], roles) is None


async def test_aggregation_controller_fills_and_follows(registry):
    cache = PolicyCache(registry.store)
    await cache.start()
    await reconcile(registry)
    agg = ClusterRoleAggregator(registry, cache)

    async def settle():
        assert await cache.wait_for_revision(registry.store.revision)
        while await agg.sync():
            assert await cache.wait_for_revision(registry.store.revision)

    try:
        await settle()
        view = await registry.get(ROLES, "view")
        edit = await registry.get(ROLES, "edit")
        admin = await registry.get(ROLES, "admin")
        assert view["rules"] == (await registry.get(ROLES, "system:aggregate-to-view"))["rules"]
        assert all(r in edit["rules"] for r in view["rules"])  # view aggregates into edit...
        assert all(r in admin["rules"] for r in edit["rules"])  # ...and edit into admin
        # a new role labelled for view joins it; removing the label takes its rules away
        extra = {"verbs": ["get"], "apiGroups": ["example.com"], "resources": ["widgets"]}
        created = await registry.create(ROLES, {"apiVersion": f"{G}/v1", "kind": "ClusterRole", "metadata": {
            "name": "widgets-view", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
            "rules": [extra]})
        await settle()
        assert extra in (await registry.get(ROLES, "view"))["rules"]
        assert extra in (await registry.get(ROLES, "admin"))["rules"]
        await registry.update(ROLES, {**created, "metadata": {**created["metadata"], "labels": {}}},
                              name="widgets-view")
        await settle()
        assert extra not in (await registry.get(ROLES, "view"))["rules"]
        # the running controller does it by itself
        await agg.start()
        current = await registry.get(ROLES, "widgets-view")
        await registry.update(ROLES, {**current, "metadata": {
            **current["metadata"], "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}},
            name="widgets-view")
        for _ in range(500):
            if extra in (await registry.get(ROLES, "admin"))["rules"]:
                break
            await cache.wait_for_revision(registry.store.revision + 1, timeout=0.01)
        assert extra in (await registry.get(ROLES, "admin"))["rules"]
        assert extra not in (await registry.get(ROLES, "view"))["rules"]
    finally:
        await agg.stop()
        await cache.stop()


async def test_component_identities_hold_what_kubeplanes_components_do(registry):
    from kubeplane.auth.authorizer import Attributes, Decision
    from kubeplane.auth.rbac import RBACAuthorizer
    from kubeplane.auth.user import UserInfo

    cache = PolicyCache(registry.store)
    await cache.start()
    try:
        await reconcile(registry)
        assert await cache.wait_for_revision(registry.store.revision)
        from kubeplane.apiserver.bootstrappolicy import node_rules
        from kubeplane.auth.node import NodeAuthorizer, NodeGraph, UnionAuthorizer

        # the API server's chain: the Node authorizer (with upstream's node rules), then RBAC
        authz = UnionAuthorizer(NodeAuthorizer(NodeGraph(registry.store), node_rules()), RBACAuthorizer(cache))
        kcm = UserInfo("system:kube-controller-manager", groups=("system:authenticated",))
        sched = UserInfo("system:kube-scheduler", groups=("system:authenticated",))
        node = UserInfo("system:node:n1", groups=("system:nodes", "system:authenticated"))

        def allowed(user, verb, resource, group="", ns="", sub=""):
            return authz.authorize(Attributes(user, verb, True, ns, group, "v1", resource, sub))[0] is Decision.ALLOW

        # the controller manager's own loops (its credentials, granted the controller roles)
        for verb, res, group, sub in (("list", "pods", "", ""), ("watch", "secrets", "", ""),
                                      ("create", "pods", "", ""), ("update", "pods", "", ""),
                                      ("create", "replicasets", "apps", ""), ("update", "deployments", "apps", "status"),
                                      ("delete", "pods", "", ""), ("update", "persistentvolumes", "", "status"),
                                      ("create", "csistoragecapacities", "storage.k8s.io", ""),
                                      ("update", "namespaces", "", "finalize"),
                                      ("patch", "resourceclaims", "resource.k8s.io", "status")):
            assert allowed(kcm, verb, res, group, "a", sub), (verb, res, sub)
        assert not allowed(kcm, "create", "clusterrolebindings", G)
        # the scheduler binds pods and writes their status; nodes their own kinds
        assert allowed(sched, "create", "pods", ns="a", sub="binding")
        assert allowed(sched, "patch", "pods", ns="a", sub="status")
        assert not allowed(sched, "create", "pods", ns="a")
        assert allowed(node, "patch", "nodes", sub="status")
        assert allowed(node, "create", "leases", "coordination.k8s.io", ns="kube-node-lease")
        assert not allowed(node, "create", "leases", "coordination.k8s.io", ns="default")
        assert not allowed(node, "create", "deployments", "apps", "a")
        # RBAC alone: the system:node role is bound to no one (upstream's policy)
        assert not RBACAuthorizer(cache).authorize(
            Attributes(node, "patch", True, "", "", "v1", "nodes", "status"))[0] is Decision.ALLOW
    finally:
        await cache.stop()


async def test_a_first_start_creates_without_reading_each_object(registry, monkeypatch):
    reads: list[str] = []
    real_get = registry.get

    async def counting_get(res, name, namespace=None):
        reads.append(name)
        return await real_get(res, name, namespace)

    monkeypatch.setattr(registry, "get", counting_get)
    roles, bindings = policy()
    assert await reconcile(registry) == {"created": len(roles) + len(bindings)}
    assert reads == []
    # a later start reads what is there and changes only what differs
    await registry.delete(ROLES, "view")
    counts = await reconcile(registry)
    assert counts == {"created": 1, "unchanged": len(roles) + len(bindings) - 1}
    assert "view" not in reads and "edit" in reads


async def test_an_object_made_meanwhile_is_reconciled_not_duplicated(registry, monkeypatch):
    # the list says "absent", then something creates the role first: the create
    # conflicts and the role is read and merged instead
    real_list = registry.list
    made = False

    async def list_then_create(res, *a, **kw):
        nonlocal made
        out = await real_list(res, *a, **kw)
        if res.plural == "clusterroles" and not made:
            made = True
            await registry.create(ROLES, {"apiVersion": f"{G}/v1", "kind": "ClusterRole",
                                          "metadata": {"name": "system:basic-user"}, "rules": []})
        return out

    monkeypatch.setattr(registry, "list", list_then_create)
    roles, bindings = policy()
    counts = await reconcile(registry)
    assert counts == {"created": len(roles) + len(bindings) - 1, "updated": 1}
    basic = await registry.get(ROLES, "system:basic-user")
    assert basic["rules"] and basic["metadata"]["annotations"][AUTOUPDATE] == "true"
