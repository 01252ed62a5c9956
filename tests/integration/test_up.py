"""``kubeplane up``: a working cluster with simulated nodes, driven by kubectl,
in one process and with ``--split`` (components in a second process)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import Kubectl, start_server


@pytest.fixture(scope="module", params=["one-process", "split"])
def cluster(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up")
    extra = ["--nodes", "3", "--node-cpu", "2"] + (["--split"] if request.param == "split" else [])
    srv = start_server(tmp, storage="sqlite", command="up", extra=extra)
    yield srv, Kubectl(srv.kubeconfig, tmp / "home")
    srv.stop()


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_nodes_are_ready(cluster):
    _, kubectl = cluster
    lines = kubectl("get", "nodes").out.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATUS"]
    assert sorted(l.split()[0] for l in lines[1:]) == ["node-0", "node-1", "node-2"]
    assert all(l.split()[1] == "Ready" for l in lines[1:])


def test_pod_runs_and_deletes(cluster):
    _, kubectl = cluster
    kubectl("run", "web", "--image=nginx")
    kubectl("wait", "--for=condition=Ready", "pod/web", "--timeout=30s")
    pod = json.loads(kubectl("get", "pod", "web", "-o", "json").out)
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"].startswith("node-")
    assert pod["status"]["podIP"].startswith("10.244.")
    row = kubectl("get", "pod", "web").out.splitlines()[1].split()
    assert row[1:3] == ["1/1", "Running"]
    out = kubectl("delete", "pod", "web", "--wait", "--timeout=30s").out
    assert 'pod "web" deleted' in out
    r = kubectl("get", "pod", "web", check=False)
    assert r.rc == 1 and "NotFound" in r.err


def test_unschedulable_pod_explains_why(cluster):
    _, kubectl = cluster
    kubectl("run", "huge", "--image=nginx",
            "--overrides", '{"spec":{"containers":[{"name":"huge","image":"nginx",'
                           '"resources":{"requests":{"cpu":"64"}}}]}}')
    out = ""
    for _ in range(50):
        out = kubectl("get", "pod", "huge", "-o", "jsonpath={.status.conditions[0].message}").out
        if out:
            break
        time.sleep(0.1)
    assert out.startswith("0/3 nodes are available: 3 Insufficient cpu.")
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=huge", "-o", "json").out
    assert any(e["reason"] == "FailedScheduling" for e in json.loads(events)["items"])
    kubectl("delete", "pod", "huge")


def test_kubectl_apply_pods_wide_and_describe(cluster):
    _, kubectl = cluster
    manifest = """\
apiVersion: v1
kind: Pod
metadata: {name: fits, labels: {app: demo}}
spec:
  containers: [{name: c, image: nginx, resources: {requests: {cpu: 100m}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: toobig, labels: {app: demo}}
spec:
  containers: [{name: c, image: nginx, resources: {requests: {cpu: "32"}}}]
"""
    kubectl("apply", "-f", "-", stdin=manifest)
    kubectl("wait", "--for=condition=Ready", "pod/fits", "--timeout=30s")
    rows = {l.split()[0]: l.split() for l in kubectl("get", "pods", "-l", "app=demo", "-o", "wide").out.splitlines()[1:]}
    assert rows["fits"][6].startswith("node-")  # NODE column
    assert rows["toobig"][2] == "Pending" and rows["toobig"][6] == "<none>"
    described = ""
    for _ in range(50):
        described = kubectl("describe", "pod", "toobig").out
        if "FailedScheduling" in described:
            break
        time.sleep(0.1)
    assert "FailedScheduling" in described and "default-scheduler" in described
    assert "0/3 nodes are available: 3 Insufficient cpu." in described
    described = kubectl("describe", "pod", "fits").out
    assert "Scheduled" in described and "Successfully assigned default/fits to node-" in described
    kubectl("delete", "pod", "fits", "toobig", "--wait=false")


def test_metrics_and_configz(cluster):
    import re
    import urllib.request

    srv, kubectl = cluster
    kubectl("run", "measured", "--image=nginx")
    kubectl("wait", "--for=condition=Ready", "pod/measured", "--timeout=30s")
    kubectl("get", "nodes")
    api = kubectl("get", "--raw", "/metrics").out
    assert ('apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",'
            'scope="cluster",subresource="",verb="LIST",version="v1"}') in api
    # kubectl run: a create; the built-in components' requests do not cross HTTP and are not counted here.
    assert 'apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",' \
           'scope="resource",subresource="",verb="POST",version="v1"}' in api
    assert 'apiserver_storage_objects{resource="nodes"} 3.0' in api
    assert 'etcd_request_duration_seconds_bucket{le="0.005",operation="create",type="pods"}' in api
    # The components' endpoint (in the second process with --split), found in the log.
    found = re.findall(r"serving scheduler metrics and /configz on (http://\S+)", srv.log())
    assert found, srv.log()
    base = found[-1]
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    scheduled = re.search(r'^scheduler_schedule_attempts_total\{profile="default-scheduler",result="scheduled"\} '
                          r'(\d+)', text, re.M)
    assert scheduled and int(scheduled.group(1)) >= 1, text[:2000]
    assert re.search(r'^workqueue_adds_total\{name="\S+"\} \d', text, re.M), text[:2000]
    with urllib.request.urlopen(base + "/configz", timeout=10) as r:
        conf = json.loads(r.read())
    assert conf["componentconfig"]["LeaderElection"]["ResourceName"] == "kube-scheduler"
    assert conf["componentconfig"]["Profiles"][0]["SchedulerName"] == "default-scheduler"
    with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
        assert r.read() == b"ok"
    kubectl("delete", "pod", "measured", "--wait=false")


def _environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with."""
    raw = (Path("/proc") / str(pid) / "environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _wire_requests_are_authorized(sock: str, token: str) -> None:
    """On the --split socket: no token is 401; with the components' token, a
    request made as a user RBAC gives no rights is 403, as over HTTP, while
    the scheduler's identity may list pods."""
    import asyncio

    from kubeplane.api.errors import StatusError
    from kubeplane.api.resources import resource
    from kubeplane.auth.user import AUTHENTICATED, UserInfo, acting_as
    from kubeplane.client.wire import WireClient

    async def go() -> None:
        anonymous = WireClient(sock)
        with pytest.raises(StatusError) as exc:
            await anonymous.list(resource("pods"), "default")
        assert exc.value.code == 401
        await anonymous.close()
        c = WireClient(sock, token=token)
        try:
            with acting_as(UserInfo("alice", groups=(AUTHENTICATED,))):
                with pytest.raises(StatusError) as exc:
                    await c.list(resource("secrets"), "default")
            assert exc.value.code == 403
            assert exc.value.message == ('secrets is forbidden: User "alice" cannot list resource "secrets" in API '
                                         'group "" in the namespace "default"')
            with acting_as(UserInfo("system:kube-scheduler", groups=(AUTHENTICATED,))):
                pods = await c.list(resource("pods"), "default")
            assert "before" in [p["metadata"]["name"] for p in pods["items"]]
        finally:
            await c.close()

    asyncio.run(go())


def test_split_restarts_a_dead_components_process_and_stops_cleanly(tmp_path):
    # A data directory too deep for a Unix socket path: the socket gets a private temporary directory.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    srv = start_server(deep, storage="sqlite", command="up", extra=["--nodes", "2", "--split"])
    kubectl = Kubectl(srv.kubeconfig, tmp_path / "home")
    try:
        (child,) = [p for p in _children(srv.proc.pid) if "components" in _cmdline(p)]
        args = _cmdline(child)
        sock = args[args.index("--api-socket") + 1]
        assert os.stat(sock).st_mode & 0o077 == 0  # the socket is private to its owner
        kubectl("run", "before", "--image=nginx")
        kubectl("wait", "--for=condition=Ready", "pod/before", "--timeout=30s")
        _wire_requests_are_authorized(sock, _environ(child)["KUBEPLANE_WIRE_TOKEN"])
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 30
        fresh: list[int] = []
        while time.monotonic() < deadline and not fresh:
            time.sleep(0.1)
            fresh = [p for p in _children(srv.proc.pid) if "components" in _cmdline(p) and p != child]
        assert fresh, srv.log()
        kubectl("run", "after", "--image=nginx")  # scheduled and started by the new process
        kubectl("wait", "--for=condition=Ready", "pod/after", "--timeout=30s")
        assert "starting it again" in srv.log()
    finally:
        srv.stop()
    assert srv.proc.returncode == 0
    assert not srv.kubeconfig.exists()  # a stopped cluster leaves no kubeconfig that looks ready
    assert all(_gone(p) for p in fresh)
    assert not str(sock).startswith(str(deep)) and not os.path.exists(os.path.dirname(sock))


def test_orphaning_delete_of_a_whole_workload_never_conflicts(cluster):
    # kubectl deletes the deployments, their replica sets and pods while the
    # garbage collector strips owner references from the same objects (and the
    # controllers update them): every delete must win its race, not 409.
    _, kubectl = cluster
    kubectl("create", "namespace", "orphans")
    for round_ in range(2):
        for i in range(3):
            kubectl("-n", "orphans", "create", "deployment", f"d{i}", "--image=nginx", "--replicas=3")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pods = json.loads(kubectl("-n", "orphans", "get", "pods", "-o", "json").out)["items"]
            if len([p for p in pods if p["spec"].get("nodeName")]) == 9:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"round {round_}: the 9 pods were not scheduled")
        r = kubectl("-n", "orphans", "delete", "deployments,rs,pods", "--all", "--cascade=orphan",
                    "--wait=false", check=False)
        assert r.rc == 0 and "Conflict" not in r.err and "cannot be fulfilled" not in r.err, r
        deleted = [line for line in r.out.splitlines() if line.endswith(" deleted")]
        assert len(deleted) == 3 + 3 + 9, r.out
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = kubectl("-n", "orphans", "get", "deployments,rs,pods", "-o", "name").out.split()
            if not left:
                break
            time.sleep(0.2)
        assert left == [], left


def test_a_deleted_namespace_is_emptied_and_goes(cluster):
    # one namespace controller runs: the controllers' under `up`, the API server's under `up --split`
    _, kubectl = cluster
    kubectl("create", "namespace", "doomed")
    kubectl("-n", "doomed", "create", "configmap", "c", "--from-literal=a=b")
    kubectl("-n", "doomed", "create", "deployment", "web", "--image=nginx:1.27", "--replicas=2")
    kubectl("-n", "doomed", "rollout", "status", "deployment/web", "--timeout=60s")
    kubectl("delete", "namespace", "doomed", "--timeout=60s")  # waits until it is gone
    out = kubectl("get", "namespace", "doomed", check=False)
    assert out.rc != 0 and "NotFound" in out.err
