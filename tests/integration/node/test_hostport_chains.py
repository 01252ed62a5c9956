"""portmap's shared nat chains are removed once no pod's hostPort uses them:
the real plugin adds and deletes a pod's hostPort in a network namespace of
the test's own (so the host's tables and other nodes' pods are not touched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import kubeplane
from kubeplane.node import cni
from kubeplane.node.containerd import find_cni_bin_dir

#: where this kubeplane is imported from, for the child run in the namespace
SRC = os.path.dirname(os.path.dirname(os.path.abspath(kubeplane.__file__)))
REMOVE = "import json, sys; from kubeplane.node.cni import remove_unused_hostport_chains as r; print(json.dumps(r()))"


@pytest.fixture
def netns():
    """(the namespace iptables runs in, the pod's namespace); both deleted afterwards."""
    names = [f"kphp{os.getpid()}h", f"kphp{os.getpid()}p"]
    for n in names:
        subprocess.run(["ip", "netns", "add", n], check=True)
    try:
        yield names
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def _in(ns: str, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, **kw)


def _portmap(host_ns: str, pod_ns: str, command: str, host_port: int) -> None:
    conf = {"cniVersion": cni.CNI_VERSION, "name": cni.NETWORK_NAME, "type": "portmap",
            "capabilities": {"portMappings": True},
            "runtimeConfig": {"portMappings": [{"hostPort": host_port, "containerPort": 8080, "protocol": "tcp"}]},
            "prevResult": {"cniVersion": cni.CNI_VERSION,
                           "interfaces": [{"name": "eth0", "sandbox": f"/var/run/netns/{pod_ns}"}],
                           "ips": [{"address": "10.249.7.2/24", "gateway": "10.249.7.1", "interface": 0}]}}
    bin_dir = find_cni_bin_dir()
    env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID="hostport-test-sandbox",
               CNI_NETNS=f"/var/run/netns/{pod_ns}", CNI_IFNAME="eth0", CNI_PATH=bin_dir)
    r = _in(host_ns, os.path.join(bin_dir, "portmap"), input=json.dumps(conf), env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def _remove(host_ns: str) -> list[str]:
    r = _in(host_ns, sys.executable, "-c", REMOVE, env=dict(os.environ, PYTHONPATH=SRC))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _nat(host_ns: str) -> list[str]:
    return _in(host_ns, "iptables", "-t", "nat", "-S").stdout.splitlines()


def test_shared_chains_stay_while_a_pod_uses_them_and_go_after(netns):
    host_ns, pod_ns = netns
    # a rule of someone else's in the same table stays as it is
    assert _in(host_ns, "iptables", "-t", "nat", "-N", "OTHER").returncode == 0
    assert _in(host_ns, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "udp", "-j", "OTHER").returncode == 0
    before = _nat(host_ns)
    assert _remove(host_ns) == []          # nothing of portmap's there

    _portmap(host_ns, pod_ns, "ADD", 31000)
    rules = _nat(host_ns)
    assert "-N CNI-HOSTPORT-DNAT" in rules and any(r.startswith("-N CNI-DN-") for r in rules)
    assert _remove(host_ns) == []          # the pod's hostPort is still in them
    assert _nat(host_ns) == rules

    _portmap(host_ns, pod_ns, "DEL", 31000)
    left = _nat(host_ns)
    assert "-N CNI-HOSTPORT-DNAT" in left and not any(r.startswith("-N CNI-DN-") for r in left)
    assert _remove(host_ns) == ["iptables"]
    assert _nat(host_ns) == before
