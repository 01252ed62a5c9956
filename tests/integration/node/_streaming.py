"""Pods started through the CRI directly, labelled as upstream's kuberuntime
labels them (the kubelet API finds containers by these labels)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid

from kubeplane.node.cri.client import CRIClient, CRIError, pb
from kubeplane.streaming import spdy

from conftest import BUSYBOX


class CRIPod:
    def __init__(self, cri: CRIClient, name: str, namespace: str, log_dir: str) -> None:
        self.cri, self.name, self.namespace, self.log_dir = cri, name, namespace, log_dir
        self.uid = str(uuid.uuid4())
        self.sandbox_id = ""
        self.config: pb.PodSandboxConfig | None = None
        self.restarts: dict[str, int] = {}

    def labels(self) -> dict[str, str]:
        return {"io.kubernetes.pod.name": self.name, "io.kubernetes.pod.namespace": self.namespace,
                "io.kubernetes.pod.uid": self.uid}

    async def start(self) -> None:
        self.config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=self.name, uid=self.uid, namespace=self.namespace),
            hostname=self.name, log_directory=self.log_dir, labels=self.labels())
        self.sandbox_id = (await self.cri.runtime("RunPodSandbox", pb.RunPodSandboxRequest(
            config=self.config))).pod_sandbox_id

    async def container(self, name: str, command: list[str], *, tty: bool = False, stdin: bool = False,
                        stdin_once: bool = False, start: bool = True) -> str:
        attempt = self.restarts.get(name, -1) + 1
        self.restarts[name] = attempt
        cc = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt), image=pb.ImageSpec(image=BUSYBOX),
            command=command, log_path=f"{name}/{attempt}.log", tty=tty, stdin=stdin, stdin_once=stdin_once,
            labels={**self.labels(), "io.kubernetes.container.name": name},
            annotations={"io.kubernetes.container.restartCount": str(attempt)})
        cid = (await self.cri.runtime("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=self.sandbox_id, config=cc, sandbox_config=self.config))).container_id
        if start:
            await self.cri.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
        return cid

    async def ip(self) -> str:
        st = await self.cri.runtime("PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=self.sandbox_id))
        return st.status.network.ip

    async def remove(self) -> None:
        if not self.sandbox_id:
            return
        for method, req in (("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=self.sandbox_id)),
                            ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=self.sandbox_id))):
            with contextlib.suppress(CRIError):
                await self.cri.runtime(method, req)


@contextlib.asynccontextmanager
async def cri_pod(cri: CRIClient, name: str, log_dir: str, namespace: str = "default"):
    pod = CRIPod(cri, name, namespace, log_dir)
    try:
        await pod.start()
        yield pod
    finally:
        await pod.remove()


def held_streaming_bytes() -> int:
    """The bytes this process holds for streaming sessions: what SPDY streams
    received and nobody read yet, and what transports have not sent yet."""
    total = 0
    for o in gc.get_objects():
        if isinstance(o, spdy.Stream):
            total += o.buffered
        elif isinstance(o, asyncio.WriteTransport) and not o.is_closing():
            total += o.get_write_buffer_size()
    return total


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
