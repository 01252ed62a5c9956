"""The official ``kubernetes`` Python client against a kubeplane API server."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from conftest import start_server


@pytest.fixture(scope="module")
def api(server):
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as c:
        yield c


@pytest.fixture()
def ns(api):
    name = f"py-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        client.CoreV1Api(api).delete_namespace(name)
    except ApiException:
        pass


def _pod(name: str, **labels: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels or None),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx:1.27")]),
    )


def test_crud_and_stale_update(api, ns):
    core = client.CoreV1Api(api)
    created = core.create_namespaced_pod(ns, _pod("a", app="x"))
    assert created.metadata.uid and created.status.phase == "Pending"
    got = core.read_namespaced_pod("a", ns)
    assert got.spec.containers[0].image == "nginx:1.27"
    got.metadata.labels["extra"] = "1"
    updated = core.replace_namespaced_pod("a", ns, got)
    assert updated.metadata.labels == {"app": "x", "extra": "1"}
    assert updated.metadata.resource_version != got.metadata.resource_version
    # The old object's resourceVersion is now stale.
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("a", ns, got)
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, _pod("a"))
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    pods = core.list_namespaced_pod(ns, label_selector="app=x")
    assert [p.metadata.name for p in pods.items] == ["a"]
    assert pods.metadata.resource_version
    core.patch_namespaced_pod("a", ns, {"metadata": {"labels": {"p": "q"}}})
    assert core.read_namespaced_pod("a", ns).metadata.labels["p"] == "q"
    core.delete_namespaced_pod("a", ns)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("a", ns)
    assert exc.value.status == 404


def test_invalid_pod_is_422(api, ns):
    core = client.CoreV1Api(api)
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "Bad_Name"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, body)
    assert exc.value.status == 422
    status = json.loads(exc.value.body)
    assert status["reason"] == "Invalid" and status["details"]["causes"][0]["field"] == "metadata.name"


def test_watch_from_resource_version_and_bookmarks(api, ns):
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="before")))
    rv = core.list_namespaced_config_map(ns).metadata.resource_version

    def later():
        time.sleep(0.5)
        core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="after")))
        core.patch_namespaced_config_map("after", ns, {"data": {"k": "v"}})
        core.delete_namespaced_config_map("after", ns)

    t = threading.Thread(target=later)
    t.start()
    seen = []
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.name))
        if ev["type"] == "DELETED":
            w.stop()
    t.join()
    assert seen == [("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "after")]


def test_watch_expired_resource_version_is_410(tmp_path):
    srv = start_server(tmp_path, extra=["--history-revisions", "10"])
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(srv.kubeconfig), client_configuration=cfg)
        with client.ApiClient(cfg) as c:
            core = client.CoreV1Api(c)
            first = core.create_namespaced_config_map(
                "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm-0")))
            for i in range(1, 40):
                core.create_namespaced_config_map(
                    "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"cm-{i}")))
            # The first write's revision is now older than the kept history.
            with pytest.raises(ApiException) as exc:
                for _ in watch.Watch().stream(core.list_namespaced_config_map, "default",
                                              resource_version=first.metadata.resource_version, timeout_seconds=3):
                    pass
            assert exc.value.status == 410
            # A relist gives a current resourceVersion that can be watched again.
            rv = core.list_namespaced_config_map("default").metadata.resource_version
            events = list(watch.Watch().stream(core.list_namespaced_config_map, "default",
                                               resource_version=rv, timeout_seconds=1))
            assert events == []
    finally:
        srv.stop()


def test_bookmarks_are_delivered(api, ns):
    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    w = watch.Watch()
    types = []
    for ev in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, allow_watch_bookmarks=True,
                       timeout_seconds=8):
        types.append(ev["type"])
        if ev["type"] == "BOOKMARK":
            w.stop()
    assert "BOOKMARK" in types


def test_apps_and_resource_apis(api, ns):
    apps = client.AppsV1Api(api)
    dep = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="d"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels={"app": "d"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "d"}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx")]),
            ),
        ),
    )
    created = apps.create_namespaced_deployment(ns, dep)
    assert created.spec.strategy.type == "RollingUpdate" and created.metadata.generation == 1
    scale = apps.read_namespaced_deployment_scale("d", ns)
    assert scale.spec.replicas == 2 and scale.status.selector == "app=d"
    apps.patch_namespaced_deployment_scale("d", ns, {"spec": {"replicas": 3}})
    assert apps.read_namespaced_deployment("d", ns).spec.replicas == 3
    res = client.ResourceV1Api(api)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}}}
    res.create_namespaced_resource_claim(ns, claim)
    claims = res.list_namespaced_resource_claim(ns)
    assert [c.metadata.name for c in claims.items] == ["c"]
    assert claims.items[0].spec.devices.requests[0].exactly.count == 1
