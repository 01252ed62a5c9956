"""Pod volumes read and written from inside real containers (containerd through the CRI): the mounts
the volume manager makes, what the containers see, updates in place, read-only mounts, subPath,
tmpfs, and a ServiceAccount token from a real API server."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid

import pytest

from kubeplane.api.resources import resource
from kubeplane.auth import jwt
from kubeplane.client.http import HttpClient
from kubeplane.client.kubeconfig import load_kubeconfig
from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.volumes import VolumeManager, is_shared, make_rshared, mount, mounts_under, unmount
from kubeplane.testing import Cluster

from conftest import BUSYBOX

CMS = resource("configmaps")
SECRETS = resource("secrets")
SAS = resource("serviceaccounts")
PODS = resource("pods")


class _Sandbox:
    """One pod sandbox; containers started in it are removed with it."""

    def __init__(self, cri: CRIClient, pod: dict, log_dir: str) -> None:
        self.cri, self.pod, self.log_dir = cri, pod, log_dir
        md = pod["metadata"]
        self.config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=md["name"], uid=md["uid"], namespace=md["namespace"]),
            hostname=md["name"], log_directory=log_dir)
        self.id = ""

    async def __aenter__(self) -> "_Sandbox":
        self.id = (await self.cri.runtime("RunPodSandbox", pb.RunPodSandboxRequest(config=self.config))).pod_sandbox_id
        return self

    async def __aexit__(self, *exc) -> None:
        await self.cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=self.id))
        await self.cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=self.id))

    async def start(self, name: str, mounts: list, command: list[str]) -> str:
        cc = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=BUSYBOX),
                                command=command, mounts=mounts, log_path=f"{name}.log")
        cid = (await self.cri.runtime("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=self.id, config=cc, sandbox_config=self.config))).container_id
        await self.cri.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
        return cid

    async def run(self, name: str, mounts: list, script: str, timeout: float = 15.0) -> tuple[int, str]:
        """Runs ``sh -c script`` to its end: exit code and stdout."""
        cid = await self.start(name, mounts, ["sh", "-c", script])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            st = (await self.cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid))).status
            if st.state == pb.CONTAINER_EXITED:
                break
            assert loop.time() < deadline, f"container {name} still running"
            await asyncio.sleep(0.05)
        out = []
        with open(os.path.join(self.log_dir, f"{name}.log")) as f:
            for line in f:
                _, stream, _, text = line.rstrip("\n").split(" ", 3)
                if stream == "stdout":
                    out.append(text)
        return st.exit_code, "\n".join(out)

    async def exec(self, cid: str, script: str) -> tuple[int, str]:
        r = await self.cri.runtime("ExecSync", pb.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", script],
                                                                  timeout=10))
        return r.exit_code, r.stdout.decode()


@pytest.fixture
async def api(tmp_path):
    async with Cluster() as c:
        client = HttpClient(load_kubeconfig(c.kubeconfig))
        try:
            yield client
        finally:
            await client.close()


@pytest.fixture
async def volumes(api, tmp_path):
    vm = VolumeManager(api, str(tmp_path / "pods"), node_name="n1", local_volumes_dir=str(tmp_path / "local"),
                       resync_seconds=0.3)
    try:
        yield vm
    finally:
        await vm.close()
        for uid in vm.pod_uids_on_disk():
            await vm.teardown(uid)
        assert mounts_under(str(tmp_path)) == []


def _pod(volumes, containers):
    return {"metadata": {"name": "vols", "namespace": "default", "uid": str(uuid.uuid4()),
                         "labels": {"app": "demo"}},
            "spec": {"nodeName": "n1", "volumes": volumes, "containers": containers}}


async def test_containers_read_config_secret_downward_and_see_updates(containerd, api, volumes, tmp_path):
    await api.create(CMS, {"metadata": {"name": "cfg"}, "data": {"greeting": "hello", "app.conf": "x=1"}},
                     "default")
    await api.create(SECRETS, {"metadata": {"name": "sec"}, "data": {
        "password": base64.b64encode(b"s3cret").decode()}}, "default")
    mounts = [{"name": "cfg", "mountPath": "/etc/cfg"},
              {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
              {"name": "sec", "mountPath": "/etc/sec"},
              {"name": "info", "mountPath": "/etc/info"},
              {"name": "scratch", "mountPath": "/scratch"},
              {"name": "mem", "mountPath": "/mem"},
              {"name": "scratch", "mountPath": "/deep", "subPath": "a/b"}]
    pod = _pod([{"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o400}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}}],
               [{"name": "reader", "volumeMounts": mounts}, {"name": "long", "volumeMounts": mounts[:1]}])
    await volumes.setup(pod)
    ms = volumes.mounts(pod, pod["spec"]["containers"][0])
    async with CRIClient(containerd.endpoint) as cri:
        async with _Sandbox(cri, pod, str(tmp_path / "logs")) as sb:
            code, out = await sb.run("reader", ms, (
                "cat /etc/cfg/greeting; echo; cat /etc/app.conf; echo; cat /etc/sec/password; echo; "
                "stat -L -c %a /etc/sec/password; cat /etc/info/labels; echo; "
                "echo data > /scratch/made; echo deep > /deep/f; "
                "grep ' /mem ' /proc/mounts | cut -d' ' -f3; df -k /mem | tail -1 | awk '{print $2}'; "
                "if echo x > /etc/cfg/new 2>/dev/null; then echo writable; else echo read-only; fi"))
            assert code == 0, out
            assert out.splitlines() == ["hello", "x=1", "s3cret", "400", 'app="demo"', "tmpfs", "4096", "read-only"]
            scratch = volumes.volume_dir(pod["metadata"]["uid"], "kubernetes.io~empty-dir", "scratch")
            with open(os.path.join(scratch, "made")) as f:
                assert f.read() == "data\n"
            with open(os.path.join(scratch, "a", "b", "f")) as f:
                assert f.read() == "deep\n"

            # a running container sees a changed ConfigMap and changed labels without a restart
            long = await sb.start("long", volumes.mounts(pod, pod["spec"]["containers"][1]), ["sleep", "3600"])
            assert await sb.exec(long, "cat /etc/cfg/greeting") == (0, "hello")
            await api.patch(CMS, "cfg", {"data": {"greeting": "bonjour", "app.conf": "x=1"}}, "default")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while (await sb.exec(long, "cat /etc/cfg/greeting"))[1] != "bonjour":
                assert loop.time() < deadline, "the container never saw the new ConfigMap"
                await asyncio.sleep(0.1)
            await cri.runtime("StopContainer", pb.StopContainerRequest(container_id=long, timeout=0))
    await volumes.teardown(pod["metadata"]["uid"])
    assert not os.path.exists(volumes.pod_dir(pod["metadata"]["uid"]))


async def test_container_reads_its_service_account_token(containerd, api, volumes, tmp_path):
    await api.create(SAS, {"metadata": {"name": "robot"}}, "default")
    await api.create(CMS, {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "CA"}}, "default")
    pod = await api.create(PODS, {"metadata": {"name": "tok"}, "spec": {
        "serviceAccountName": "robot", "containers": [{"name": "c", "image": BUSYBOX}]}}, "default")
    await volumes.setup(pod)
    ms = volumes.mounts(pod, pod["spec"]["containers"][0])
    async with CRIClient(containerd.endpoint) as cri:
        async with _Sandbox(cri, pod, str(tmp_path / "logs")) as sb:
            code, out = await sb.run("c", ms, "cd /var/run/secrets/kubernetes.io/serviceaccount && "
                                              "cat namespace; echo; cat ca.crt; echo; cat token")
    assert code == 0
    namespace, ca, token = out.splitlines()
    assert (namespace, ca) == ("default", "CA")
    claims = jwt.unverified(token)[1]
    assert claims["sub"] == "system:serviceaccount:default:robot"
    assert claims["kubernetes.io"]["pod"]["uid"] == pod["metadata"]["uid"]


async def test_host_to_container_propagation_from_a_shared_node_dir(containerd, api, tmp_path):
    base = str(tmp_path / "node")
    os.makedirs(base)
    assert make_rshared(base) and is_shared(base)
    assert not make_rshared(base)  # already shared: nothing more
    vm = VolumeManager(api, os.path.join(base, "pods"), node_name="n1")
    later = ""
    try:
        pod = _pod([{"name": "scratch", "emptyDir": {}}], [{"name": "c", "volumeMounts": [
            {"name": "scratch", "mountPath": "/s", "mountPropagation": "HostToContainer"}]}])
        await vm.setup(pod)
        async with CRIClient(containerd.endpoint) as cri:
            async with _Sandbox(cri, pod, str(tmp_path / "logs")) as sb:
                cid = await sb.start("c", vm.mounts(pod, pod["spec"]["containers"][0]), ["sleep", "3600"])
                # a mount the host makes in the volume once the container runs shows inside it
                later = os.path.join(vm.volume_dir(pod["metadata"]["uid"], "kubernetes.io~empty-dir", "scratch"),
                                     "later")
                os.makedirs(later)
                mount("tmpfs", later, "tmpfs", 0, "size=1m")
                with open(os.path.join(later, "f"), "w") as f:
                    f.write("from the host")
                assert await sb.exec(cid, "cat /s/later/f") == (0, "from the host")
                await cri.runtime("StopContainer", pb.StopContainerRequest(container_id=cid, timeout=0))
    finally:
        if later:
            unmount(later, detach=True)
        await vm.close()
        for uid in vm.pod_uids_on_disk():
            await vm.teardown(uid)
        while base in mounts_under(base):
            unmount(base, detach=True)
    assert mounts_under(str(tmp_path)) == []
