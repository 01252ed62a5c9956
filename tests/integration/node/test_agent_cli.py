"""``kubeplane node``, ``kubeplane images import`` and ``kubeplane up --real-node``
as a user runs them: separate processes, real containerd, real kubectl."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import time

import pytest
import yaml

from kubeplane.node.images import ImageConfig, build_busybox_image

from conftest import BUSYBOX, free_bridge_and_cidr, node_kubeconfig
from nodetest import CLI
from nodetest import cleanup_node_dir as _cleanup_node_dir, cli_env as _env, kubectl as _kubectl
from nodetest import start_up as _start_up, stop_process as _stop, wait_for as _wait
from nodetest import own_cgroup_root


def _pod_json(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}})


def _running_container(kubeconfig: str, pod: str):
    p = _kubectl(kubeconfig, "get", "pod", pod, "-o", "json", check=False)
    if p.returncode:
        return None
    st = json.loads(p.stdout).get("status", {})
    if st.get("phase") != "Running":
        return None
    return st["containerStatuses"][0]["containerID"]


def test_kubeplane_node_runs_pods_stops_and_adopts_them_again(tmp_path, image_archives):
    from kubeplane.testing import Cluster

    data_dir = str(tmp_path / "node")
    bridge, cidr = free_bridge_and_cidr()
    cgroup_root = own_cgroup_root("cli-node")
    os.makedirs(os.path.join(data_dir, "images"))
    shutil.copy(image_archives["busybox"], os.path.join(data_dir, "images", "busybox.tar"))
    with Cluster(scheduler=True, controllers=True) as cluster:
        kc = node_kubeconfig(cluster, "cli-node", str(tmp_path / "node.kubeconfig"))
        cmd = CLI + ["node", "--kubeconfig", kc, "--name", "cli-node", "--data-dir", data_dir,
                     "--node-ip", "127.0.0.1", "--pod-cidr", cidr, "--kubelet-port", "0",
                     "--node-labels", "tier=test", "--cgroup-root", cgroup_root,
                     "--no-proxy"]  # the Service proxy would program the host's nftables: its tests use netns
        log = open(tmp_path / "node.log", "ab")
        procs = []
        try:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env()))
            # its own bridge: the flag is not there, the name derives from the node's
            cluster.wait_for("nodes", "cli-node", condition="Ready", timeout=90)
            node = cluster.get("nodes", "cli-node")
            assert node["metadata"]["labels"]["tier"] == "test"
            assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
            _kubectl(cluster.kubeconfig, "apply", "-f", "-", input=_pod_json("cli-pod"))
            cid = _wait("the pod running", lambda: _running_container(cluster.kubeconfig, "cli-pod"), 90)

            # kubeplane images import, into the running node's containerd
            extra = str(tmp_path / "extra.tar")
            build_busybox_image(extra, "kubeplane.local/cli-extra:1", config=ImageConfig(cmd=["true"]))
            out = subprocess.run(CLI + ["images", "import", "--data-dir", data_dir, extra], capture_output=True,
                                 text=True, env=_env(), timeout=120)
            assert out.returncode == 0, out.stderr
            assert "imported kubeplane.local/cli-extra:1" in out.stdout
            _wait("the imported image in the node's status", lambda: any(
                "kubeplane.local/cli-extra:1" in im["names"]
                for im in cluster.get("nodes", "cli-node")["status"]["images"]), 60)

            # stopped, the node leaves its pods running; started again, it adopts them
            assert _stop(procs[0]) == 0
            ctd_socket = os.path.join(data_dir, "containerd", "containerd.sock")
            assert any(ctd_socket.encode() in open(f"/proc/{p}/cmdline", "rb").read()
                       for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/cmdline")
                       and b"containerd-shim" in open(f"/proc/{p}/cmdline", "rb").read())
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env()))
            time.sleep(3)
            _wait("the node ready again", lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in cluster.get("nodes", "cli-node")["status"]["conditions"]), 60)
            assert _running_container(cluster.kubeconfig, "cli-pod") == cid
            st = cluster.get("pods", "cli-pod")["status"]["containerStatuses"][0]
            assert st["restartCount"] == 0
            _kubectl(cluster.kubeconfig, "delete", "pod", "cli-pod", "--wait=true")
            assert _stop(procs[1]) == 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            log.close()
            from kubeplane.node.agent import AgentConfig

            _cleanup_node_dir(data_dir, AgentConfig(name="cli-node", data_dir=data_dir).bridge, cgroup_root)
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.mark.parametrize("args,flag", [
    (["--node-ip", "10.99.99.99"], "not found in the host's network interfaces"),
    (["--node-ip", "nonsense"], "failed to parse node IP"),
    (["--system-reserved", "cpu=lots"], "quantities must match the regular expression"),
    (["--system-reserved", "disk=1Gi"], "unsupported resource 'disk'"),
    (["--max-pods", "0"], "--max-pods"),
    (["--pod-cidr", "10.1.2.300/24"], "invalid CIDR address"),
    (["--name", "UPPER"], "invalid node name 'UPPER'"),
    (["--node-labels", "novalue"], "invalid label 'novalue'"),
    (["--container-log-max-size", "0"], "'0': must be more than 0"),
    (["--container-log-max-size", "lots"], "invalid quantity 'lots'"),
    (["--container-log-max-files", "1"], "1 is not in the range x>=2"),
    (["--streaming-connection-idle-timeout", "5x"], 'unknown unit "x" in duration "5x"'),
])
def test_kubeplane_node_refuses_bad_flags(args, flag, tmp_path):
    out = subprocess.run(CLI + ["node", "--data-dir", str(tmp_path), *args], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert out.returncode == 2, out
    assert flag in out.stderr


def test_kubeplane_node_without_credentials_says_so(tmp_path):
    out = subprocess.run(CLI + ["node", "--data-dir", str(tmp_path / "d")], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert out.returncode == 1
    assert "no kubeconfig: give --kubeconfig, or --server and --token to join" in out.stderr
    out = subprocess.run(CLI + ["node", "--data-dir", str(tmp_path / "d"), "--server", "https://127.0.0.1:1"],
                         capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 2 and "--server and --token go together" in out.stderr


def test_images_import_errors(tmp_path):
    out = subprocess.run(CLI + ["images", "import", "--data-dir", str(tmp_path), str(tmp_path / "none.tar")],
                         capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 1 and f"open {tmp_path / 'none.tar'}: no such file or directory" in out.stderr
    (tmp_path / "x.tar").write_bytes(b"not an archive")
    out = subprocess.run(CLI + ["images", "import", "--data-dir", str(tmp_path), str(tmp_path / "x.tar")],
                         capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 1 and "no containerd at" in out.stderr


def test_up_runs_a_real_node(tmp_path, image_archives):
    node_dir = str(tmp_path / "up" / "node")
    os.makedirs(os.path.join(node_dir, "images"))
    shutil.copy(image_archives["busybox"], os.path.join(node_dir, "images", "busybox.tar"))
    # its pod CIDR from the node IPAM controller: a /24 of a cluster CIDR no other bridge of this host routes
    _, cidr = free_bridge_and_cidr()
    proc = None
    try:
        proc, kubeconfig, _ = _start_up(tmp_path, "--nodes", "1", "--real-node", "on", "--real-node-name", "up-real",
                                        "--cluster-cidr", cidr, "--real-node-kubelet-port", "0")
        yaml.safe_load(open(kubeconfig))
        _wait("the real node Ready", lambda: "up-real   Ready" in _kubectl(kubeconfig, "get", "nodes").stdout, 90)
        nodes = _kubectl(kubeconfig, "get", "nodes", "-o", "name").stdout.split()
        assert sorted(nodes) == ["node/node-0", "node/up-real"]
        pod = json.loads(_pod_json("up-pod"))
        pod["spec"]["nodeName"] = "up-real"
        _kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(pod))
        _wait("the pod running in a container", lambda: (_running_container(kubeconfig, "up-pod") or "")
              .startswith("containerd://"), 90)
        node = json.loads(_kubectl(kubeconfig, "get", "node", "up-real", "-o", "json").stdout)
        assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
        assert node["spec"]["podCIDR"] == cidr
        pod_ip = json.loads(_kubectl(kubeconfig, "get", "pod", "up-pod", "-o", "json").stdout)["status"]["podIP"]
        assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(cidr)
        # the API server reaches the node's kubelet API (on loopback, as itself)
        assert _kubectl(kubeconfig, "exec", "up-pod", "--", "echo", "hi").stdout == "hi\n"
        # the kubelet got the kube-dns Service's address: the pod's resolv.conf names it (ClusterFirst)
        resolv = _kubectl(kubeconfig, "exec", "up-pod", "--", "cat", "/etc/resolv.conf").stdout.splitlines()
        assert "nameserver 10.96.0.10" in resolv, resolv
        assert any(line.startswith("search default.svc.cluster.local svc.cluster.local cluster.local")
                   for line in resolv), resolv
        assert "options ndots:5" in resolv, resolv
        _kubectl(kubeconfig, "delete", "pod", "up-pod", "--wait=true")
        assert _stop(proc) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        from kubeplane.node.agent import AgentConfig

        # kubeplane up's node has the default cgroup root
        _cleanup_node_dir(node_dir, AgentConfig(name="up-real", data_dir=node_dir).bridge, "/kubepods")


def test_up_real_node_on_without_node_cidrs_says_why(tmp_path):
    out = subprocess.run(CLI + ["up", "--storage", "memory", "--listen", "127.0.0.1:0", "--data-dir",
                                str(tmp_path / "up"), "--metrics-listen", "", "--nodes", "0", "--real-node", "on",
                                "--allocate-node-cidrs=false"], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        "error: --real-node on: no pod CIDR for it: the node IPAM controller assigns none without "
        "--allocate-node-cidrs and --cluster-cidr")


def test_up_real_node_auto_says_why_there_is_none(tmp_path):
    """auto: no real node when it could get no pod CIDR, and one log line saying why."""
    proc = None
    try:
        proc, kubeconfig, log_path = _start_up(tmp_path, "--nodes", "0", "--controllers", "*,-nodeipam")
        assert _kubectl(kubeconfig, "get", "nodes", "-o", "name").stdout == ""
        lines = [ln for ln in log_path.read_text().splitlines() if "no real node" in ln]
        assert len(lines) == 1 and lines[0].endswith(
            "no real node (--real-node auto): no pod CIDR for it: the node-ipam-controller is not enabled "
            "(--controllers)"), lines
        assert _stop(proc) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def _certificate(pem: bytes):
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem)


def _subject(cert) -> tuple[str, list[str]]:
    from cryptography.x509.oid import NameOID

    return (cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
            [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)])


def test_a_second_node_joins_with_a_bootstrap_token(tmp_path, image_archives):
    """``kubeplane up`` (no node of its own, listening on every address as for nodes on other
    machines), ``kubeplane token create --print-join-command``, and the printed command run
    with a data directory and a containerd of its own."""
    import base64
    import shlex

    from kubeplane.node.agent import AgentConfig

    name = f"joined-{os.getpid() % 100000}"
    node_dir = str(tmp_path / "node")
    cgroup_root = own_cgroup_root(name)
    _, cidr = free_bridge_and_cidr()
    up = node = None
    try:
        up, kubeconfig, _ = _start_up(tmp_path, "--nodes", "0", "--real-node", "off", "--cluster-cidr", cidr,
                                      listen="0.0.0.0:0")
        admin = yaml.safe_load(open(kubeconfig))
        server = admin["clusters"][0]["cluster"]["server"]
        ca = _certificate(base64.b64decode(admin["clusters"][0]["cluster"]["certificate-authority-data"]))
        # the host's address (which the serving certificate covers), not the wildcard one
        assert server.startswith("https://") and not server.startswith("https://0.0.0.0:"), server
        info = json.loads(_kubectl(kubeconfig, "get", "configmap", "-n", "kube-public", "cluster-info", "-o",
                                   "json").stdout)
        assert yaml.safe_load(info["data"]["kubeconfig"])["clusters"][0]["cluster"]["server"] == server

        out = subprocess.run(CLI + ["token", "create", "--print-join-command", "--kubeconfig", kubeconfig],
                             capture_output=True, text=True, env=_env(), timeout=60)
        assert out.returncode == 0, out.stderr
        words = shlex.split(out.stdout)
        assert words[:2] == ["kubeplane", "node"] and words[words.index("--server") + 1] == server, words
        token = words[words.index("--token") + 1]
        token_id = token.split(".")[0]
        assert words[words.index("--ca-cert-hash") + 1].startswith("sha256:")

        def join(*args: str):
            return CLI + words[1:] + ["--data-dir", node_dir, "--images-dir", image_archives["dir"],
                                      "--node-ip", "127.0.0.1", "--kubelet-port", "0", "--cgroup-root", cgroup_root,
                                      *args]

        # a bad token is refused, and nothing is left behind: its secret does not sign cluster-info ...
        wrong = f"{token_id}.{'0123456789abcdef' if not token.endswith('0123456789abcdef') else 'fedcba9876543210'}"
        bad = [w if w != token else wrong for w in join("--name", "bad-node")]
        p = subprocess.run(bad, capture_output=True, text=True, env=_env(), timeout=120)
        assert p.returncode == 1, p.stderr
        assert p.stderr.splitlines()[-1] == (f"error: joining {server}: failed to verify JWS signature of received "
                                             "cluster info object, can't trust this API Server")
        # ... and a token the cluster does not know has no signature there
        bad = [w if w != token else "zzzzzz.0123456789abcdef" for w in join("--name", "bad-node",
                                                                            "--discovery-timeout", "2s")]
        p = subprocess.run(bad, capture_output=True, text=True, env=_env(), timeout=120)
        assert p.returncode == 1, p.stderr
        assert p.stderr.splitlines()[-1] == (
            f"error: joining {server}: could not discover the cluster at {server}: could not find a JWS signature "
            'in the cluster-info ConfigMap for token ID "zzzzzz": the token id is invalid for this cluster or it '
            'has expired ("kubeplane token create" on the control plane makes a new one)')
        assert not os.path.exists(os.path.join(node_dir, "kubelet.kubeconfig"))
        assert json.loads(_kubectl(kubeconfig, "get", "csr", "-o", "json").stdout)["items"] == []
        assert _kubectl(kubeconfig, "get", "nodes", "-o", "name").stdout == ""

        with open(tmp_path / "node.log", "ab") as log:
            node = subprocess.Popen(join("--name", name), stdout=log, stderr=subprocess.STDOUT, env=_env())

        def ready():
            p = _kubectl(kubeconfig, "get", "node", name, "-o", "json", check=False)
            return p.returncode == 0 and any(c["type"] == "Ready" and c["status"] == "True"
                                             for c in json.loads(p.stdout)["status"].get("conditions", []))

        _wait("the joined node Ready", lambda: ready() or node.poll() is not None, 120)
        assert node.poll() is None, open(tmp_path / "node.log").read()[-3000:]

        # its CSR, made with the token, was approved and signed: the node's own client certificate
        csrs = json.loads(_kubectl(kubeconfig, "get", "csr", "-o", "json").stdout)["items"]
        assert len(csrs) == 1, csrs
        csr = csrs[0]
        assert csr["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
        assert csr["spec"]["username"] == f"system:bootstrap:{token_id}"
        assert "system:bootstrappers" in csr["spec"]["groups"]
        assert [(c["type"], c["status"]) for c in csr["status"]["conditions"]] == [("Approved", "True")]
        issued = base64.b64decode(csr["status"]["certificate"])
        own = yaml.safe_load(open(os.path.join(node_dir, "kubelet.kubeconfig")))
        assert own["clusters"][0]["cluster"]["server"] == server
        assert base64.b64decode(own["users"][0]["user"]["client-certificate-data"]) == issued
        cert = _certificate(issued)
        assert _subject(cert) == (f"system:node:{name}", ["system:nodes"])
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)  # raises unless the cluster CA signed it
        whoami = json.loads(_kubectl(os.path.join(node_dir, "kubelet.kubeconfig"), "auth", "whoami", "-o",
                                     "json").stdout)["status"]["userInfo"]
        assert whoami["username"] == f"system:node:{name}"
        assert "system:nodes" in whoami["groups"]

        # its pod CIDR from the node IPAM controller
        assert json.loads(_kubectl(kubeconfig, "get", "node", name, "-o", "json").stdout)["spec"]["podCIDR"] == cidr

        # the scheduler puts a pod there (the only node); it runs, and kubectl logs reads it through the node
        _kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "on-joined"}, "spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                                "command": ["sh", "-c", "echo hello from $(hostname)"]}]}}))

        def phase():
            return json.loads(_kubectl(kubeconfig, "get", "pod", "on-joined", "-o", "json").stdout)["status"] \
                .get("phase")

        assert _wait("the pod done", lambda: phase() in ("Succeeded", "Failed") and phase(), 120) == "Succeeded"
        pod = json.loads(_kubectl(kubeconfig, "get", "pod", "on-joined", "-o", "json").stdout)
        assert pod["spec"]["nodeName"] == name
        assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
        assert _kubectl(kubeconfig, "logs", "on-joined").stdout == "hello from on-joined\n"
        _kubectl(kubeconfig, "delete", "pod", "on-joined", "--wait=true")

        # started again with the same command, the node uses the kubeconfig it wrote: no second join
        assert _stop(node) == 0
        with open(tmp_path / "node.log", "ab") as log:
            node = subprocess.Popen(join("--name", name), stdout=log, stderr=subprocess.STDOUT, env=_env())
        running = f"node {name} running"
        _wait("the node running again", lambda: open(tmp_path / "node.log").read().count(running) == 2
              or node.poll() is not None, 90)
        assert node.poll() is None, open(tmp_path / "node.log").read()[-3000:]
        assert open(tmp_path / "node.log").read().count(f"node {name} joined {server}") == 1
        assert len(json.loads(_kubectl(kubeconfig, "get", "csr", "-o", "json").stdout)["items"]) == 1
        assert _stop(node) == 0
        assert _stop(up) == 0
    finally:
        for proc in (node, up):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        _cleanup_node_dir(node_dir, AgentConfig(name=name, data_dir=node_dir).bridge, cgroup_root)
