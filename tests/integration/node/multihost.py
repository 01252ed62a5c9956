"""Several hosts on one machine: network namespaces on one link, each running
``kubeplane node`` (joined with a bootstrap token) with a containerd of its
own; the control plane (``kubeplane up``, no node of its own, its cluster DNS
listening on the link) in the test's namespace, reached over the same link.

    lan namespace: bridge ``lanbr``
      ├─ veth to the test's namespace: <net>.254 (the API server listens there)
      ├─ veth to host namespace 1: <net>.1   kubeplane node h1 (its pods on its own bridge)
      └─ veth to host namespace 2: <net>.2   kubeplane node h2

The hosts have no default route: nothing they send leaves the namespaces the
test made. Everything is removed afterwards, also when the test fails: the
nodes' pods (through their containerd, CNI DEL included, run inside each
host's namespace), shims, mounts, data, the namespaces and the links.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

from nodetest import (CLI, cli_env, kubectl, network_policy_kubeconfig, own_cgroup_root, start_up, stop_process,
                      wait_for)

HERE = os.path.dirname(os.path.abspath(__file__))
#: the kube-dns Service's address in up's default service range, the nodes' --cluster-dns
KUBE_DNS_IP = "10.96.0.10"


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.stderr or p.stdout}")
    return p


def free_lan() -> str:
    """A /24 (its first three octets) no route of this machine covers."""
    routes = sh("ip", "-4", "route").stdout
    start = os.getpid() % 200
    for i in range(200):
        n = (start + i) % 200 + 20
        if f"10.251.{n}." not in routes:
            return f"10.251.{n}"
    raise RuntimeError("no free 10.251.x.0/24 for the test's link")


class Host:
    def __init__(self, hosts: "Hosts", index: int) -> None:
        self.index = index
        self.name = f"h{index}-{hosts.tag}"
        self.netns = f"kph{hosts.tag}-{index}"
        self.ip = f"{hosts.net}.{index}"
        self.data_dir = os.path.join(hosts.base, self.name)
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(hosts.base, f"{self.name}.log")
        #: the hosts share this machine's cgroups: each node has a root of its own
        self.cgroup_root = own_cgroup_root(self.name)

    def run(self, *argv: str, **kw) -> subprocess.CompletedProcess:
        """A command in the host's network namespace."""
        return sh("nsenter", f"--net=/run/netns/{self.netns}", *argv, **kw)

    def log(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-4000:]
        except OSError:
            return ""


class Hosts:
    def __init__(self, base: str, image_dir: str, count: int = 2) -> None:
        self.tag = str(os.getpid() % 100000)
        self.base = base
        self.image_dir = image_dir
        self.net = free_lan()
        self.lan = f"kpl{self.tag}"
        self.uplink = f"kpu{self.tag}"
        self.api_ip = f"{self.net}.254"
        self.hosts = [Host(self, i + 1) for i in range(count)]
        self.up: subprocess.Popen | None = None
        self.kubeconfig = ""
        self.join: list[str] = []

    # -- life -------------------------------------------------------------------

    def start(self) -> "Hosts":
        sh("ip", "netns", "add", self.lan)
        sh("ip", "-n", self.lan, "link", "add", "name", "lanbr", "type", "bridge")
        sh("ip", "-n", self.lan, "link", "set", "dev", "lanbr", "up")
        sh("ip", "link", "add", "name", self.uplink, "type", "veth", "peer", "name", "up", "netns", self.lan)
        sh("ip", "-n", self.lan, "link", "set", "dev", "up", "master", "lanbr", "up")
        sh("ip", "addr", "add", f"{self.api_ip}/24", "dev", self.uplink)
        sh("ip", "link", "set", "dev", self.uplink, "up")
        for h in self.hosts:
            sh("ip", "netns", "add", h.netns)
            sh("ip", "link", "add", "name", "eth0", "netns", h.netns, "type", "veth", "peer", "name",
               f"to-h{h.index}", "netns", self.lan)
            sh("ip", "-n", self.lan, "link", "set", "dev", f"to-h{h.index}", "master", "lanbr", "up")
            sh("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            sh("ip", "-n", h.netns, "link", "set", "dev", "eth0", "up")
            sh("ip", "-n", h.netns, "link", "set", "dev", "lo", "up")
        # a host whose node stops is Unknown after 8 s (upstream's 50 s is long for a test); cluster DNS
        # on the link too, so that the hosts' pods reach it (the kube-dns Service's endpoint)
        self.up, self.kubeconfig, _ = start_up(_Dir(self.base), "--nodes", "0", "--real-node", "off",
                                               "--node-monitor-grace-period", "8s", "--dns-addr", f"{self.api_ip}:0",
                                               listen=f"{self.api_ip}:0")
        out = subprocess.run(CLI + ["token", "create", "--print-join-command", "--kubeconfig", self.kubeconfig],
                             capture_output=True, text=True, env=cli_env(), timeout=60)
        assert out.returncode == 0, out.stderr
        self.join = shlex.split(out.stdout)[1:]
        # NetworkPolicy enforcement reads with an account of its own, as upstream's policy agents
        self.netpol_kubeconfig = network_policy_kubeconfig(self.kubeconfig,
                                                           os.path.join(self.base, "netpol.kubeconfig"))
        for h in self.hosts:
            self.start_node(h)
        for h in self.hosts:
            self.wait_ready(h)
        return self

    def start_node(self, h: Host) -> None:
        os.makedirs(h.data_dir, exist_ok=True)
        with open(h.log_path, "ab") as log:
            h.proc = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{h.netns}", *CLI, *self.join, "--name", h.name, "--node-ip", h.ip,
                 "--data-dir", h.data_dir, "--images-dir", self.image_dir, "--cgroup-root", h.cgroup_root,
                 "--network-policy-kubeconfig", self.netpol_kubeconfig,
                 "--cluster-dns", KUBE_DNS_IP],
                stdout=log, stderr=subprocess.STDOUT, env=cli_env())

    def wait_ready(self, h: Host, timeout: float = 120) -> None:
        def ready():
            assert h.proc is not None and h.proc.poll() is None, h.log()
            p = kubectl(self.kubeconfig, "get", "node", h.name, "-o", "json", check=False)
            if p.returncode:
                return False
            node = json.loads(p.stdout)
            return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])) \
                and bool(node["spec"].get("podCIDR"))
        wait_for(f"node {h.name} Ready", ready, timeout)

    def stop_node(self, h: Host) -> None:
        if h.proc is not None and h.proc.poll() is None:
            try:
                stop_process(h.proc, 60)
            except subprocess.TimeoutExpired:
                pass
        h.proc = None

    def stop(self) -> None:
        for h in self.hosts:
            try:
                self.stop_node(h)
            except Exception:  # noqa: BLE001 - the rest is still removed
                pass
        for h in self.hosts:
            self._clean_host(h)
        if self.up is not None and self.up.poll() is None:
            try:
                stop_process(self.up, 60)
            except subprocess.TimeoutExpired:
                pass
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.lan], capture_output=True)
        subprocess.run(["ip", "link", "del", self.uplink], capture_output=True)

    def _clean_host(self, h: Host) -> None:
        """The node's pods, shims and mounts, from inside its namespace (so that CNI DEL
        finds the pods' links), then its data."""
        if not os.path.isdir(h.data_dir):
            return
        from kubeplane.node.agent import AgentConfig

        bridge = AgentConfig(name=h.name, data_dir=h.data_dir).bridge
        code = (f"import sys; sys.path.insert(0, {HERE!r}); from nodetest import cleanup_node_dir; "
                f"cleanup_node_dir({h.data_dir!r}, {bridge!r}, {h.cgroup_root!r})")
        subprocess.run(["nsenter", f"--net=/run/netns/{h.netns}", sys.executable, "-c", code],
                       capture_output=True, env=cli_env(), timeout=180)

    # -- use --------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return kubectl(self.kubeconfig, *args, check=check, input=input)

    def apply(self, *objs: dict) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))

    def get(self, kind: str, name: str, namespace: str = "default") -> dict:
        return json.loads(self.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)

    def wait_pod_ready(self, name: str, namespace: str = "default", timeout: float = 120) -> dict:
        def ready():
            p = self.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
            if p.returncode:
                return None
            pod = json.loads(p.stdout)
            ok = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
            return pod if ok else None
        return wait_for(f"pod {name} Ready", ready, timeout)

    def http_get(self, pod: str, ip: str, port: int = 80, timeout: int = 2) -> str | None:
        """The body pod ``pod`` gets from ``http://ip:port/`` (None: no answer within ``timeout``
        seconds). With nc: busybox's wget crashes with a timeout (-T) in some builds."""
        p = self.exec(pod, "sh", "-c", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w {timeout} {ip} {port}",
                      check=False)
        head, sep, body = p.stdout.replace("\r\n", "\n").partition("\n\n")
        return body if p.returncode == 0 and sep and head.startswith("HTTP/1.") else None

    def exec(self, pod: str, *cmd: str, namespace: str = "default", check: bool = True,
             timeout: float = 60) -> subprocess.CompletedProcess:
        p = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, "exec", "-n", namespace, pod, "--", *cmd],
                           capture_output=True, text=True, timeout=timeout)
        if check:
            assert p.returncode == 0, f"exec in {pod}: {p.stderr}"
        return p


class _Dir:
    """What ``start_up`` wants of pytest's tmp_path: ``/`` joins."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __truediv__(self, name: str):
        from pathlib import Path

        return Path(self.path) / name


def web_pod(name: str, node: str, labels: dict | None = None, **spec) -> dict:
    """A busybox HTTP server on port 80 answering its own name, on ``node``."""
    from nodetest import BUSYBOX

    script = "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 80 -h /www"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {"app": "web"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, **spec, "containers": [{
                "name": "web", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                "ports": [{"containerPort": 80, "name": "http"}],
                "readinessProbe": {"httpGet": {"port": 80, "path": "/"}, "periodSeconds": 1}}]}}


def client_pod(name: str, node: str) -> dict:
    from nodetest import BUSYBOX

    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}}


def until(what: str, fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except AssertionError as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout:g}s (last: {last!r})")
