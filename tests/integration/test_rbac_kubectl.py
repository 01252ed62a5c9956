"""RBAC with the real kubectl: the bootstrap roles, roles and bindings made
with kubectl's generators, SubjectAccessReviews answered for another user,
`kubectl auth can-i` (with --list) and `kubectl auth reconcile`, upstream's
validation messages, and the aggregated roles filled in."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.conftest import start_server


def _sar(kubectl, user: str, verb: str, resource: str, namespace: str, groups=()) -> dict:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": list(groups),
                       "resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace}}}
    # kubectl asks whether a kind without a PATCH operation is a CRD (it lists
    # them) before validating it client-side, as against upstream
    return json.loads(kubectl("create", "-f", "-", "-o", "json",
                              stdin=json.dumps(review)).out)["status"]


def _until(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_bootstrap_roles_and_aggregation(kubectl):
    out = kubectl("get", "clusterroles").out
    for name in ("cluster-admin", "admin", "edit", "view", "system:discovery", "system:public-info-viewer",
                 "system:kube-scheduler", "system:node"):
        assert f"\n{name} " in out
    assert out.splitlines()[0].split() == ["NAME", "CREATED", "AT"]
    wide = kubectl("get", "clusterrolebinding", "system:public-info-viewer", "-o", "wide").out
    assert wide.splitlines()[0].split() == ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"]
    assert "ClusterRole/system:public-info-viewer" in wide
    assert "system:authenticated, system:unauthenticated" in wide

    def admin_rules():
        return json.loads(kubectl("get", "clusterrole", "admin", "-o", "json").out).get("rules") or []

    rules = _until(lambda: [r for r in admin_rules() if "rolebindings" in r.get("resources", [])])
    assert rules, "admin was not aggregated"


def test_roles_bindings_and_reviews(kubectl):
    kubectl("create", "namespace", "rbac-a")
    kubectl("create", "namespace", "rbac-b")
    kubectl("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", "rbac-a")
    kubectl("create", "rolebinding", "alice-reads", "--role=pod-reader", "--user=alice", "-n", "rbac-a")
    assert _until(lambda: _sar(kubectl, "alice", "list", "pods", "rbac-a")["allowed"])
    status = _sar(kubectl, "alice", "list", "pods", "rbac-a")
    assert status["reason"] == 'RBAC: allowed by RoleBinding "alice-reads/rbac-a" of Role "pod-reader" to User "alice"'
    assert _sar(kubectl, "alice", "list", "pods", "rbac-b") == {"allowed": False}
    assert _sar(kubectl, "alice", "delete", "pods", "rbac-a") == {"allowed": False}
    # the admin (system:masters) may do anything
    assert kubectl("auth", "can-i", "delete", "nodes").out.strip() == "yes"
    assert kubectl("auth", "can-i", "list", "pods", "-n", "rbac-b").out.strip() == "yes"
    listed = kubectl("auth", "can-i", "--list", "-n", "rbac-a").out
    assert listed.splitlines()[0].split()[:4] == ["Resources", "Non-Resource", "URLs", "Resource"]
    assert any(line.split()[:1] == ["*.*"] for line in listed.splitlines())
    # roleRef is immutable
    kubectl("create", "clusterrole", "other", "--verb=get", "--resource=configmaps")
    changed = json.loads(kubectl("get", "rolebinding", "alice-reads", "-n", "rbac-a", "-o", "json").out)
    changed["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "other"}
    res = kubectl("replace", "-f", "-", stdin=json.dumps(changed), check=False)
    assert res.rc != 0
    assert "roleRef: Invalid value: rbac.RoleRef{" in res.err and "cannot change roleRef" in res.err
    # bad subjects are refused with upstream's field paths
    bad = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": "bad", "namespace": "rbac-a"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
           "subjects": [{"kind": "Robot", "name": "r2d2"}]}
    res = kubectl("create", "-f", "-", stdin=json.dumps(bad), check=False)
    assert res.rc != 0
    assert 'subjects[0].kind: Unsupported value: "Robot"' in res.err


def test_auth_reconcile(kubectl, tmp_path):
    kubectl("create", "namespace", "rbac-r")
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text("""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cm-editor, namespace: rbac-r}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-edits, namespace: rbac-r}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-editor}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
""")
    out = kubectl("auth", "reconcile", "-f", str(manifest)).out
    assert "role.rbac.authorization.k8s.io/cm-editor reconciled" in out
    assert _until(lambda: _sar(kubectl, "bob", "update", "configmaps", "rbac-r")["allowed"])
    assert _sar(kubectl, "bob", "delete", "configmaps", "rbac-r")["allowed"] is False


@pytest.fixture(scope="module")
def always_allow_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("always-allow"), extra=["--authorization-mode", "AlwaysAllow"])
    yield srv
    srv.stop()


def test_always_allow_mode(always_allow_server, tmp_path):
    from tests.integration.conftest import Kubectl

    kubectl = Kubectl(always_allow_server.kubeconfig, tmp_path)
    # every review is allowed, for anyone; the bootstrap policy is there all the same
    assert _sar(kubectl, "nobody", "delete", "secrets", "default") == {"allowed": True}
    assert "cluster-admin" in kubectl("get", "clusterroles", "-o", "name").out
