"""kubeplane.testing.Cluster: the sync and async forms, real kubectl and the
official client against it, apply and wait_for, a whole cluster running a
Deployment, and clean-up (no thread, port or temporary file left behind)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.testing import Cluster, ManifestError, WaitTimeout

from conftest import KUBECTL

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx
"""


def kubectl(c: Cluster, *args: str, stdin: str | None = None, home: str) -> subprocess.CompletedProcess:
    return subprocess.run([KUBECTL, "--kubeconfig", c.kubeconfig, "--cache-dir", os.path.join(home, "cache"), *args],
                          input=stdin, capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=home))


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def assert_released(port: int, tmpdir: str, threads_before: set[threading.Thread]) -> None:
    """Nothing of a stopped cluster is left: its threads, its port, its files."""
    left = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert left == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not os.path.exists(tmpdir)


def test_sync_cluster_serves_kubectl_and_leaves_nothing_behind(tmp_path):
    before = set(threading.enumerate())
    with Cluster() as c:
        assert c.url.startswith("https://127.0.0.1:") and os.path.isfile(c.kubeconfig)
        assert any(t.name == "kubeplane-testing" for t in threading.enumerate())
        out = kubectl(c, "get", "namespaces", "-o", "name", home=str(tmp_path))
        assert out.returncode == 0, out.stderr
        assert "namespace/default" in out.stdout.split()
        applied = kubectl(c, "apply", "-f", "-", stdin=DEPLOYMENT, home=str(tmp_path))
        assert applied.returncode == 0, applied.stderr
        # What kubectl wrote is what the in-process side sees, and the reverse.
        assert c.get("deployments", "web")["spec"]["replicas"] == 3
        c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-python}\ndata: {k: v}\n")
        got = kubectl(c, "get", "configmap", "from-python", "-o", "jsonpath={.data.k}", home=str(tmp_path))
        assert got.stdout == "v"
        port, tmpdir = port_of(c.url), os.path.dirname(c.kubeconfig)
    assert not c.running and c.url == ""
    assert_released(port, tmpdir, before)


def test_official_client_through_api_client():
    from kubernetes import client as k8s

    with Cluster() as c:
        api = c.api_client()
        core = k8s.CoreV1Api(api)
        names = [ns.metadata.name for ns in core.list_namespace().items]
        assert {"default", "kube-system"} <= set(names)
        body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="cm"), data={"a": "1"})
        core.create_namespaced_config_map("default", body)
        assert c.wait_for("configmaps", "cm", jsonpath="{.data.a}=1")["data"] == {"a": "1"}
        with pytest.raises(k8s.ApiException) as err:
            core.read_namespaced_config_map("missing", "default")
        assert err.value.status == 404
        assert json.loads(err.value.body)["reason"] == "NotFound"
    assert c._api_clients == []


def test_apply_is_server_side_apply(tmp_path):
    with Cluster() as c:
        first = c.apply("""
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, labels: {tier: a}}
data: {one: "1", two: "2"}
""")
        assert first[0]["metadata"]["resourceVersion"]
        # Another manager's field survives a re-apply; this manager's dropped field goes.
        other = c.apply({"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": "settings"}, "data": {"other": "x"}},
                                        field_manager="someone-else")
        assert other[0]["data"] == {"one": "1", "two": "2", "other": "x"}
        again = c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {one: '1'}\n")
        assert again[0]["data"] == {"one": "1", "other": "x"}
        assert "labels" not in again[0]["metadata"]
        managers = {m["manager"] for m in again[0]["metadata"]["managedFields"]}
        assert managers == {"kubeplane-testing", "someone-else"}
        # Without force, taking another manager's field is a conflict, as kubectl apply --server-side.
        with pytest.raises(StatusError) as err:
            c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {other: y}\n",
                    force=False)
        assert err.value.code == 409 and err.value.reason == "Conflict"
        assert c.get("configmaps", "settings")["data"]["other"] == "x"

        # Files and directories, several documents, namespaces.
        (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n")
        (tmp_path / "b.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n"
            "apiVersion: v1\nkind: Secret\nmetadata: {name: y}\nstringData: {p: q}\n")
        objs = c.apply(tmp_path / "a.yaml")
        assert objs[0]["kind"] == "Namespace"
        objs = c.apply(str(tmp_path), namespace="team")
        assert [(o["kind"], o["metadata"].get("namespace")) for o in objs] == \
            [("Namespace", None), ("ConfigMap", "team"), ("Secret", "team")]
        assert c.get("secrets", "y", namespace="team")["data"] == {"p": "cQ=="}

        # Refusals as kubectl's: unknown fields, unknown kinds, namespace clashes.
        with pytest.raises(StatusError) as err:
            c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: z}\ndatta: {a: b}\n")
        assert err.value.code == 400 and 'unknown field "datta"' in str(err.value)
        c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: z}\ndatta: {a: b}\n", validate="Ignore")
        with pytest.raises(ManifestError, match='no matches for kind "Widget" in version "example.com/v1"'):
            c.apply("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n")
        with pytest.raises(ManifestError, match="does not match the namespace"):
            c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: q, namespace: a}\n", namespace="b")
        with pytest.raises(StatusError) as err:
            c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: q, namespace: nowhere}\n")
        assert err.value.code == 404


def test_wait_for_conditions_deletion_and_timeouts():
    with Cluster() as c:
        c.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {app: x}}\n"
                "spec: {containers: [{name: c, image: i}]}\n")

        def mark_ready() -> None:
            time.sleep(0.2)
            c.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                    subresource="status", field_manager="kubelet")

        t = threading.Thread(target=mark_ready)
        t.start()
        pod = c.wait_for("pods", "p", condition="Ready", timeout=10)
        t.join()
        assert pod["status"]["phase"] == "Running"
        assert c.wait_for("pod/p", jsonpath="{.status.phase}=Running")["metadata"]["name"] == "p"
        assert c.wait_for("pods", "p", for_="condition=Ready=True")["metadata"]["name"] == "p"
        assert c.wait_for("pods", "p", condition=lambda o: o["status"]["phase"] == "Running")
        listed = c.wait_for("pods", label_selector="app=x", condition="Ready")
        assert [o["metadata"]["name"] for o in listed] == ["p"]

        with pytest.raises(WaitTimeout) as err:
            c.wait_for("pods", "p", condition="Ready=False", timeout=0.3)
        assert "condition=Ready=False on pods/p in namespace default" in str(err.value)
        assert '"phase": "Running"' in str(err.value) and err.value.last[0]["metadata"]["name"] == "p"
        with pytest.raises(WaitTimeout, match="raised KeyError"):
            c.wait_for("pods", "p", condition=lambda o: o["status"]["podIP"], timeout=0.3)
        with pytest.raises(WaitTimeout, match="none exist"):
            c.wait_for("pods", label_selector="app=nothing", timeout=0.3)

        # An object created while waiting (--for=create), then deleted while waiting.
        def later(fn) -> threading.Thread:
            th = threading.Thread(target=lambda: (time.sleep(0.2), fn()))
            th.start()
            return th

        th = later(lambda: c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: late}\n"))
        assert c.wait_for("configmaps", "late", timeout=10)["metadata"]["name"] == "late"
        th.join()
        th = later(lambda: c.delete("configmaps", "late"))
        assert c.wait_for("configmaps", "late", delete=True, timeout=10) is None
        th.join()
        assert c.wait_for("configmaps", "never-existed", delete=True, timeout=1) is None
        assert c.delete("configmaps", "never-existed") is None
        with pytest.raises(StatusError):
            c.delete("configmaps", "never-existed", ignore_not_found=False)
        with pytest.raises(ValueError, match="not condition and delete"):
            c.wait_for("pods", "p", condition="Ready", delete=True)


def test_whole_cluster_runs_a_deployment(tmp_path):
    with Cluster(scheduler=True, controllers=True, nodes=3) as c:
        nodes = kubectl(c, "get", "nodes", "-o", "name", home=str(tmp_path))
        assert nodes.stdout.split() == ["node/node-0", "node/node-1", "node/node-2"]
        c.apply(DEPLOYMENT)
        c.wait_for("deployments", "web", condition="Available", timeout=30)
        c.wait_for("deployments", "web", jsonpath="{.status.readyReplicas}=3", timeout=30)
        pods = c.wait_for("pods", label_selector="app=web", jsonpath="{.status.phase}=Running", timeout=30)
        assert len(pods) == 3 and all(p["spec"]["nodeName"].startswith("node-") for p in pods)
        out = kubectl(c, "get", "pods", "-l", "app=web", "--no-headers", home=str(tmp_path))
        assert out.returncode == 0 and out.stdout.count("Running") == 3, out.stdout + out.stderr


def test_api_only_cluster_runs_no_components():
    with Cluster() as c:
        c.apply(DEPLOYMENT)
        # Without controllers nothing makes pods; the wait times out.
        with pytest.raises(WaitTimeout):
            c.wait_for("pods", label_selector="app=web", timeout=0.5)
        assert c.get("deployments", "web").get("status", {}).get("replicas") is None
        with pytest.raises(WaitTimeout):
            c.wait_for("nodes", timeout=0.2)


def test_sqlite_cleanup_when_the_body_raises(tmp_path):
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="boom"):
        with Cluster(storage="sqlite") as c:
            assert c.data_dir and os.path.isdir(c.data_dir)
            assert c.data_dir.startswith(os.path.dirname(c.kubeconfig))
            c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kept}\n")
            port, tmpdir = port_of(c.url), os.path.dirname(c.kubeconfig)
            raise RuntimeError("boom")
    assert_released(port, tmpdir, before)

    # A data_dir given is kept, and a second cluster on it sees the data.
    data = tmp_path / "data"
    with Cluster(storage="sqlite", data_dir=data) as c:
        c.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kept}\ndata: {a: b}\n")
    assert data.is_dir()
    with Cluster(storage="sqlite", data_dir=data) as c:
        assert c.get("configmaps", "kept")["data"] == {"a": "b"}


def test_failed_start_leaves_nothing_behind():
    before = set(threading.enumerate())
    tmp_before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    with pytest.raises(ManifestError, match="no matches for kind"):
        Cluster(manifests="apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n").__enter__()
    assert [t for t in threading.enumerate() if t not in before] == []
    left = {n for n in set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - tmp_before
            if n.startswith("kubeplane-testing-")}
    assert left == set()
    with pytest.raises(ValueError, match="data_dir applies to storage='sqlite'"):
        Cluster(data_dir="x")
    with pytest.raises(ValueError, match="nodes must be a count"):
        Cluster(nodes=-1)


def test_manifests_are_applied_before_the_cluster_is_handed_over(tmp_path):
    (tmp_path / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: pre}\n")
    with Cluster(manifests=[tmp_path / "ns.yaml",
                            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: pre}\n"]) as c:
        assert c.get("configmaps", "c", namespace="pre")["metadata"]["namespace"] == "pre"


def test_a_cluster_runs_once_at_a_time_and_can_run_again():
    c = Cluster()
    with c:
        with pytest.raises(RuntimeError, match="already running"):
            c.__enter__()
        first = c.url
    with pytest.raises(RuntimeError, match="not running"):
        c.get("namespaces", "default")
    with c:
        assert c.url and c.get("namespaces", "default")
    assert first


async def test_async_cluster_in_the_callers_loop(tmp_path):
    from kubeplane.client.http import HttpClient
    from kubeplane.api.resources import resource

    before = set(threading.enumerate())
    async with Cluster() as c:
        # No thread of its own: the server runs in this loop.
        assert set(threading.enumerate()) == before
        objs = await c.apply_async(DEPLOYMENT)
        assert objs[0]["kind"] == "Deployment"
        # A blocking call from this loop would deadlock; it is refused.
        with pytest.raises(RuntimeError, match="apply_async"):
            c.apply(DEPLOYMENT)
        http = HttpClient.from_kubeconfig(c.kubeconfig)
        try:
            got = await http.get(resource("deployments"), "web", "default")
            assert got["spec"]["replicas"] == 3
        finally:
            await http.close()
        # kubectl as an asyncio subprocess (the loop keeps serving).
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", c.kubeconfig, "--cache-dir", str(tmp_path / "cache"), "get", "deploy", "web",
            "-o", "jsonpath={.spec.replicas}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=dict(os.environ, HOME=str(tmp_path)))
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert out.decode() == "3", err.decode()
        # A blocking client from a worker thread works.
        from kubernetes import client as k8s

        apps = k8s.AppsV1Api(c.api_client())
        dep = await asyncio.to_thread(apps.read_namespaced_deployment, "web", "default")
        assert dep.spec.replicas == 3
        before |= {t for t in threading.enumerate() if t.name.startswith("asyncio_")}  # this loop's executor
        waiter = asyncio.ensure_future(c.wait_for_async("deployments", "web", jsonpath="{.spec.replicas}=5"))
        await asyncio.sleep(0)
        assert not waiter.done()
        await c.apply_async(DEPLOYMENT.replace("replicas: 3", "replicas: 5"))
        assert (await asyncio.wait_for(waiter, 10))["spec"]["replicas"] == 5
        port, tmpdir = port_of(c.url), os.path.dirname(c.kubeconfig)
    assert_released(port, tmpdir, before)


async def test_async_methods_of_a_threaded_cluster_from_another_loop():
    with Cluster() as c:
        await c.apply_async("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bridged}\n")
        got = await c.wait_for_async("configmaps", "bridged", timeout=5)
        assert got["metadata"]["name"] == "bridged"
        assert (await c.get_async("configmaps", "bridged"))["kind"] == "ConfigMap"


def _failing_stop(c: Cluster) -> None:
    """Make the server's stop fail after it has stopped."""
    server = c._server
    original = server.stop

    async def stop() -> None:
        await original()
        raise OSError("store close failed")

    server.stop = stop


def test_a_failing_stop_is_raised_unless_the_block_raised():
    before = set(threading.enumerate())
    with pytest.raises(OSError, match="store close failed"):
        with Cluster() as c:
            _failing_stop(c)
            port, tmpdir = port_of(c.url), os.path.dirname(c.kubeconfig)
    assert_released(port, tmpdir, before)
    with pytest.raises(KeyError, match="the block's"):
        with Cluster() as c:
            _failing_stop(c)
            raise KeyError("the block's")
    assert not c.running


def test_a_start_slower_than_start_timeout_fails_cleanly():
    before = set(threading.enumerate())
    with pytest.raises(TimeoutError, match="did not start within 0.001s"):
        with Cluster(scheduler=True, controllers=True, nodes=3, start_timeout=0.001):
            pass
    assert [t for t in threading.enumerate() if t not in before] == []


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_thread_runs_the_loop_kubeplane_runtime_picks(monkeypatch, choice):
    import uvloop

    monkeypatch.setenv("KUBEPLANE_EVENT_LOOP", choice)
    with Cluster() as c:
        assert isinstance(c._loop, uvloop.Loop) == (choice == "uvloop")
        assert c.get("namespaces", "default")["metadata"]["name"] == "default"


def test_components_are_chosen_one_by_one():
    with Cluster(controllers=True, nodes=2) as c:
        nodes = c.wait_for("nodes", label_selector="", condition="Ready", timeout=10)
        assert [n["metadata"]["name"] for n in nodes] == ["node-0", "node-1"]
        c.apply(DEPLOYMENT)
        # The ReplicaSet controller makes the pods; with no scheduler they stay unbound.
        c.wait_for("replicasets", label_selector="app=web", jsonpath="{.status.replicas}=3", timeout=10)
        pods = c.wait_for("pods", label_selector="app=web", condition=lambda pod: pod["status"]["phase"] == "Pending")
        assert len(pods) == 3 and all("nodeName" not in p["spec"] for p in pods)
        # A condition runs in the cluster's event loop: calling the cluster from it is refused, not a deadlock.
        with pytest.raises(RuntimeError, match="get_async"):
            c.wait_for("pods", label_selector="app=web", condition=lambda pod: c.get("pods", pod["metadata"]["name"]))
