"""Measured usage against a real containerd: a container that burns CPU and
holds memory, one that sleeps, and the node itself."""

from __future__ import annotations

import asyncio

import orjson

from kubeplane.api.quantity import parse_quantity
from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.stats import StatsProvider
from kubeplane.api.usage import parse_report

from nodetest import BUSYBOX

MI = 1024 * 1024


async def _run_pod(cri: CRIClient, name: str, command: list[str], log_dir: str) -> tuple[str, str]:
    """A sandbox (metadata as the kubelet sets it) with one running container."""
    meta = pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="stats")
    cfg = pb.PodSandboxConfig(metadata=meta, hostname=name, log_directory=log_dir)
    sid = (await cri.runtime("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))).pod_sandbox_id
    cc = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="main"), image=pb.ImageSpec(image=BUSYBOX),
                            command=command, log_path="main.log")
    cid = (await cri.runtime("CreateContainer", pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=cc, sandbox_config=cfg))).container_id
    await cri.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
    return sid, cid


async def _remove(cri: CRIClient, sid: str) -> None:
    await cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    await cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sid))


def _container(usage, uid: str) -> dict[str, str]:
    pod = next(p for p in usage.pods if p["uid"] == uid)
    assert [c["name"] for c in pod["containers"]] == ["main"]
    return pod["containers"][0]["usage"]


async def test_burning_container_measured_idle_one_near_zero(containerd, tmp_path):
    sandboxes: list[str] = []
    async with CRIClient(containerd.endpoint) as cri:
        try:
            # 48 MiB in a tmpfs the container writes (charged to its cgroup), then a busy loop
            sid, _ = await _run_pod(cri, "burn", [
                "sh", "-c", "head -c 50331648 /dev/zero > /dev/shm/fill; while :; do :; done"], str(tmp_path))
            sandboxes.append(sid)
            sid, _ = await _run_pod(cri, "idle", ["sleep", "3600"], str(tmp_path))
            sandboxes.append(sid)
            await asyncio.sleep(0.5)

            stats = StatsProvider(cri, min_window=1.0)
            first = await stats.usage()
            assert first.window_seconds >= 1.0
            burn, idle = _container(first, "uid-burn"), _container(first, "uid-idle")
            assert parse_quantity(burn["cpu"]) >= parse_quantity("150m"), burn
            assert parse_quantity(burn["memory"]) >= 40 * MI, burn
            assert parse_quantity(idle["cpu"]) < parse_quantity("50m"), idle
            assert parse_quantity(idle["memory"]) < 8 * MI, idle
            assert {p["namespace"] for p in first.pods if p["uid"] in ("uid-burn", "uid-idle")} == {"stats"}
            # the node runs the burning container: at least that much cpu, and memory in use
            assert parse_quantity(first.node["cpu"]) >= parse_quantity("150m"), first.node
            assert parse_quantity(first.node["memory"]) >= 40 * MI, first.node

            # the next window is rated from the previous sample's counters
            await asyncio.sleep(1.2)
            second = await stats.usage()
            assert second.timestamp > first.timestamp and second.window_seconds >= 1.0
            assert parse_quantity(_container(second, "uid-burn")["cpu"]) >= parse_quantity("150m")
            assert parse_quantity(_container(second, "uid-idle")["cpu"]) < parse_quantity("50m")

            # what the Lease carries parses as the metrics API reads it
            report = parse_report(second.report())
            assert report is not None and report.window == f"{second.window_seconds:g}s"
            ns, name, containers = report.pods["uid-burn"]
            assert (ns, name, [c for c, _ in containers]) == ("stats", "burn", ["main"])
            assert set(report.node) == {"cpu", "memory"}

            # a pod whose sandbox stopped is no longer reported
            await _remove(cri, sandboxes.pop(0))
            await asyncio.sleep(0.6)
            third = await stats.usage()
            assert "uid-burn" not in {p["uid"] for p in third.pods}
            assert "uid-idle" in {p["uid"] for p in third.pods}
            assert orjson.loads(third.report())["pods"]
        finally:
            for sid in sandboxes:
                await _remove(cri, sid)


async def test_new_container_rated_over_its_life(containerd, tmp_path):
    async with CRIClient(containerd.endpoint) as cri:
        stats = StatsProvider(cri, min_window=0.5)
        await stats.usage()
        sid, _ = await _run_pod(cri, "late", ["sh", "-c", "while :; do :; done"], str(tmp_path))
        try:
            await asyncio.sleep(0.8)
            usage = await stats.usage()
            assert parse_quantity(_container(usage, "uid-late")["cpu"]) >= parse_quantity("100m")
        finally:
            await _remove(cri, sid)


async def test_runtime_gone_still_reports_the_node(tmp_path):
    async with CRIClient(f"unix://{tmp_path}/none.sock", timeout=1.0) as cri:
        stats = StatsProvider(cri, min_window=0.2)
        usage = await stats.usage()
        assert usage.pods == []
        assert parse_quantity(usage.node["memory"]) > 0 and "cpu" in usage.node
