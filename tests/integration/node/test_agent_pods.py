"""Pods on a real node, end to end: kubectl creates them, the scheduler binds
them, the node agent runs them in containerd and reports their status."""

from __future__ import annotations

import ipaddress
import json
import time

from kubeplane.node.cri.client import pb

from conftest import BUSYBOX


def _pod(name: str, command: list[str], *, restart: str = "Always", grace: int | None = None, **spec) -> str:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": restart,
                     "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": command}], **spec}}
    if grace is not None:
        body["spec"]["terminationGracePeriodSeconds"] = grace
    return json.dumps(body)


def _get(node, name: str, ns: str = "default") -> dict:
    return json.loads(node.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout)


def _wait(node, name: str, pred, timeout: float = 60.0, ns: str = "default") -> dict:
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        proc = node.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
        if proc.returncode == 0:
            pod = json.loads(proc.stdout)
            if pred(pod):
                return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {name} never got there; last: {json.dumps((pod or {}).get('status'))[:2000]}")


def _gone(node, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.kubectl("get", "pod", name, check=False).returncode != 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"pod {name} still there")


def _sandboxes(node, uid: str):
    resp = node.run(node.agent.cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(label_selector={"io.kubernetes.pod.uid": uid}))))
    return list(resp.items)


def _containers(node, uid: str):
    resp = node.run(node.agent.cri.runtime("ListContainers", pb.ListContainersRequest(
        filter=pb.ContainerFilter(label_selector={"io.kubernetes.pod.uid": uid}))))
    return list(resp.containers)


def test_node_is_ready_in_kubectl(real_node):
    out = real_node.kubectl("get", "nodes", "-o", "wide").stdout
    line = next(l for l in out.splitlines() if l.startswith(real_node.name))
    assert " Ready " in line and "containerd://" in line


def test_a_pod_that_prints_and_exits_succeeds(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("once", ["sh", "-c", "echo hello from the pod"],
                                                     restart="Never"))
    pod = _wait(real_node, "once", lambda p: p.get("status", {}).get("phase") == "Succeeded")
    st = pod["status"]
    assert st["hostIP"] == "127.0.0.1"
    (cs,) = st["containerStatuses"]
    term = cs["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    assert cs["containerID"].startswith("containerd://") and cs["imageID"]
    # the log file the CRI wrote, where upstream's kubelet keeps it
    md = pod["metadata"]
    import glob
    import os

    logs = glob.glob(os.path.join(real_node.data_dir, "logs", f"default_once_{md['uid']}", "main", "0.log"))
    assert logs and "hello from the pod" in open(logs[0]).read()
    real_node.kubectl("delete", "pod", "once", "--wait=true", timeout=90)
    _gone(real_node, "once")
    # once the pod is gone from the API, its sandbox, containers and log files go too
    deadline = time.monotonic() + 20
    while (_sandboxes(real_node, md["uid"]) or _containers(real_node, md["uid"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandboxes(real_node, md["uid"]) == [] and _containers(real_node, md["uid"]) == []
    assert not os.path.exists(os.path.dirname(os.path.dirname(logs[0])))


def test_running_pod_gets_an_ip_is_ready_and_deletes_gracefully(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("runner", ["sleep", "3600"], grace=3))
    pod = _wait(real_node, "runner", lambda p: any(
        c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])))
    st = pod["status"]
    assert st["phase"] == "Running"
    assert ipaddress.ip_address(st["podIP"]) in ipaddress.ip_network(real_node.pod_cidr)
    assert st["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert st["qosClass"] == "BestEffort"
    uid = pod["metadata"]["uid"]
    assert len(_sandboxes(real_node, uid)) == 1
    started = time.monotonic()
    real_node.kubectl("delete", "pod", "runner", "--wait=true", timeout=90)
    _gone(real_node, "runner")
    # sleep ignores nothing: SIGTERM ends it at once, well before the grace period
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 20
    while _sandboxes(real_node, uid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandboxes(real_node, uid) == []


def test_agent_restart_adopts_running_containers(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("adopted", ["sleep", "3600"], grace=1))
    pod = _wait(real_node, "adopted", lambda p: p.get("status", {}).get("phase") == "Running")
    before = pod["status"]["containerStatuses"][0]
    real_node.restart_agent()
    time.sleep(3)  # a few relists and syncs
    after = _get(real_node, "adopted")["status"]["containerStatuses"][0]
    assert after["containerID"] == before["containerID"]
    assert after["restartCount"] == 0 and "running" in after["state"]
    uid = pod["metadata"]["uid"]
    assert len([c for c in _containers(real_node, uid) if c.state == pb.CONTAINER_RUNNING]) == 1
    real_node.kubectl("delete", "pod", "adopted", "--wait=true", timeout=90)


def test_orphaned_containers_are_removed(real_node):
    """A pod force-deleted while the agent was away: its containers go when it is back."""
    real_node.kubectl("apply", "-f", "-", input=_pod("orphan", ["sleep", "3600"], grace=1))
    pod = _wait(real_node, "orphan", lambda p: p.get("status", {}).get("phase") == "Running")
    uid = pod["metadata"]["uid"]
    real_node.run(real_node.agent.stop())
    real_node.kubectl("delete", "pod", "orphan", "--grace-period=0", "--force")
    real_node.run(real_node.agent.start())
    deadline = time.monotonic() + 30
    while (_sandboxes(real_node, uid) or _containers(real_node, uid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandboxes(real_node, uid) == [] and _containers(real_node, uid) == []


def test_crash_looping_container_restarts_with_backoff(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("crasher", ["sh", "-c", "exit 3"], grace=1))
    pod = _wait(real_node, "crasher", lambda p: any(
        c.get("restartCount", 0) >= 1 and (c.get("state", {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for c in p.get("status", {}).get("containerStatuses", [])), timeout=60)
    cs = pod["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] == 3
    assert cs["lastState"]["terminated"]["reason"] == "Error"
    real_node.kubectl("delete", "pod", "crasher", "--wait=true", timeout=90)


def test_lease_carries_the_measured_usage_and_the_kubelet_port_is_reported(real_node):
    from kubeplane.registry.metrics import USAGE_ANNOTATION

    real_node.kubectl("apply", "-f", "-", input=_pod("busy", ["sh", "-c", "while :; do :; done"], grace=1))
    _wait(real_node, "busy", lambda p: p.get("status", {}).get("phase") == "Running")
    deadline = time.monotonic() + 60
    report = None
    while time.monotonic() < deadline:
        lease = json.loads(real_node.kubectl("get", "lease", "-n", "kube-node-lease", real_node.name,
                                             "-o", "json").stdout)
        report = json.loads((lease["metadata"].get("annotations") or {}).get(USAGE_ANNOTATION) or "{}")
        if any(p.get("name") == "busy" for p in report.get("pods") or []):
            break
        time.sleep(1)
    assert any(p.get("name") == "busy" for p in report.get("pods") or []), report
    node = json.loads(real_node.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert port == real_node.agent.server.port > 0
    real_node.kubectl("delete", "pod", "busy", "--wait=true", timeout=90)


def test_node_events(real_node):
    out = json.loads(real_node.kubectl("get", "events", "-n", "default", "--field-selector",
                                       f"involvedObject.kind=Node,involvedObject.name={real_node.name}",
                                       "-o", "json").stdout)
    reasons = {e["reason"]: e for e in out["items"]}
    assert {"Starting", "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID",
            "NodeReady"} <= set(reasons)
    assert reasons["NodeReady"]["message"] == f"Node {real_node.name} status is now: NodeReady"
    assert reasons["Starting"]["source"]["component"] == "kubelet"


def test_pods_beyond_max_pods_are_rejected(real_node, tmp_path_factory, image_archives):
    """A node admits pods bound to it up to its pods allocatable, as upstream's kubelet."""
    from conftest import RealNode

    small = RealNode(real_node.cluster, str(tmp_path_factory.mktemp("small-node")), name="small-0",
                     busybox_archive=image_archives["busybox"], max_pods=1)
    try:
        small.start()
        for name in ("first", "second"):
            body = json.loads(_pod(name, ["sleep", "3600"], grace=1))
            body["spec"]["nodeName"] = "small-0"
            real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
            if name == "first":
                _wait(real_node, "first", lambda p: p.get("status", {}).get("phase") == "Running")
        pod = _wait(real_node, "second", lambda p: p.get("status", {}).get("phase") == "Failed")
        assert pod["status"]["reason"] == "OutOfpods"
        assert pod["status"]["message"] == ("Pod was rejected: Node didn't have enough resource: pods, "
                                            "requested: 1, used: 1, capacity: 1")
        assert _containers(small, pod["metadata"]["uid"]) == []
        real_node.kubectl("delete", "pod", "first", "second", "--wait=true", timeout=90)
    finally:
        small.stop()
