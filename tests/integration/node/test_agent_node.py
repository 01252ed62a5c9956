"""The node agent's Node, Lease and images directory against a real containerd
(the session's ``containerd`` fixture), acting as system:node:<name> with a
client certificate of the cluster's CA."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time

import pytest

from kubeplane.node import host
from kubeplane.node.agent import AgentConfig, NodeAgent
from kubeplane.node.cri.client import CRIClient
from kubeplane.node.images import build_busybox_image, ImageConfig

from conftest import BUSYBOX, PAUSE, node_kubeconfig
from helpers import eventually


@pytest.fixture(scope="module")
def cluster():
    from kubeplane.testing import Cluster

    with Cluster() as c:
        yield c


def _kubectl(cluster, *args):
    out = subprocess.run(["kubectl", "--kubeconfig", cluster.kubeconfig, *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


async def _with_agent(cluster, containerd, tmp_path, name, body, **config):
    from kubeplane.client.http import HttpClient

    kc = node_kubeconfig(cluster, name, str(tmp_path / "kubelet.kubeconfig"))
    client = HttpClient.from_kubeconfig(kc)
    cri = CRIClient(containerd.endpoint)
    cfg = AgentConfig(name=name, data_dir=str(tmp_path / "data"), node_ip="127.0.0.1", **config)
    agent = NodeAgent(client, cri, cfg, containerd_address=containerd.address)
    try:
        await agent.start_node()
        return await body(agent)
    finally:
        await agent.stop()
        await cri.close()
        await client.close()


def test_registers_a_measured_node(cluster, containerd, tmp_path):
    async def body(agent):
        return agent.node

    asyncio.run(_with_agent(cluster, containerd, tmp_path, "reg-1", body, max_pods=50,
                            system_reserved={"cpu": "500m", "memory": "1Gi"}, kubelet_port=10333,
                            pod_cidr="10.252.7.0/24"))
    node = json.loads(_kubectl(cluster, "get", "node", "reg-1", "-o", "json"))
    st = node["status"]
    mem = host.meminfo()["MemTotal"]
    assert st["capacity"]["cpu"] == str(os.cpu_count())
    assert st["capacity"]["memory"] == f"{mem // 1024}Ki"
    assert st["capacity"]["pods"] == "50"
    disk = os.statvfs(str(tmp_path))
    assert st["capacity"]["ephemeral-storage"] == f"{disk.f_blocks * disk.f_frsize // 1024}Ki"
    # allocatable: minus --system-reserved and the hard eviction threshold (100Mi)
    cpus = os.cpu_count()
    assert st["allocatable"]["cpu"] == (f"{cpus * 1000 - 500}m")
    assert st["allocatable"]["memory"] == f"{(mem - 1024 ** 3 - 100 * 1024 ** 2) // 1024}Ki"
    total = disk.f_blocks * disk.f_frsize
    assert int(st["allocatable"]["ephemeral-storage"]) == total - total // 10
    assert {"type": "InternalIP", "address": "127.0.0.1"} in st["addresses"]
    assert {"type": "Hostname", "address": "reg-1"} in st["addresses"]
    assert st["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10333}}
    info = st["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert info["kernelVersion"] == os.uname().release
    assert info["architecture"] == host.go_arch() and info["operatingSystem"] == "linux"
    assert info["bootID"] and info["machineID"]
    names = [n for im in st["images"] for n in im["names"]]
    assert BUSYBOX in names and PAUSE in names
    assert all(im["sizeBytes"] > 0 for im in st["images"])
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Ready"]["reason"] == "KubeletReady"
    assert conds["MemoryPressure"]["reason"] == "KubeletHasSufficientMemory"
    assert conds["DiskPressure"]["status"] == "False" and conds["PIDPressure"]["status"] == "False"
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "reg-1" and labels["kubernetes.io/os"] == "linux"
    assert node["spec"]["podCIDR"] == "10.252.7.0/24"
    # kubectl's own view
    wide = _kubectl(cluster, "get", "node", "reg-1", "-o", "wide")
    assert "Ready" in wide and "127.0.0.1" in wide and "containerd://" in wide


def test_lease_renewed_as_upstream(cluster, containerd, tmp_path):
    async def body(agent):
        first = await agent.renew_lease()
        await asyncio.sleep(0.01)
        second = await agent.renew_lease()
        return agent.node, first, second

    node, first, second = asyncio.run(_with_agent(cluster, containerd, tmp_path, "lease-1", body))
    assert first["spec"]["holderIdentity"] == "lease-1"
    assert first["spec"]["leaseDurationSeconds"] == 40
    assert second["spec"]["renewTime"] > first["spec"]["renewTime"]
    assert second["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "lease-1", "uid": node["metadata"]["uid"]}]
    got = json.loads(_kubectl(cluster, "get", "lease", "-n", "kube-node-lease", "lease-1", "-o", "json"))
    assert got["spec"]["renewTime"] == second["spec"]["renewTime"]


def test_lease_recreated_after_deletion(cluster, containerd, tmp_path):
    async def body(agent):
        await agent.renew_lease()
        _kubectl(cluster, "delete", "lease", "-n", "kube-node-lease", "lease-2")
        return await agent.renew_lease()

    lease = asyncio.run(_with_agent(cluster, containerd, tmp_path, "lease-2", body))
    assert lease["spec"]["holderIdentity"] == "lease-2"
    _kubectl(cluster, "get", "lease", "-n", "kube-node-lease", "lease-2")


def test_node_not_ready_without_cni_and_ready_once_pod_cidr_is_set(cluster, tmp_path, image_archives):
    """A containerd with no CNI configuration is not network-ready; the agent
    waits for spec.podCIDR, writes the bridge configuration, and turns Ready."""
    from kubeplane.node.containerd import ManagedContainerd

    ctd = ManagedContainerd(str(tmp_path / "ctd"), sandbox_image=PAUSE)

    async def main():
        from kubeplane.client.http import HttpClient

        await ctd.start()
        kc = node_kubeconfig(cluster, "cidr-1", str(tmp_path / "kubelet.kubeconfig"))
        client = HttpClient.from_kubeconfig(kc)
        cri = CRIClient(ctd.endpoint)
        cfg = AgentConfig(name="cidr-1", data_dir=str(tmp_path / "data"), node_ip="127.0.0.1",
                          cni_conf_dir=ctd.paths.cni_conf_dir, cni_bridge="kpcidr%d" % (os.getpid() % 10000))
        agent = NodeAgent(client, cri, cfg, containerd_address=ctd.address)
        try:
            await agent.start_node()
            ready = {c["type"]: c for c in agent.node["status"]["conditions"]}["Ready"]
            assert ready["status"] == "False" and ready["reason"] == "KubeletNotReady"
            assert "container runtime network not ready: NetworkReady=false" in ready["message"]
            assert agent.pod_cidr is None
            # what the node IPAM controller does (as the admin)
            await asyncio.to_thread(_kubectl, cluster, "patch", "node", "cidr-1", "-p",
                                    '{"spec":{"podCIDR":"10.252.9.0/24","podCIDRs":["10.252.9.0/24"]}}')
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                conds = {c["type"]: c for c in agent.node["status"]["conditions"]}
                if conds["Ready"]["status"] == "True":
                    break
                await asyncio.sleep(0.2)
            assert conds["Ready"]["status"] == "True", conds["Ready"]
            conf = json.load(open(os.path.join(ctd.paths.cni_conf_dir, "10-kubeplane.conflist")))
            assert conf["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.252.9.0/24"}]]
        finally:
            await agent.stop()
            await cri.close()
            await client.close()

    try:
        asyncio.run(main())
    finally:
        asyncio.run(ctd.stop())
        ctd.remove()


def test_images_dir_imported_at_start_and_when_a_file_appears(cluster, containerd, tmp_path, image_archives):
    images = tmp_path / "images"
    images.mkdir()
    first = "kubeplane.local/imgdir-first:1"
    second = "kubeplane.local/imgdir-second:1"
    build_busybox_image(str(images / "first.tar"), first, config=ImageConfig(cmd=["true"]))
    (images / "notes.txt").write_text("not an image")

    async def body(agent):
        names = [n for im in agent.node["status"]["images"] for n in im["names"]]
        assert first in names and second not in names
        # a file appearing (written elsewhere, moved in, as one should)
        build_busybox_image(str(tmp_path / "second.tar"), second, config=ImageConfig(cmd=["false"]))
        shutil.move(str(tmp_path / "second.tar"), str(images / "second.tar"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            names = [n for im in agent.node["status"]["images"] for n in im["names"]]
            if second in names:
                return names
            await asyncio.sleep(0.2)
        raise AssertionError(f"{second} never reported: {names}")

    try:
        asyncio.run(_with_agent(cluster, containerd, tmp_path, "img-1", body, images_dir=str(images),
                                images_poll_period=0.2))
        node = json.loads(_kubectl(cluster, "get", "node", "img-1", "-o", "json"))
        assert second in [n for im in node["status"]["images"] for n in im["names"]]
    finally:
        for ref in (first, second):
            subprocess.run(["ctr", "--address", containerd.address, "-n", "k8s.io", "images", "rm", ref],
                           capture_output=True)


def test_pod_cgroups_with_a_containerd_the_node_does_not_own(cluster, containerd, tmp_path):
    """--cri-socket: the runtime's verbose status tells its cgroup driver (cgroupfs here), and
    the node's pods still run in their pod cgroup, which goes with the pod."""
    from kubeplane.api.resources import resource
    from kubeplane.node.agent import ManagedNode

    from nodetest import own_cgroup_root, remove_cgroup_root

    root = own_cgroup_root("ext-1")
    pods = resource("pods")

    async def main():
        from kubeplane.client.http import HttpClient

        kc = node_kubeconfig(cluster, "ext-1", str(tmp_path / "kubelet.kubeconfig"))
        client = HttpClient.from_kubeconfig(kc)
        admin = HttpClient.from_kubeconfig(cluster.kubeconfig)
        cfg = AgentConfig(name="ext-1", data_dir=str(tmp_path / "data"), node_ip="127.0.0.1", kubelet_port=0,
                          pod_cidr=containerd.pod_cidr, cgroup_root=root)
        node = ManagedNode(client, cfg, cri_socket=containerd.endpoint, containerd_address=containerd.address)
        try:
            await node.start()
            assert node.containerd is None and node.agent.cgroups is not None
            pod = await admin.create(pods, {"metadata": {"name": "ext-pod"}, "spec": {
                "nodeName": "ext-1", "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"],
                                "resources": {"limits": {"cpu": "100m", "memory": "24Mi"}}}]}}, "default")
            uid = pod["metadata"]["uid"]
            deadline = time.monotonic() + 60
            while (await admin.get(pods, "ext-pod", "default")).get("status", {}).get("phase") != "Running":
                assert time.monotonic() < deadline, "the pod never ran"
                await asyncio.sleep(0.2)
            pod_cgroup = f"/sys/fs/cgroup/memory{root}/kubepods/pod{uid}"  # Guaranteed: right under kubepods
            assert open(f"{pod_cgroup}/memory.limit_in_bytes").read().strip() == str(24 << 20)
            assert [d for d in os.listdir(pod_cgroup) if os.path.isdir(os.path.join(pod_cgroup, d))]
            await admin.delete(pods, "ext-pod", "default")
            deadline = time.monotonic() + 60
            while os.path.exists(pod_cgroup):
                assert time.monotonic() < deadline, "the pod's cgroup stayed"
                await asyncio.sleep(0.2)
        finally:
            if node.agent is not None and node.agent.runtime is not None:
                for uid in list(node.agent.cgroups.pods):  # a failed test's pod: its containers and cgroup
                    await node.agent.runtime.remove_pod(uid)
            await node.stop()
            await client.close()
            await admin.close()

    try:
        asyncio.run(main())
    finally:
        remove_cgroup_root(root)


def test_runs_the_service_proxy_and_removes_its_rules_when_stopped(cluster, containerd, tmp_path):
    """``AgentConfig.proxy``: the agent runs the Service proxy as its node (the pod CIDR as the pods'
    addresses); here it programs a network namespace of the test's, never the host's ruleset."""
    from kubeplane.proxy import ProxyConfig

    netns = f"kpagent{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    nft = ["ip", "netns", "exec", netns, "nft"]
    try:
        cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "agent-web"},
                       "spec": {"ports": [{"port": 80}]}})
        cluster.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                       "metadata": {"name": "agent-web-1", "labels": {"kubernetes.io/service-name": "agent-web"}},
                       "addressType": "IPv4", "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
                       "endpoints": [{"addresses": ["10.252.9.7"], "nodeName": "proxy-1"}]})
        ip = cluster.get("services", "agent-web")["spec"]["clusterIP"]

        async def body(agent):
            proxier = agent.service_proxy.proxier("ipv4")

            def programmed():
                out = subprocess.run([*nft, "list", "table", "ip", "kube-proxy"], capture_output=True, text=True)
                return out.returncode == 0 and f"{ip} . tcp . 80 : goto service-" in out.stdout and out.stdout

            table = await eventually(programmed, what="the agent's proxy programmed the Service")
            assert "ip saddr != 10.252.9.0/24" in table  # ClusterIP traffic from off the node is masqueraded
            assert "10.252.9.7 . 10.252.9.7 . tcp . 8080" in table  # the endpoint is this node's: hairpin
            assert proxier.config.node_ips == ["127.0.0.1"]

        asyncio.run(_with_agent(cluster, containerd, tmp_path, "proxy-1", body, pod_cidr="10.252.9.0/24",
                                proxy=ProxyConfig(node_name="", command_prefix=["ip", "netns", "exec", netns])))
        listed = subprocess.run([*nft, "list", "tables"], capture_output=True, text=True)
        assert listed.returncode == 0 and "kube-proxy" not in listed.stdout
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        cluster.delete("services", "agent-web")
        cluster.delete("endpointslices", "agent-web-1")
