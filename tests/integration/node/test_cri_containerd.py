"""The CRI client against a real containerd: a pod sandbox with one container."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from kubeplane.node.cri.client import CRIClient, CRIError, pb

from nodetest import BUSYBOX


async def _wait_exited(cri: CRIClient, cid: str, timeout: float = 10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        st = (await cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid))).status
        if st.state == pb.CONTAINER_EXITED:
            return st
        assert loop.time() < deadline, f"container still {pb.ContainerState.Name(st.state)}"
        await asyncio.sleep(0.05)


async def test_sandbox_container_logs_exit_code_and_network(containerd, tmp_path):
    async with CRIClient(containerd.endpoint) as cri:
        v = await cri.version()
        assert v.runtime_name == "containerd" and v.runtime_api_version == "v1"
        meta = pb.PodSandboxMetadata(name="smoke", uid="uid-smoke", namespace="default")
        cfg = pb.PodSandboxConfig(metadata=meta, hostname="smoke", log_directory=str(tmp_path))
        sid = (await cri.runtime("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))).pod_sandbox_id
        try:
            net = (await cri.runtime("PodSandboxStatus",
                                     pb.PodSandboxStatusRequest(pod_sandbox_id=sid))).status.network
            assert ipaddress.ip_address(net.ip) in ipaddress.ip_network(containerd.pod_cidr)
            cc = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="main"), image=pb.ImageSpec(image=BUSYBOX),
                command=["sh", "-c", "echo hello from $(hostname); echo oops >&2; exit 3"],
                log_path="main/0.log")
            cid = (await cri.runtime("CreateContainer", pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=cc, sandbox_config=cfg))).container_id
            await cri.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
            st = await _wait_exited(cri, cid)
            assert st.exit_code == 3 and st.reason == "Error"
            lines = (tmp_path / "main" / "0.log").read_text().splitlines()
            # stdout and stderr are separate pipes: their order is not kept
            assert sorted(ln.split(" ", 3)[1:] for ln in lines) == [
                ["stderr", "F", "oops"], ["stdout", "F", "hello from smoke"]]
        finally:
            await cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sid))
            await cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
        with pytest.raises(CRIError) as e:
            await cri.runtime("PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=sid))
        assert e.value.not_found
