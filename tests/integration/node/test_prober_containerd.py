"""Probes and lifecycle hooks against containers in a real containerd.

The test plays the runtime's part: it starts the sandbox and containers
through the CRI, turns their CRI status into the pod status the prober
reads, and replaces a container whose liveness probe failed."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.prober import (
    LIVENESS, READINESS, SUCCESS, HandlerError, ProbeError, ProbeManager, Result, probe_exec,
    run_handler,
)

from nodetest import BUSYBOX

HTTPD = "mkdir -p /www && echo ok > /www/healthz && touch /tmp/alive && exec httpd -f -p 8080 -h /www"


class Pod:
    """A sandbox of the test, its containers, and the pod object the prober sees."""

    def __init__(self, cri: CRIClient, name: str, log_dir: str):
        self.cri = cri
        self.name = name
        self.uid = f"uid-{name}"
        self.log_dir = log_dir
        self.sandbox_id = ""
        self.config = None
        self.ip = ""
        self.obj: dict = {"metadata": {"name": name, "namespace": "default", "uid": self.uid},
                          "spec": {"containers": [], "restartPolicy": "Always"}, "status": {}}
        self.containers: dict[str, str] = {}  # name -> CRI id

    async def start(self):
        meta = pb.PodSandboxMetadata(name=self.name, uid=self.uid, namespace="default")
        self.config = pb.PodSandboxConfig(metadata=meta, hostname=self.name, log_directory=self.log_dir)
        self.sandbox_id = (await self.cri.runtime(
            "RunPodSandbox", pb.RunPodSandboxRequest(config=self.config))).pod_sandbox_id
        st = await self.cri.runtime("PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=self.sandbox_id))
        self.ip = st.status.network.ip
        return self

    async def run(self, spec: dict, script: str, attempt: int = 0) -> str:
        name = spec["name"]
        if not any(c["name"] == name for c in self.obj["spec"]["containers"]):
            self.obj["spec"]["containers"].append(spec)
        cc = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name, attempt=attempt),
                                image=pb.ImageSpec(image=BUSYBOX), command=["sh", "-c", script],
                                log_path=f"{name}/{attempt}.log")
        cid = (await self.cri.runtime("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=self.sandbox_id, config=cc, sandbox_config=self.config))).container_id
        await self.cri.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
        self.containers[name] = cid
        return cid

    async def replace(self, name: str, script: str, attempt: int) -> str:
        old = self.containers[name]
        await self.cri.runtime("StopContainer", pb.StopContainerRequest(container_id=old, timeout=0))
        await self.cri.runtime("RemoveContainer", pb.RemoveContainerRequest(container_id=old))
        spec = next(c for c in self.obj["spec"]["containers"] if c["name"] == name)
        return await self.run(spec, script, attempt)

    async def status(self) -> dict:
        """The pod status as a runtime computes it from the CRI."""
        statuses = []
        for name, cid in self.containers.items():
            st = (await self.cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid))).status
            if st.state == pb.CONTAINER_RUNNING:
                started = dt.datetime.fromtimestamp(st.started_at / 1e9, dt.timezone.utc)
                state = {"running": {"startedAt": started.strftime("%Y-%m-%dT%H:%M:%SZ")}}
            elif st.state == pb.CONTAINER_EXITED:
                state = {"terminated": {"exitCode": st.exit_code, "reason": st.reason}}
            else:
                state = {"waiting": {"reason": "ContainerCreating"}}
            statuses.append({"name": name, "containerID": f"containerd://{cid}", "state": state,
                             "ready": False})
        return {"phase": "Running", "podIP": self.ip, "containerStatuses": statuses}

    async def remove(self):
        if self.sandbox_id:
            await self.cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=self.sandbox_id))
            await self.cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=self.sandbox_id))


@pytest.fixture
async def cri(containerd):
    async with CRIClient(containerd.endpoint) as c:
        yield c


@pytest.fixture
async def pod(cri, tmp_path, request):
    p = Pod(cri, request.node.name.replace("_", "-")[:40].strip("-"), str(tmp_path))
    try:
        await p.start()
        yield p
    finally:
        await p.remove()


async def _until(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def _wait_http(pod: Pod, cid: str):
    # httpd is up once the exec probe of its port answers
    for _ in range(100):
        r, _ = await probe_exec(pod.cri, cid, ["wget", "-q", "-O", "-", "http://127.0.0.1:8080/healthz"], 2)
        if r == Result.SUCCESS:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("httpd did not come up")


async def test_exec_probe_results(pod):
    cid = await pod.run({"name": "main"}, HTTPD)
    assert await probe_exec(pod.cri, cid, ["sh", "-c", "echo fine"], 1) == (Result.SUCCESS, "fine\n")
    result, out = await probe_exec(pod.cri, "containerd://" + cid, ["sh", "-c", "echo bad; echo worse >&2; exit 3"], 1)
    assert result == Result.FAILURE and out == "bad\nworse\n"
    t0 = time.monotonic()
    assert await probe_exec(pod.cri, cid, ["sleep", "10"], 1) == (Result.FAILURE, "command timed out")
    assert time.monotonic() - t0 < 5
    with pytest.raises(ProbeError):
        await probe_exec(pod.cri, "0" * 64, ["true"], 1)


async def test_probes_to_the_pod_ip(pod):
    cid = await pod.run({"name": "main", "ports": [{"name": "http", "containerPort": 8080}]}, HTTPD)
    await _wait_http(pod, cid)
    m = ProbeManager(pod.cri, None)
    try:
        status = await pod.status()
        c = pod.obj["spec"]["containers"][0]
        cases = [
            ({"httpGet": {"port": "http", "path": "/healthz"}}, (Result.SUCCESS, "ok\n")),
            ({"httpGet": {"port": 8080, "path": "/missing"}},
             (Result.FAILURE, "HTTP probe failed with statuscode: 404")),
            ({"tcpSocket": {"port": 8080}}, (Result.SUCCESS, "")),
            ({"tcpSocket": {"port": 8081}},
             (Result.FAILURE, f"dial tcp {pod.ip}:8081: connect: connection refused")),
            ({"exec": {"command": ["test", "-f", "/www/healthz"]}}, (Result.SUCCESS, "")),
        ]
        for spec, want in cases:
            got = await m.run_probe({"timeoutSeconds": 2, **spec}, pod.obj, status, c, f"containerd://{cid}")
            assert got == want, spec
    finally:
        await m.close()


async def test_liveness_failure_restart_and_readiness(pod):
    changes: list[str] = []

    def on_change(uid):
        changes.append(uid)

    spec = {"name": "web",
            "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 1,
                              "failureThreshold": 1},
            "readinessProbe": {"httpGet": {"port": 8080, "path": "/healthz"}, "periodSeconds": 1}}
    m = ProbeManager(pod.cri, on_change, rand=lambda: 0.0)
    try:
        cid = await pod.run(spec, HTTPD)
        m.add_pod(pod.obj)
        status = m.update_pod_status(pod.obj, await pod.status())
        assert status["containerStatuses"][0]["ready"] is False

        async def sync():
            # what the pod worker does when woken: recompute the status
            m.update_pod_status(pod.obj, await pod.status())

        await _until(lambda: m.ready(cid))
        assert m.update_pod_status(pod.obj, await pod.status())["containerStatuses"][0]["ready"] is True
        # liveness starts at Success (its first probe comes a period after the worker saw no status)
        await _until(lambda: m.result(LIVENESS, cid) == SUCCESS)
        assert pod.uid in changes

        # the container breaks: liveness fails, the "runtime" replaces the container
        await pod.cri.runtime("ExecSync", pb.ExecSyncRequest(container_id=cid, cmd=["rm", "/tmp/alive"], timeout=5))
        await _until(lambda: m.liveness_failed(cid))
        assert m.kill_reason("web", f"containerd://{cid}") == ("LivenessProbe", "Container web failed liveness probe")
        new = await pod.replace("web", HTTPD, attempt=1)
        await sync()
        assert not m.ready(new)  # a new container starts unready
        await _until(lambda: m.result(LIVENESS, new) == SUCCESS)
        assert m.result(LIVENESS, cid) is None and m.result(READINESS, cid) is None
        await _until(lambda: m.ready(new))
        await sync()
        assert m.update_pod_status(pod.obj, await pod.status())["containerStatuses"][0]["ready"] is True
    finally:
        await m.close()


async def test_lifecycle_hooks(pod):
    spec = {"name": "main"}
    cid = await pod.run(spec, HTTPD)
    await _wait_http(pod, cid)
    await run_handler(pod.cri, pod.obj, spec, f"containerd://{cid}",
                      {"exec": {"command": ["sh", "-c", "echo started > /tmp/hook"]}})
    r = await pod.cri.runtime("ExecSync", pb.ExecSyncRequest(container_id=cid, cmd=["cat", "/tmp/hook"], timeout=5))
    assert r.stdout == b"started\n"
    with pytest.raises(HandlerError) as e:
        await run_handler(pod.cri, pod.obj, spec, cid, {"exec": {"command": ["sh", "-c", "echo no >&2; exit 2"]}})
    assert e.value.message == (
        f'Exec lifecycle hook ([sh -c echo no >&2; exit 2]) for Container "main" in Pod '
        f'"{pod.name}_default({pod.uid})" failed - error: command \'sh -c echo no >&2; exit 2\' exited '
        'with 2: no\n, message: "no\\n"')
    # httpGet without a host: the pod IP comes from the sandbox the container runs in
    m = ProbeManager(pod.cri, None)
    try:
        await m.run_handler(pod.obj, spec, f"containerd://{cid}", {"httpGet": {"port": 8080, "path": "/healthz"}})
        with pytest.raises(HandlerError) as e:
            await m.run_handler(pod.obj, spec, cid, {"httpGet": {"port": 8081, "path": "/stop"}})
        assert (f'Get "http://{pod.ip}:8081/stop": dial tcp {pod.ip}:8081: connect: connection refused'
                in e.value.message)
        # a sleep hook waits its seconds
        t0 = time.monotonic()
        await m.run_handler(pod.obj, spec, cid, {"sleep": {"seconds": 1}})
        assert time.monotonic() - t0 >= 0.95
    finally:
        await m.close()
