"""The node's CNI configuration: a bridge network over the node's pod CIDR.

The runtime (containerd's CRI plugin) runs the plugins; the agent only
writes the configuration, once it knows ``spec.podCIDR``: a Linux bridge
with the node as gateway, host-local IPAM over the pod CIDR, ``portmap``
for hostPorts and ``loopback``, as the reference bridge setup of k3s and
kubenet does.

portmap removes a pod's own chain (``CNI-DN-<hash>``) on CNI DEL but never
the chains it shares between pods: :func:`remove_unused_hostport_chains`
removes those once no pod uses them, when a node removes its network.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import subprocess

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


#: the chains of the nat table the portmap plugin shares between every pod with a hostPort
HOSTPORT_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SETMARK")
#: the prefix of portmap's chain of one pod's hostPorts
HOSTPORT_POD_CHAIN_PREFIX = "CNI-DN-"


def run_nat(tool: str, *args: str) -> subprocess.CompletedProcess:
    """``tool`` (iptables or ip6tables) on the nat table, waiting for the xtables lock."""
    return subprocess.run([tool, "-w", "-t", "nat", *args], capture_output=True, text=True)


def nat_rules(tool: str) -> list[list[str]] | None:
    """The nat table as ``tool -S`` prints it, a line as its words (``-N CHAIN``,
    ``-A CHAIN match... -j TARGET``); None without the tool or the table."""
    if shutil.which(tool) is None:
        return None
    listed = run_nat(tool, "-S")
    if listed.returncode != 0:
        return None
    return [shlex.split(line) for line in listed.stdout.splitlines() if line.strip()]


def _jump_target(rule: list[str]) -> str | None:
    for flag in ("-j", "-g"):
        if flag in rule[:-1]:
            return rule[rule.index(flag) + 1]
    return None


def remove_unused_hostport_chains(tools: tuple[str, ...] = ("iptables", "ip6tables")) -> list[str]:
    """Remove portmap's shared chains, and the rules of other chains that jump to
    them, from the nat table of each of ``tools`` where no pod's hostPort is in
    them any more (``CNI-HOSTPORT-DNAT`` is empty and no ``CNI-DN-*`` chain is
    left). Uses the iptables tools portmap used, so the legacy and the nf_tables
    variant alike. Returns the tools whose chains were removed."""
    done = []
    for tool in tools:
        rules = nat_rules(tool)
        if rules is None:
            continue
        chains = {r[1] for r in rules if len(r) > 1 and r[0] == "-N"}
        present = [c for c in HOSTPORT_CHAINS if c in chains]
        in_use = any(c.startswith(HOSTPORT_POD_CHAIN_PREFIX) for c in chains) or any(
            r[0] == "-A" and r[1] == "CNI-HOSTPORT-DNAT" for r in rules if len(r) > 1)
        if not present or in_use:
            continue
        jumps = [r for r in rules if len(r) > 2 and r[0] == "-A" and r[1] not in HOSTPORT_CHAINS
                 and _jump_target(r) in HOSTPORT_CHAINS]
        for r in jumps:
            run_nat(tool, "-D", *r[1:])
        # CNI-HOSTPORT-DNAT goes first and without a flush: a pod's hostPort added
        # meanwhile makes its deletion fail, and then everything is left as it was
        if "CNI-HOSTPORT-DNAT" in chains and run_nat(tool, "-X", "CNI-HOSTPORT-DNAT").returncode != 0:
            for r in jumps:
                run_nat(tool, "-A", *r[1:])
            continue
        for chain in present:
            if chain != "CNI-HOSTPORT-DNAT":
                run_nat(tool, "-F", chain)
                run_nat(tool, "-X", chain)
        done.append(tool)
    return done
