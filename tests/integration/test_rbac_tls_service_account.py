"""RBAC over TLS with real kubectl and a ServiceAccount token: it may list
pods in the namespace it is bound in and gets 403 in another, `auth can-i`
answers both, `auth whoami` names it, escalation is refused, a bad token is 401
(anonymous requests: tests/integration/test_authn_tls.py)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from conftest import Kubectl, start_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("rbac-tls"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def admin(srv, tmp_path_factory) -> Kubectl:
    return Kubectl(srv.kubeconfig, tmp_path_factory.mktemp("rbac-tls-admin"))


def as_token(srv, path, token: str | None) -> Kubectl:
    """A kubeconfig with the CA and a bearer token (no client certificate)."""
    path.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(srv.kubeconfig.read_text())
    doc["users"][0]["user"] = {"token": token} if token else {}
    (path / "kubeconfig").write_text(yaml.safe_dump(doc))
    return Kubectl(path / "kubeconfig", path)


def _eventually(fn, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        res = fn()
        if res.rc == 0 or time.monotonic() > deadline:
            return res
        time.sleep(0.05)


def test_service_account_token(srv, admin, tmp_path):
    assert yaml.safe_load(srv.kubeconfig.read_text())["clusters"][0]["cluster"]["server"].startswith("https://")
    for ns in ("sa-home", "sa-other"):
        admin("create", "namespace", ns)
    admin("create", "serviceaccount", "robot", "-n", "sa-home")
    admin("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", "sa-home")
    admin("create", "rolebinding", "robot-reads", "--role=pod-reader", "--serviceaccount=sa-home:robot",
          "-n", "sa-home")
    token = admin("create", "token", "robot", "-n", "sa-home").out.strip()
    robot = as_token(srv, tmp_path / "robot", token)

    who = json.loads(robot("auth", "whoami", "-o", "json").out)["status"]["userInfo"]
    assert who["username"] == "system:serviceaccount:sa-home:robot"
    assert "system:serviceaccounts:sa-home" in who["groups"]

    res = _eventually(lambda: robot("get", "pods", "-n", "sa-home", check=False))
    assert res.rc == 0, res.err
    res = robot("get", "pods", "-n", "sa-other", check=False)
    assert res.rc == 1
    assert res.err.strip() == (
        'Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:sa-home:robot" cannot list '
        'resource "pods" in API group "" in the namespace "sa-other"')
    assert robot("auth", "can-i", "list", "pods", "-n", "sa-home").out.strip() == "yes"
    res = robot("auth", "can-i", "list", "pods", "-n", "sa-other", check=False)
    assert (res.rc, res.out.strip()) == (1, "no")
    # the admin asks on the robot's behalf, impersonating it
    assert admin("auth", "can-i", "watch", "pods", "-n", "sa-home",
                 "--as", "system:serviceaccount:sa-home:robot").out.strip() == "yes"

    # escalation: the robot may write roles in its namespace, but only with rules it holds
    admin("create", "role", "role-writer", "--verb=create", "--resource=roles,rolebindings", "-n", "sa-home")
    admin("create", "rolebinding", "robot-writes", "--role=role-writer", "--serviceaccount=sa-home:robot",
          "-n", "sa-home")
    _eventually(lambda: robot("auth", "can-i", "create", "roles", "-n", "sa-home", check=False))
    robot("create", "role", "lister", "--verb=list", "--resource=pods", "-n", "sa-home")
    res = robot("create", "role", "secret-reader", "--verb=get", "--resource=secrets", "-n", "sa-home",
                check=False)
    assert res.rc == 1
    assert ('roles.rbac.authorization.k8s.io "secret-reader" is forbidden: user '
            '"system:serviceaccount:sa-home:robot"' in res.err)
    assert '{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}' in res.err
    res = robot("create", "rolebinding", "robot-admin", "--clusterrole=admin",
                "--serviceaccount=sa-home:robot", "-n", "sa-home", check=False)
    assert res.rc == 1 and "is attempting to grant RBAC permissions not currently held" in res.err


def test_bad_token(srv, tmp_path):
    bad = as_token(srv, tmp_path / "bad", "not-a-token")
    res = bad("get", "pods", check=False)
    assert res.rc != 0 and "You must be logged in to the server" in res.err
