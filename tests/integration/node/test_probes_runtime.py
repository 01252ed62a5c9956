"""Probes driving the real runtime: a liveness failure restarts the container,
readiness gates the Ready condition, a startup probe holds liveness back, and
lifecycle hooks run through the prober. The test runs a pod worker's loop:
sync the pod, hand the status to the prober, sleep until a probe result
changes (or a relist period passes)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.kuberuntime import KubeRuntime
from kubeplane.node.prober import ProbeManager

from nodetest import BUSYBOX

WEB = ["sh", "-c", "mkdir -p /www && echo ok > /www/healthz && touch /tmp/alive && exec httpd -f -p 8080 -h /www"]


def make_pod(name: str, containers: list[dict], **spec) -> dict:
    for c in containers:
        c.setdefault("image", BUSYBOX)
        c.setdefault("imagePullPolicy", "Never")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"containers": containers, "nodeName": "n1", "terminationGracePeriodSeconds": 2, **spec},
            "status": {"phase": "Pending"}}


class Node:
    """A runtime and a prober wired as the agent wires them."""

    def __init__(self, containerd, tmp_path):
        self.cri = CRIClient(containerd.endpoint)
        self.wakes: dict[str, asyncio.Event] = {}
        self.prober = ProbeManager(self.cri, self.wake)
        self.rt = KubeRuntime(self.cri, node_name="n1", pods_dir=str(tmp_path / "pods"),
                              logs_dir=str(tmp_path / "logs"), prober=self.prober, host_ips=["127.0.0.1"])
        self.pods: list[str] = []

    def wake(self, uid: str) -> None:
        self.wakes.setdefault(uid, asyncio.Event()).set()

    async def sync_until(self, pod: dict, pred, timeout: float = 30.0) -> dict:
        uid = pod["metadata"]["uid"]
        if uid not in self.pods:
            self.pods.append(uid)
        wake = self.wakes.setdefault(uid, asyncio.Event())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.prober.add_pod(pod)
            status = await self.rt.sync_pod(pod)
            pod["status"] = status
            if pred(pod["status"]):
                return pod["status"]
            assert loop.time() < deadline, f"timed out; status: {pod['status']}"
            try:
                await asyncio.wait_for(wake.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
            wake.clear()

    async def exec(self, pod: dict, name: str, cmd: list[str]) -> pb.ExecSyncResponse:
        cid = next(s["containerID"] for s in pod["status"]["containerStatuses"] if s["name"] == name)
        return await self.cri.runtime("ExecSync", pb.ExecSyncRequest(
            container_id=cid.split("://", 1)[-1], cmd=cmd, timeout=5))

    async def close(self):
        for uid in self.pods:
            self.prober.remove_pod(uid)
            await self.rt.remove_pod(uid)
        await self.prober.close()
        await self.cri.close()


@pytest.fixture
async def node(containerd, tmp_path):
    n = Node(containerd, tmp_path)
    try:
        yield n
    finally:
        await n.close()


def cond(status: dict, t: str) -> str:
    return next((c["status"] for c in status.get("conditions") or [] if c["type"] == t), "")


def web(st: dict) -> dict:
    return st["containerStatuses"][0]


async def test_liveness_failure_restarts_the_container(node):
    pod = make_pod("live", [{
        "name": "web", "command": WEB,
        "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 1,
                          "failureThreshold": 2},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}}])
    st = await node.sync_until(pod, lambda s: cond(s, "Ready") == "True")
    first = web(st)["containerID"]
    assert web(st)["ready"] and web(st)["started"] and web(st)["restartCount"] == 0
    assert (await node.exec(pod, "web", ["rm", "/tmp/alive"])).exit_code == 0
    st = await node.sync_until(pod, lambda s: web(s)["restartCount"] == 1 and cond(s, "Ready") == "True")
    assert web(st)["containerID"] != first
    assert "terminated" in web(st)["lastState"]
    assert not node.prober.liveness_failed(web(st)["containerID"])


async def test_readiness_gates_ready(node):
    pod = make_pod("ready", [{
        "name": "app", "command": ["sleep", "300"],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1,
                           "failureThreshold": 1}}])
    st = await node.sync_until(pod, lambda s: "running" in web(s)["state"])
    await asyncio.sleep(1.5)
    st = await node.sync_until(pod, lambda s: True)
    assert cond(st, "Ready") == "False" and cond(st, "ContainersReady") == "False" and not web(st)["ready"]
    await node.exec(pod, "app", ["touch", "/tmp/ready"])
    st = await node.sync_until(pod, lambda s: cond(s, "Ready") == "True")
    assert web(st)["ready"] and cond(st, "ContainersReady") == "True"
    await node.exec(pod, "app", ["rm", "/tmp/ready"])
    st = await node.sync_until(pod, lambda s: cond(s, "Ready") == "False")
    assert not web(st)["ready"] and web(st)["restartCount"] == 0  # unready is not restarted


async def test_startup_probe_holds_back_liveness(node):
    pod = make_pod("startup", [{
        "name": "app", "command": ["sleep", "300"],
        "startupProbe": {"exec": {"command": ["test", "-f", "/tmp/started"]}, "periodSeconds": 1,
                         "failureThreshold": 60},
        # would fail at once: it must not run before the start
        "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/started"]}, "periodSeconds": 1,
                          "failureThreshold": 1}}])
    st = await node.sync_until(pod, lambda s: "running" in web(s)["state"])
    await asyncio.sleep(2.5)
    st = await node.sync_until(pod, lambda s: True)
    assert web(st)["started"] is False and web(st)["restartCount"] == 0 and cond(st, "Ready") == "False"
    await node.exec(pod, "app", ["touch", "/tmp/started"])
    st = await node.sync_until(pod, lambda s: cond(s, "Ready") == "True")
    assert web(st)["started"] is True and web(st)["restartCount"] == 0


async def test_post_start_hook_through_the_prober(node):
    pod = make_pod("hook", [{
        "name": "app", "command": ["sleep", "300"],
        "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "echo from-hook > /tmp/hook"]}}}}])
    await node.sync_until(pod, lambda s: cond(s, "Ready") == "True")
    r = await node.exec(pod, "app", ["cat", "/tmp/hook"])
    assert r.stdout == b"from-hook\n"
    # a failing hook: the container is killed, its status carries the prober's message
    bad = make_pod("badhook", [{
        "name": "app", "command": ["sleep", "300"],
        "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "echo nope >&2; exit 3"]}}}}])
    st = await node.sync_until(bad, lambda s: (web(s)["state"].get("waiting") or {}).get("reason")
                               == "PostStartHookError")
    assert web(st)["state"]["waiting"]["message"] == (
        'Exec lifecycle hook ([sh -c echo nope >&2; exit 3]) for Container "app" in Pod '
        f'"badhook_default({bad["metadata"]["uid"]})" failed - error: command \'sh -c echo nope >&2; exit 3\' '
        'exited with 3: nope\n, message: "nope\\n"')
