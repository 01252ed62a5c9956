"""KubeRuntime against a real containerd: sandboxes, containers and the pod status."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import uuid

import pytest

from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.kuberuntime import KubeRuntime

from conftest import BUSYBOX


def make_pod(name: str, containers: list[dict], **spec) -> dict:
    for c in containers:
        c.setdefault("image", BUSYBOX)
        c.setdefault("imagePullPolicy", "Never")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"containers": containers, "nodeName": "n1", "terminationGracePeriodSeconds": 2, **spec},
            "status": {"phase": "Pending"}}


@pytest.fixture
async def runtime(containerd, tmp_path):
    cri = CRIClient(containerd.endpoint)
    rt = KubeRuntime(cri, node_name="n1", pods_dir=str(tmp_path / "pods"), logs_dir=str(tmp_path / "logs"),
                     host_ips=["127.0.0.1"])
    made: list[str] = []
    rt.made = made
    try:
        yield rt
    finally:
        for uid in made:
            await rt.remove_pod(uid)
        await cri.close()


async def sync_until(rt: KubeRuntime, pod: dict, pred, timeout: float = 20.0) -> dict:
    if pod["metadata"]["uid"] not in rt.made:
        rt.made.append(pod["metadata"]["uid"])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        pod["status"] = await rt.sync_pod(pod)
        if pred(pod["status"]):
            return pod["status"]
        assert loop.time() < deadline, f"timed out; status: {pod['status']}"
        await asyncio.sleep(0.2)


def cond(status: dict, t: str) -> str:
    return next(c["status"] for c in status["conditions"] if c["type"] == t)


async def test_running_pod_status_and_termination(runtime, containerd):
    pod = make_pod("web", [{"name": "main", "command": ["sh", "-c", "echo started; exec sleep 60"]}])
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    assert ipaddress.ip_address(st["podIP"]) in ipaddress.ip_network(containerd.pod_cidr)
    assert st["podIPs"] == [{"ip": st["podIP"]}] and st["hostIP"] == "127.0.0.1"
    assert st["qosClass"] == "BestEffort" and st["startTime"]
    assert {c["type"]: c["status"] for c in st["conditions"]} == {
        "PodReadyToStartContainers": "True", "Initialized": "True", "Ready": "True",
        "ContainersReady": "True", "PodScheduled": "True"}
    cs = st["containerStatuses"][0]
    assert cs["name"] == "main" and cs["ready"] and cs["started"] and cs["restartCount"] == 0
    assert "running" in cs["state"] and cs["containerID"].startswith("containerd://")
    assert cs["imageID"].startswith("sha256:") and cs["image"] == BUSYBOX
    # the log as upstream lays it out
    md = pod["metadata"]
    log = os.path.join(runtime.logs_dir, f"default_web_{md['uid']}", "main", "0.log")
    for _ in range(50):
        if os.path.exists(log) and open(log).read():
            break
        await asyncio.sleep(0.1)
    assert open(log).read().split(" ", 3)[1:] == ["stdout", "F", "started\n"]
    # a second sync changes nothing
    again = await runtime.sync_pod(pod)
    assert again["containerStatuses"][0]["containerID"] == cs["containerID"]
    # adoption: the runtime's labels name the pod
    found = [p for p in await runtime.running_pods() if p.uid == md["uid"]]
    assert found and found[0].name == "web" and found[0].namespace == "default"
    assert [c.name for c in found[0].containers] == ["main"]
    # sleep ignores nothing: SIGTERM ends it at once
    final = await runtime.terminate_pod(pod, 2)
    term = final["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] in (137, 143) and term["reason"] == "Error"
    assert cond(final, "PodReadyToStartContainers") == "False"
    await runtime.remove_pod(md["uid"])
    assert not [p for p in await runtime.running_pods() if p.uid == md["uid"]]


async def test_pod_that_exits_succeeds(runtime):
    pod = make_pod("once", [{"name": "job", "command": ["sh", "-c", "echo done"]}], restartPolicy="Never")
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Succeeded")
    t = st["containerStatuses"][0]["state"]["terminated"]
    assert t["exitCode"] == 0 and t["reason"] == "Completed"
    assert cond(st, "Ready") == "False"
    assert next(c for c in st["conditions"] if c["type"] == "Ready")["reason"] == "PodCompleted"
    # the sandbox of a finished pod is stopped
    assert cond(st, "PodReadyToStartContainers") == "False"
