"""The authorization filter and the RBAC API over HTTP: 403s worded as
upstream's, reviews answered by the authorizer, escalation prevention.

Requests are made as a user by a test middleware in front of the app that
runs the request under ``acting_as`` (what the authentication filter does)."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.bootstrappolicy import reconcile
from kubeplane.apiserver.clusterroleaggregation import ClusterRoleAggregator
from kubeplane.apiserver.server import build_app
from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
from kubeplane.auth.user import UserInfo, acting_as
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

RBAC = "/apis/rbac.authorization.k8s.io/v1"
AUTHZ = "/apis/authorization.k8s.io/v1"
G = "rbac.authorization.k8s.io"


@web.middleware
async def as_user(request, handler):
    name = request.headers.get("X-Test-User")
    if not name:
        return await handler(request)
    groups = tuple(g for g in request.headers.get("X-Test-Groups", "").split(",") if g) + ("system:authenticated",)
    with acting_as(UserInfo(name, groups=groups)):
        return await handler(request)


class Env:
    def __init__(self, client, store, cache, registry):
        self.client, self.store, self.cache, self.registry = client, store, cache, registry

    async def call(self, method, path, body=None, user=None, groups=(), **params):
        headers = {"Content-Type": "application/json"}
        if user:
            headers["X-Test-User"] = user
            headers["X-Test-Groups"] = ",".join(groups)
        data = orjson.dumps(body) if body is not None else None
        resp = await self.client.request(method, path, data=data, params=params, headers=headers)
        text = await resp.text()
        return resp.status, orjson.loads(text) if text.startswith("{") else text

    async def admin(self, method, path, body=None):
        status, out = await self.call(method, path, body)
        assert status < 300, out
        await self.synced()
        return out

    async def synced(self):
        assert await self.cache.wait_for_revision(self.store.revision)
        while await self.aggregator.sync():  # aggregated roles settle
            assert await self.cache.wait_for_revision(self.store.revision)


@pytest.fixture()
async def env():
    store = MemoryStore(history=1000)
    cache = PolicyCache(store)
    await cache.start()
    registry = Registry(store, CATALOGUE, authorizer=RBACAuthorizer(cache))
    await ensure_default_namespaces(registry)
    await reconcile(registry)
    app = build_app(registry, CATALOGUE)
    app.middlewares.insert(0, as_user)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    e = Env(client, store, cache, registry)
    e.aggregator = ClusterRoleAggregator(registry, cache)
    await e.synced()
    yield e
    await client.close()
    await cache.stop()
    await registry.close()
    await store.close()


def role(name, rules, ns=None, kind="Role"):
    md = {"name": name, **({"namespace": ns} if ns else {})}
    return {"apiVersion": f"{G}/v1", "kind": kind, "metadata": md, "rules": rules}


def binding(name, ref_kind, ref, subjects, ns=None):
    kind = "RoleBinding" if ns else "ClusterRoleBinding"
    md = {"name": name, **({"namespace": ns} if ns else {})}
    return {"apiVersion": f"{G}/v1", "kind": kind, "metadata": md,
            "roleRef": {"apiGroup": G, "kind": ref_kind, "name": ref}, "subjects": subjects}


def alice():
    return [{"kind": "User", "name": "alice", "apiGroup": G}]


READ_PODS = [{"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods"]}]


async def test_forbidden_messages(env):
    status, out = await env.call("GET", "/api/v1/namespaces/b/pods", user="alice")
    assert status == 403
    assert out["reason"] == "Forbidden"
    assert out["message"] == ('pods is forbidden: User "alice" cannot list resource "pods" in API group "" '
                              'in the namespace "b"')
    assert out["details"] == {"kind": "pods"}
    status, out = await env.call("GET", "/apis/apps/v1/namespaces/b/deployments/web", user="alice")
    assert out["message"] == ('deployments.apps "web" is forbidden: User "alice" cannot get resource '
                              '"deployments" in API group "apps" in the namespace "b"')
    assert out["details"] == {"name": "web", "group": "apps", "kind": "deployments"}
    status, out = await env.call("GET", "/api/v1/nodes", user="alice")
    assert out["message"] == ('nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" '
                              "at the cluster scope")
    status, out = await env.call("GET", "/api/v1/namespaces/b/pods/p/log", user="alice")
    assert 'cannot get resource "pods/log" in API group ""' in out["message"]
    status, out = await env.call("GET", "/metrics", user="alice")
    assert (status, out["message"]) == (403, 'forbidden: User "alice" cannot get path "/metrics"')
    assert out["details"] == {}
    # a binding to a role that does not exist is named in the reason
    await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("x", "Role", "nope", alice(), ns="default"))
    status, out = await env.call("GET", "/api/v1/namespaces/default/pods", user="alice")
    assert out["message"].endswith(': RBAC: role.rbac.authorization.k8s.io "nope" not found')


async def test_bootstrap_policy_grants(env):
    # system:discovery, system:public-info-viewer and system:basic-user for every authenticated user
    for path in ("/version", "/healthz", "/api", "/apis", "/api/v1", "/openapi/v3"):
        status, _ = await env.call("GET", path, user="alice")
        assert status == 200, path
    status, out = await env.call("POST", f"{AUTHZ}/selfsubjectaccessreviews", user="alice", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "b"}}})
    assert status == 201
    assert out["status"] == {"allowed": False}
    # masters are allowed everything
    status, _ = await env.call("GET", "/api/v1/nodes", user="root", groups=("system:masters",))
    assert status == 200


async def test_role_binding_grants_in_its_namespace(env):
    await env.admin("POST", f"{RBAC}/namespaces/default/roles", role("pod-reader", READ_PODS, ns="default"))
    await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("alice-reads", "Role", "pod-reader", alice(), ns="default"))
    assert (await env.call("GET", "/api/v1/namespaces/default/pods", user="alice"))[0] == 200
    assert (await env.call("GET", "/api/v1/namespaces/kube-system/pods", user="alice"))[0] == 403
    assert (await env.call("POST", "/api/v1/namespaces/default/pods", {}, user="alice"))[0] == 403
    # the view ClusterRole, aggregated from system:aggregate-to-view, bound in one namespace
    await env.admin("POST", f"{RBAC}/namespaces/kube-public/rolebindings",
                    binding("alice-views", "ClusterRole", "view", alice(), ns="kube-public"))
    assert (await env.call("GET", "/api/v1/namespaces/kube-public/configmaps", user="alice"))[0] == 200
    assert (await env.call("GET", "/api/v1/namespaces/kube-public/secrets", user="alice"))[0] == 403


async def test_reviews(env):
    await env.admin("POST", f"{RBAC}/clusterrolebindings", binding("alice-reads", "ClusterRole", "view", alice()))
    sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
           "spec": {"user": "alice", "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "x"}}}
    status, out = await env.call("POST", f"{AUTHZ}/subjectaccessreviews", sar)
    assert status == 201
    assert out["status"]["allowed"] is True  # view, aggregated from system:aggregate-to-view
    sar["spec"]["resourceAttributes"]["verb"] = "delete"
    status, out = await env.call("POST", f"{AUTHZ}/subjectaccessreviews", sar)
    assert out["status"] == {"allowed": False}
    sar["spec"]["resourceAttributes"]["verb"] = "list"
    sar["spec"]["resourceAttributes"]["subresource"] = "exec"
    status, out = await env.call("POST", f"{AUTHZ}/subjectaccessreviews", sar)
    assert out["status"] == {"allowed": False}
    await env.admin("POST", f"{RBAC}/clusterroles", role("exec-lister", [
        {"verbs": ["list"], "apiGroups": [""], "resources": ["pods/exec"]}], kind="ClusterRole"))
    await env.admin("POST", f"{RBAC}/clusterrolebindings", binding("alice-execs", "ClusterRole", "exec-lister",
                                                                   alice()))
    status, out = await env.call("POST", f"{AUTHZ}/subjectaccessreviews", sar)
    assert out["status"] == {"allowed": True, "reason": 'RBAC: allowed by ClusterRoleBinding "alice-execs" '
                                                        'of ClusterRole "exec-lister" to User "alice"'}
    # alice may not ask about others
    assert (await env.call("POST", f"{AUTHZ}/subjectaccessreviews", sar, user="alice"))[0] == 403
    status, out = await env.call("POST", f"{AUTHZ}/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {}})
    assert status == 422
    assert {c["field"] for c in out["details"]["causes"]} == {"spec.resourceAttributes", "spec.user"}
    lsar = {"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
            "metadata": {"namespace": "default"},
            "spec": {"user": "alice", "resourceAttributes": {"verb": "get", "resource": "pods",
                                                             "namespace": "default"}}}
    status, out = await env.call("POST", f"{AUTHZ}/namespaces/default/localsubjectaccessreviews", lsar)
    assert (status, out["status"]["allowed"]) == (201, True)
    lsar["spec"]["resourceAttributes"]["namespace"] = "other"
    status, out = await env.call("POST", f"{AUTHZ}/namespaces/default/localsubjectaccessreviews", lsar)
    assert (status, out["message"]) == (400, "spec.resourceAttributes.namespace must match namespace: default")
    # non-resource attributes
    sar["spec"] = {"user": "alice", "groups": ["system:authenticated"],
                   "nonResourceAttributes": {"verb": "get", "path": "/healthz"}}
    status, out = await env.call("POST", f"{AUTHZ}/subjectaccessreviews", sar)
    assert out["status"]["allowed"] is True
    # the reviews are create-only
    status, out = await env.call("GET", f"{AUTHZ}/subjectaccessreviews")
    assert (status, out["reason"]) == (405, "MethodNotAllowed")
    status, out = await env.call("GET", f"{AUTHZ}/subjectaccessreviews/x")
    assert (status, out["reason"]) == (404, "NotFound")


async def test_self_subject_rules_review(env):
    await env.admin("POST", f"{RBAC}/namespaces/default/roles", role("pod-reader", READ_PODS, ns="default"))
    await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("alice-reads", "Role", "pod-reader", alice(), ns="default"))
    status, out = await env.call("POST", f"{AUTHZ}/selfsubjectrulesreviews", user="alice", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "default"}})
    assert status == 201
    rules = out["status"]["resourceRules"]
    assert {"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods"]} in rules
    assert {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]} in rules
    assert {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]} \
        in out["status"]["nonResourceRules"]
    assert out["status"]["incomplete"] is False


async def test_escalation_prevention(env):
    # alice may manage roles and bindings in "default" (the admin role's RBAC rules), nothing more
    await env.admin("POST", f"{RBAC}/namespaces/default/roles", role("rbac-manager", [
        # ("*" would include escalate and bind)
        {"verbs": ["create", "get", "list", "update", "patch", "delete"], "apiGroups": [G],
         "resources": ["roles", "rolebindings"]},
        {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}], ns="default"))
    await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("alice-manages", "Role", "rbac-manager", alice(), ns="default"))
    # a role within what she holds is fine
    status, _ = await env.call("POST", f"{RBAC}/namespaces/default/roles", user="alice",
                               body=role("lister", [{"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}],
                                         ns="default"))
    assert status == 201
    status, out = await env.call("POST", f"{RBAC}/namespaces/default/roles", user="alice", body=role(
        "deleter", [{"verbs": ["list", "delete"], "apiGroups": [""], "resources": ["pods", "secrets"]}],
        ns="default"))
    assert status == 403
    assert out["message"] == (
        'roles.rbac.authorization.k8s.io "deleter" is forbidden: user "alice" (groups=["system:authenticated"]) '
        "is attempting to grant RBAC permissions not currently held:\n"
        '{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}\n'
        '{APIGroups:[""], Resources:["secrets"], Verbs:["list"]}\n'
        '{APIGroups:[""], Resources:["secrets"], Verbs:["delete"]}')
    assert out["details"] == {"name": "deleter", "group": G, "kind": "roles"}
    # updating a role to more than she holds is refused as well
    status, current = await env.call("GET", f"{RBAC}/namespaces/default/roles/lister", user="alice")
    current["rules"][0]["verbs"].append("deletecollection")
    status, out = await env.call("PUT", f"{RBAC}/namespaces/default/roles/lister", current, user="alice")
    assert status == 403 and "not currently held" in out["message"]
    # binding cluster-admin: refused; binding a role she holds: fine
    status, out = await env.call("POST", f"{RBAC}/namespaces/default/rolebindings", user="alice", body=binding(
        "bob-admin", "ClusterRole", "cluster-admin", [{"kind": "User", "name": "bob", "apiGroup": G}], ns="default"))
    assert status == 403
    assert out["message"].startswith('rolebindings.rbac.authorization.k8s.io "bob-admin" is forbidden: user "alice"')
    status, _ = await env.call("POST", f"{RBAC}/namespaces/default/rolebindings", user="alice", body=binding(
        "bob-lists", "Role", "lister", [{"kind": "User", "name": "bob", "apiGroup": G}], ns="default"))
    assert status == 201
    # "escalate" on roles, and "bind" on a named role, lift the checks
    await env.admin("POST", f"{RBAC}/clusterroles", role("escalator", [
        {"verbs": ["escalate"], "apiGroups": [G], "resources": ["roles"]},
        {"verbs": ["bind"], "apiGroups": [G], "resources": ["clusterroles"], "resourceNames": ["cluster-admin"]}],
        kind="ClusterRole"))
    await env.admin("POST", f"{RBAC}/clusterrolebindings", binding("alice-escalates", "ClusterRole", "escalator",
                                                                   alice()))
    status, _ = await env.call("POST", f"{RBAC}/namespaces/default/roles", user="alice", body=role(
        "deleter", [{"verbs": ["delete"], "apiGroups": [""], "resources": ["secrets"]}], ns="default"))
    assert status == 201
    status, _ = await env.call("POST", f"{RBAC}/namespaces/default/rolebindings", user="alice", body=binding(
        "bob-admin", "ClusterRole", "cluster-admin", [{"kind": "User", "name": "bob", "apiGroup": G}], ns="default"))
    assert status == 201


async def test_aggregated_cluster_role_needs_full_authority(env):
    await env.admin("POST", f"{RBAC}/clusterroles", role("cr-writer", [
        {"verbs": ["create"], "apiGroups": [G], "resources": ["clusterroles"]}], kind="ClusterRole"))
    await env.admin("POST", f"{RBAC}/clusterrolebindings", binding("alice-writes", "ClusterRole", "cr-writer",
                                                                   alice()))
    body = role("sneaky", [], kind="ClusterRole")
    body["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]}
    status, out = await env.call("POST", f"{RBAC}/clusterroles", body, user="alice")
    assert status == 403
    assert '{APIGroups:["*"], Resources:["*"], Verbs:["*"]}\n{NonResourceURLs:["*"], Verbs:["*"]}' in out["message"]


async def test_validation(env):
    bad = binding("b", "Kind", "", [{"kind": "Robot", "name": "x"}, {"kind": "User", "name": "u", "apiGroup": "x"},
                                    {"kind": "ServiceAccount", "name": "s", "apiGroup": "rbac"}])
    bad["roleRef"]["apiGroup"] = "other"
    status, out = await env.call("POST", f"{RBAC}/clusterrolebindings", bad)
    assert status == 422
    causes = {c["field"]: c["message"] for c in out["details"]["causes"]}
    assert causes == {
        "roleRef.apiGroup": 'Unsupported value: "other": supported values: "rbac.authorization.k8s.io"',
        "roleRef.kind": 'Unsupported value: "Kind": supported values: "ClusterRole"',
        "roleRef.name": "Required value",
        "subjects[0].kind": 'Unsupported value: "Robot": supported values: "ServiceAccount", "User", "Group"',
        "subjects[1].apiGroup": 'Unsupported value: "x": supported values: "rbac.authorization.k8s.io"',
        "subjects[2].apiGroup": 'Unsupported value: "rbac": supported values: ""',
        "subjects[2].namespace": "Required value",
    }
    status, out = await env.call("POST", f"{RBAC}/namespaces/default/roles", role("r", [
        {"verbs": [], "nonResourceURLs": ["/x"]}, {"verbs": ["get"]}], ns="default"))
    causes = {c["field"]: c["message"] for c in out["details"]["causes"]}
    assert causes == {
        "rules[0].verbs": "Required value: verbs must contain at least one value",
        "rules[0].nonResourceURLs": 'Invalid value: []string{"/x"}: namespaced rules cannot apply to non-resource URLs',
        "rules[1].apiGroups": "Required value: resource rules must supply at least one api group",
        "rules[1].resources": "Required value: resource rules must supply at least one resource",
    }
    # names are path segments: colons are fine
    await env.admin("POST", f"{RBAC}/clusterroles", role("team:reader", READ_PODS, kind="ClusterRole"))
    # subjects' and roleRef's apiGroup default; roleRef is immutable
    created = await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings", {
        "apiVersion": f"{G}/v1", "kind": "RoleBinding", "metadata": {"name": "rb", "namespace": "default"},
        "roleRef": {"kind": "ClusterRole", "name": "team:reader"}, "subjects": [{"kind": "User", "name": "u"}]})
    assert created["roleRef"]["apiGroup"] == G and created["subjects"][0]["apiGroup"] == G
    created["roleRef"]["name"] = "view"
    status, out = await env.call("PUT", f"{RBAC}/namespaces/default/rolebindings/rb", created)
    assert status == 422
    assert out["message"] == ('RoleBinding.rbac.authorization.k8s.io "rb" is invalid: roleRef: Invalid value: '
                              'rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", Kind:"ClusterRole", Name:"view"}: '
                              "cannot change roleRef")


async def test_anonymous_sees_public_info_only(env):
    @web.middleware
    async def anonymous(request, handler):
        from kubeplane.auth.user import ANONYMOUS

        with acting_as(ANONYMOUS):
            return await handler(request)

    app = build_app(env.registry, CATALOGUE)
    app.middlewares.insert(0, anonymous)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        for path in ("/healthz", "/livez", "/readyz", "/version"):
            assert (await client.get(path)).status == 200, path
        resp = await client.get("/api")
        assert resp.status == 403
        assert (await resp.json())["message"] == 'forbidden: User "system:anonymous" cannot get path "/api"'
    finally:
        await client.close()


async def test_list_and_watch_are_told_apart(env):
    await env.admin("POST", f"{RBAC}/namespaces/default/roles", role("lister", [
        {"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}], ns="default"))
    await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("alice-lists", "Role", "lister", alice(), ns="default"))
    pods = "/api/v1/namespaces/default/pods"
    assert (await env.call("GET", pods, user="alice"))[0] == 200
    status, out = await env.call("GET", pods, user="alice", watch="true", timeoutSeconds="1")
    assert status == 403
    assert out["message"].startswith('pods is forbidden: User "alice" cannot watch resource "pods"')
    assert (await env.call("GET", pods, user="alice", watch="false"))[0] == 200
    # a field selector on the name makes it a request for that object
    await env.admin("POST", f"{RBAC}/namespaces/default/roles", role("one", [
        {"verbs": ["watch"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["p1"]}], ns="default"))
    await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("alice-one", "Role", "one", alice(), ns="default"))
    status, _ = await env.call("GET", pods, user="alice", watch="1", timeoutSeconds="1",
                               fieldSelector="metadata.name=p1")
    assert status == 200
    status, _ = await env.call("GET", pods, user="alice", watch="1", timeoutSeconds="1",
                               fieldSelector="metadata.name=p2")
    assert status == 403


async def test_escalation_through_patch_is_refused(env):
    await env.admin("POST", f"{RBAC}/namespaces/default/roles", role("role-editor", [
        {"verbs": ["get", "patch"], "apiGroups": [G], "resources": ["roles"]}], ns="default"))
    await env.admin("POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("alice-edits", "Role", "role-editor", alice(), ns="default"))
    await env.admin("POST", f"{RBAC}/namespaces/default/roles", role("target", [], ns="default"))
    path = f"{RBAC}/namespaces/default/roles/target"
    headers = {"Content-Type": "application/merge-patch+json", "X-Test-User": "alice", "X-Test-Groups": ""}
    resp = await env.client.patch(path, data=orjson.dumps({"rules": [
        {"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]}]}), headers=headers)
    assert resp.status == 403
    assert "not currently held" in (await resp.json())["message"]
    # a change that grants nothing new (labels) is fine
    resp = await env.client.patch(path, data=orjson.dumps({"metadata": {"labels": {"a": "b"}}}), headers=headers)
    assert resp.status == 200
