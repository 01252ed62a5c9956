"""``kubectl rollout undo`` against ``kubeplane up``: the old ReplicaSet is
reused, as upstream, instead of a new one being created."""

from __future__ import annotations

import json

import pytest

from conftest import Kubectl, start_server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up-undo")
    srv = start_server(tmp, command="up", extra=["--nodes", "1"])
    yield Kubectl(srv.kubeconfig, tmp / "home")
    srv.stop()


def revisions(kubectl: Kubectl) -> list[str]:
    rss = json.loads(kubectl("get", "rs", "-l", "app=web", "-o", "json").out)["items"]
    return sorted(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] for rs in rss)


def test_rollout_undo_reuses_the_previous_replicaset(cluster):
    kubectl = cluster
    kubectl("create", "deployment", "web", "--image=nginx:1", "--replicas=2")
    kubectl("rollout", "status", "deployment/web", "--timeout=60s")
    kubectl("set", "image", "deployment/web", "nginx=nginx:2")
    kubectl("rollout", "status", "deployment/web", "--timeout=60s")
    assert revisions(kubectl) == ["1", "2"]
    kubectl("rollout", "undo", "deployment/web")
    kubectl("rollout", "status", "deployment/web", "--timeout=60s")
    history = kubectl("rollout", "history", "deployment/web").out.split()
    assert history[history.index("CHANGE-CAUSE") + 1:] == ["2", "<none>", "3", "<none>"]
    assert revisions(kubectl) == ["2", "3"]
    image = json.loads(kubectl("get", "deployment", "web", "-o", "json").out)["spec"]["template"]["spec"][
        "containers"][0]["image"]
    assert image == "nginx:1"
