"""``kubeplane proxy`` as a process, with a node's identity, programming a test namespace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from kubeplane.testing import Cluster

from helpers import eventually_sync, node_kubeconfig
from netns_topology import topology  # noqa: F401 - the fixture

CLI = [sys.executable, "-m", "kubeplane.cli.main"]


def _env() -> dict:
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH", "")] if p)
    return env


def _nft(topology, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*topology.prefix, "nft", *args], capture_output=True, text=True)


def test_kubeplane_proxy_programs_the_namespace_as_the_node_and_removes_its_table_on_sigterm(topology, tmp_path):
    with Cluster() as cluster:
        kc = node_kubeconfig(cluster, "node-a", str(tmp_path / "node.kubeconfig"))  # system:nodes may read
        cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cli"},
                       "spec": {"ports": [{"port": 8080, "targetPort": 80}]}})
        cluster.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                       "metadata": {"name": "cli-1", "labels": {"kubernetes.io/service-name": "cli"}},
                       "addressType": "IPv4", "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
                       "endpoints": [{"addresses": [topology.pods["pod2"]]}]})
        ip = cluster.get("services", "cli")["spec"]["clusterIP"]
        log = open(tmp_path / "proxy.log", "wb")
        proc = subprocess.Popen(CLI + ["proxy", "--kubeconfig", kc, "--node-name", "node-a", "--netns", topology.node],
                                stdout=log, stderr=subprocess.STDOUT, env=_env())
        try:
            def answered():
                out = subprocess.run([*topology.prefix, "busybox", "wget", "-qO-", f"http://{ip}:8080/"],
                                     capture_output=True, text=True, timeout=10)
                return out.returncode == 0 and out.stdout.strip() == "pod2"

            eventually_sync(answered, timeout=30, what="the ClusterIP answers through kubeplane proxy")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        listed = _nft(topology, "list", "tables")
        text = (tmp_path / "proxy.log").read_text()
        assert listed.returncode == 0 and "kube-proxy" not in listed.stdout, text
        assert "forbidden" not in text.lower(), text  # Services, EndpointSlices and its own Node: all allowed
