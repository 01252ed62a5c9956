"""``kubectl top`` shows what a real container uses: the report measured from
containerd goes into the node's Lease as a node agent sends it, and the API
server's metrics.k8s.io serves it to real kubectl."""

from __future__ import annotations

import asyncio
import os
import re

from kubeplane.api.quantity import parse_quantity
from kubeplane.api.resources import resource
from kubeplane.client.http import HttpClient
from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.stats import StatsProvider
from kubeplane.api.usage import USAGE_ANNOTATION
from kubeplane.testing import Cluster

from nodetest import BUSYBOX

NODES, PODS, LEASES = resource("nodes"), resource("pods"), resource("leases")
KUBECTL = "/usr/bin/kubectl"


async def kubectl(kubeconfig: str, home: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", kubeconfig, *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "HOME": home})
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def test_kubectl_top_pod_and_node_show_measured_usage(containerd, tmp_path):
    home = str(tmp_path / "home")
    os.makedirs(home)
    async with Cluster() as cluster, CRIClient(containerd.endpoint) as cri:
        client = HttpClient.from_kubeconfig(cluster.kubeconfig)
        sid = None
        try:
            await client.create(NODES, {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
                                        "status": {"capacity": {"cpu": "2", "memory": "4Gi"},
                                                   "allocatable": {"cpu": "2", "memory": "4Gi"}}})
            pod = await client.create(PODS, {"metadata": {"name": "burner", "namespace": "default"}, "spec": {
                "nodeName": "n1", "containers": [{"name": "burn", "image": BUSYBOX}]}}, "default")
            uid = pod["metadata"]["uid"]
            # the pod's sandbox and container, named as the kubelet names them
            meta = pb.PodSandboxMetadata(name="burner", uid=uid, namespace="default")
            cfg = pb.PodSandboxConfig(metadata=meta, hostname="burner", log_directory=str(tmp_path))
            sid = (await cri.runtime("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))).pod_sandbox_id
            cc = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="burn"), image=pb.ImageSpec(image=BUSYBOX),
                command=["sh", "-c", "head -c 33554432 /dev/zero > /dev/shm/fill; while :; do :; done"],
                log_path="burn.log")
            cid = (await cri.runtime("CreateContainer", pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=cc, sandbox_config=cfg))).container_id
            await cri.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
            await asyncio.sleep(0.5)

            stats = StatsProvider(cri)
            report = await stats.report()
            await client.create(LEASES, {
                "metadata": {"name": "n1", "namespace": "kube-node-lease", "annotations": {USAGE_ANNOTATION: report}},
                "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40,
                         "renewTime": _now_micro()}}, "kube-node-lease")

            rc, out, err = await kubectl(cluster.kubeconfig, home, "top", "pod", "burner", "--containers")
            assert rc == 0, err
            lines = [ln.split() for ln in out.splitlines()]
            assert lines[0] == ["POD", "NAME", "CPU(cores)", "MEMORY(bytes)"]
            assert lines[1][:2] == ["burner", "burn"]
            cpu, mem = lines[1][2], lines[1][3]
            assert re.fullmatch(r"\d+m", cpu) and parse_quantity(cpu) >= parse_quantity("150m"), cpu
            assert re.fullmatch(r"\d+Mi", mem) and parse_quantity(mem) >= parse_quantity("30Mi"), mem

            rc, out, err = await kubectl(cluster.kubeconfig, home, "top", "node", "n1")
            assert rc == 0, err
            row = out.splitlines()[1].split()
            assert row[0] == "n1" and parse_quantity(row[1]) >= parse_quantity("150m"), row
            assert parse_quantity(row[3]) >= parse_quantity("30Mi"), row
        finally:
            if sid is not None:
                await cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sid))
                await cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
            await client.close()


def _now_micro() -> str:
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
