"""The node's CNI configuration: a bridge network over the node's pod CIDR.

The runtime (containerd's CRI plugin) runs the plugins; the agent only
writes the configuration, once it knows ``spec.podCIDR``: a Linux bridge
with the node as gateway, host-local IPAM over the pod CIDR, ``portmap``
for hostPorts and ``loopback``, as the reference bridge setup of k3s and
kubenet does.
"""

from __future__ import annotations

import ipaddress
import json
import os

CNI_VERSION = "1.0.0"
NETWORK_NAME = "kubeplane"
CONF_NAME = "10-kubeplane.conflist"


def bridge_conflist(pod_cidr: str, *, bridge: str = "kp0", ipam_dir: str | None = None,
                    mtu: int = 1500, hostports: bool = True) -> dict:
    net = ipaddress.ip_network(pod_cidr, strict=False)
    ipam: dict = {"type": "host-local", "ranges": [[{"subnet": str(net)}]],
                  "routes": [{"dst": "0.0.0.0/0" if net.version == 4 else "::/0"}]}
    if ipam_dir:
        ipam["dataDir"] = ipam_dir
    plugins: list[dict] = [{
        "type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
        "hairpinMode": True, "mtu": mtu, "ipam": ipam,
    }]
    if hostports:
        plugins.append({"type": "portmap", "capabilities": {"portMappings": True}})
    plugins.append({"type": "loopback"})
    return {"cniVersion": CNI_VERSION, "name": NETWORK_NAME, "plugins": plugins}


def write_conflist(conf_dir: str, conflist: dict) -> str:
    """Write (atomically) the node's one network configuration; returns its path."""
    os.makedirs(conf_dir, exist_ok=True)
    path = os.path.join(conf_dir, CONF_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(conflist, f, indent=2)
    os.replace(tmp, path)
    return path
