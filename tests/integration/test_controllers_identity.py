"""`kubeplane controllers` as kube-controller-manager with
--use-service-account-credentials and --controllers: each controller writes
with a token of its own kube-system ServiceAccount, so what its bootstrap
role allows is what it can do, and the selection decides what runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync

RS = """
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs1}
spec:
  replicas: 2
  selector: {matchLabels: {app: rs1}}
  template:
    metadata: {labels: {app: rs1}}
    spec: {containers: [{name: c, image: nginx}]}
"""


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("controller-identities")
    srv = start_server(tmp, storage="memory")
    yield srv, tmp
    srv.stop()


def _pods(kubectl: Kubectl) -> int:
    return len(json.loads(kubectl("get", "pods", "-l", "app=rs1", "-o", "json").out)["items"])


def test_controllers_act_as_their_service_accounts_and_only_the_selected_run(apiserver):
    srv, tmp = apiserver
    kubectl = Kubectl(srv.kubeconfig, tmp / "home")
    # Without its own binding the ReplicaSet controller may do nothing, though
    # kube-controller-manager's user still holds the role.
    kubectl("delete", "clusterrolebinding", "system:controller:replicaset-controller")
    assert kubectl("get", "clusterrolebinding", "kubeplane:controller-manager:replicaset-controller",
                   "-o", "jsonpath={.roleRef.name}").out == "system:controller:replicaset-controller"
    log = open(tmp / "controllers.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubeplane.cli.main", "controllers",
         "--kubeconfig", str(srv.data_dir / "controller-manager.kubeconfig"), "--metrics-listen", "",
         "--use-service-account-credentials", "--controllers", "*,-deployment"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        kubectl("apply", "-f", "-", stdin=RS)
        kubectl("create", "deployment", "web", "--image=nginx")
        # the controllers' ServiceAccounts are made in kube-system as they start
        eventually_sync(lambda: kubectl("get", "serviceaccount", "replicaset-controller", "-n", "kube-system",
                                        check=False).rc == 0, timeout=30, interval=0.2,
                        what="the replicaset-controller ServiceAccount")
        forbidden = ('User "system:serviceaccount:kube-system:replicaset-controller" cannot update resource '
                     '"replicasets/status" in API group "apps" in the namespace "default"')
        eventually_sync(lambda: forbidden in (tmp / "controllers.log").read_text(errors="replace"), timeout=30,
                        interval=0.2, what="the ReplicaSet controller refused")
        assert _pods(kubectl) == 0
        # its role bound again: the same controller, the same token, now allowed
        kubectl("create", "clusterrolebinding", "system:controller:replicaset-controller",
                "--clusterrole", "system:controller:replicaset-controller",
                "--serviceaccount", "kube-system:replicaset-controller")
        eventually_sync(lambda: _pods(kubectl) == 2, timeout=30, interval=0.2, what="2 pods")
        # the deployment controller was left out: its Deployment has no ReplicaSet
        owned = [rs for rs in json.loads(kubectl("get", "rs", "-o", "json").out)["items"]
                 if rs["metadata"]["name"] != "rs1"]
        assert owned == []
        assert kubectl("get", "deployment", "web", "-o", "jsonpath={.status.observedGeneration}").out == ""
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def test_an_unknown_controller_is_refused_at_start(apiserver):
    srv, _ = apiserver
    p = subprocess.run([sys.executable, "-m", "kubeplane.cli.main", "controllers", "--kubeconfig",
                        str(srv.kubeconfig), "--controllers", "*,-cronjobz"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert '"cronjobz" is not in the list of known controllers' in p.stderr
