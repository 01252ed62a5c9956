"""RBAC with the real kubectl acting as an ordinary user (`--as alice`): a
403 worded as upstream's in a namespace she has no role in, `auth can-i`
answering both, her own rules listed, and escalation refused.

The server is kubeplane with a test harness taking the user from kubectl's
impersonation headers (rbac_as_user_server.py), standing in for
authentication and impersonation."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import Kubectl, ServerProcess

HARNESS = Path(__file__).with_name("rbac_as_user_server.py")


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rbac-as-user")
    kubeconfig = tmp / "kubeconfig"
    log_path = tmp / "server.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, str(HARNESS), "apiserver", "--listen", "127.0.0.1:0", "--kubeconfig",
             str(kubeconfig), "--storage", "memory", "--data-dir", str(tmp / "data")],
            stdout=logf, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("API server did not start:\n" + log_path.read_text(errors="replace"))
        time.sleep(0.05)
    url = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    srv = ServerProcess(proc, kubeconfig, tmp / "data", url, log_path)
    yield Kubectl(kubeconfig, tmp / "home")
    srv.stop()


def _eventually(fn, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        res = fn()
        if res.rc == 0 or time.monotonic() > deadline:
            return res
        time.sleep(0.05)


def test_user_bound_in_one_namespace(kubectl):
    kubectl("create", "namespace", "team-a")
    kubectl("create", "namespace", "team-b")
    kubectl("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", "team-a")
    kubectl("create", "rolebinding", "alice-reads", "--role=pod-reader", "--user=alice", "-n", "team-a")
    res = _eventually(lambda: kubectl("get", "pods", "-n", "team-a", "--as", "alice", check=False))
    assert res.rc == 0, res.err
    res = kubectl("get", "pods", "-n", "team-b", "--as", "alice", check=False)
    assert res.rc == 1
    assert res.err.strip() == ('Error from server (Forbidden): pods is forbidden: User "alice" cannot list resource '
                               '"pods" in API group "" in the namespace "team-b"')
    res = kubectl("get", "nodes", "--as", "alice", check=False)
    assert ('nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster scope'
            in res.err)
    assert kubectl("auth", "can-i", "list", "pods", "-n", "team-a", "--as", "alice").out.strip() == "yes"
    res = kubectl("auth", "can-i", "list", "pods", "-n", "team-b", "--as", "alice", check=False)
    assert (res.rc, res.out.strip()) == (1, "no")
    listed = kubectl("auth", "can-i", "--list", "-n", "team-a", "--as", "alice").out
    rows = {line.split()[0]: line for line in listed.splitlines()[1:] if line and not line.startswith(" ")}
    assert "[get list watch]" in rows["pods"]
    assert "*.*" not in rows


def test_escalation_refused(kubectl):
    kubectl("create", "namespace", "team-c")
    kubectl("create", "role", "rbac-editor", "--verb=create,get,list", "--resource=roles,rolebindings",
            "-n", "team-c")
    kubectl("create", "rolebinding", "carol-edits-rbac", "--role=rbac-editor", "--user=carol", "-n", "team-c")
    _eventually(lambda: kubectl("get", "roles", "-n", "team-c", "--as", "carol", check=False))
    # within what she holds
    kubectl("create", "role", "role-lister", "--verb=list", "--resource=roles", "-n", "team-c", "--as", "carol")
    res = kubectl("create", "role", "secret-reader", "--verb=get", "--resource=secrets", "-n", "team-c",
                  "--as", "carol", check=False)
    assert res.rc == 1
    assert res.err.strip() == (
        'Error from server (Forbidden): roles.rbac.authorization.k8s.io "secret-reader" is forbidden: user "carol" '
        '(groups=["system:authenticated"]) is attempting to grant RBAC permissions not currently held:\n'
        '{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}')
    res = kubectl("create", "rolebinding", "dave-admin", "--clusterrole=admin", "--user=dave", "-n", "team-c",
                  "--as", "carol", check=False)
    assert res.rc == 1
    assert 'rolebindings.rbac.authorization.k8s.io "dave-admin" is forbidden: user "carol"' in res.err
    assert "is attempting to grant RBAC permissions not currently held" in res.err
    kubectl("create", "rolebinding", "dave-lists", "--role=role-lister", "--user=dave", "-n", "team-c",
            "--as", "carol")
