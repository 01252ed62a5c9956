"""``kubeplane node``, ``kubeplane images import`` and ``kubeplane up --real-node``
as a user runs them: separate processes, real containerd, real kubectl."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from kubeplane.node.containerd import ManagedContainerd, kill_shims, unmount_under
from kubeplane.node.images import ImageConfig, build_busybox_image

from conftest import BUSYBOX, PAUSE, free_bridge_and_cidr, node_kubeconfig

CLI = [sys.executable, "-m", "kubeplane.cli.main"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                                 "src"), env.get("PYTHONPATH", "")] if p)
    return env


def _cleanup_node_dir(data_dir: str, bridge: str) -> None:
    """Every pod the node left (its sandboxes through containerd, with CNI DEL), shims, mounts, the bridge."""
    base = os.path.join(data_dir, "containerd")
    if os.path.isdir(base):
        ctd = ManagedContainerd(base, sandbox_image=PAUSE)
        try:
            asyncio.run(ctd.start())
        except RuntimeError:
            pass
        asyncio.run(ctd.stop(remove_pods=True))
        kill_shims(ctd.paths.socket)
    unmount_under(data_dir)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    shutil.rmtree(data_dir, ignore_errors=True)


def _kubectl(kubeconfig: str, *args: str, check: bool = True, input: str | None = None):
    p = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True, text=True,
                       timeout=60, input=input)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def _wait(what: str, fn, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:g}s (last: {last!r})")


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


def _stop(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def test_kubeplane_node_runs_pods_stops_and_adopts_them_again(tmp_path, image_archives):
    from kubeplane.testing import Cluster

    data_dir = str(tmp_path / "node")
    bridge, cidr = free_bridge_and_cidr()
    os.makedirs(os.path.join(data_dir, "images"))
    shutil.copy(image_archives["busybox"], os.path.join(data_dir, "images", "busybox.tar"))
    with Cluster(scheduler=True, controllers=True) as cluster:
        kc = node_kubeconfig(cluster, "cli-node", str(tmp_path / "node.kubeconfig"))
        cmd = CLI + ["node", "--kubeconfig", kc, "--name", "cli-node", "--data-dir", data_dir,
                     "--node-ip", "127.0.0.1", "--pod-cidr", cidr, "--kubelet-port", "0",
                     "--node-labels", "tier=test",
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

            _cleanup_node_dir(data_dir, AgentConfig(name="cli-node", data_dir=data_dir).bridge)
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
    data_dir = str(tmp_path / "up")
    kubeconfig = str(tmp_path / "kubeconfig")
    _, cidr = free_bridge_and_cidr()
    node_dir = os.path.join(data_dir, "node")
    os.makedirs(os.path.join(node_dir, "images"))
    shutil.copy(image_archives["busybox"], os.path.join(node_dir, "images", "busybox.tar"))
    log = open(tmp_path / "up.log", "ab")
    proc = subprocess.Popen(CLI + ["up", "--storage", "memory", "--listen", "127.0.0.1:0", "--data-dir", data_dir,
                                   "--kubeconfig", kubeconfig, "--metrics-listen", "", "--nodes", "1",
                                   "--real-node", "on", "--real-node-name", "up-real",
                                   "--real-node-pod-cidr", cidr, "--real-node-kubelet-port", "0"],
                            stdout=log, stderr=subprocess.STDOUT, env=_env())
    try:
        _wait("the kubeconfig", lambda: os.path.exists(kubeconfig) or proc.poll() is not None, 120)
        assert proc.poll() is None, open(tmp_path / "up.log").read()[-3000:]
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
        # the API server reaches the node's kubelet API (on loopback, as itself)
        assert _kubectl(kubeconfig, "exec", "up-pod", "--", "echo", "hi").stdout == "hi\n"
        _kubectl(kubeconfig, "delete", "pod", "up-pod", "--wait=true")
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        from kubeplane.node.agent import AgentConfig

        _cleanup_node_dir(node_dir, AgentConfig(name="up-real", data_dir=node_dir).bridge)
