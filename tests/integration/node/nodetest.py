"""Names the node tests share (import them from here: ``conftest`` is ambiguous
when the whole suite runs, since every test directory has one), and the
helpers of the tests that run kubeplane's commands as processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time

BUSYBOX = "kubeplane.local/busybox:latest"
PAUSE = "kubeplane.local/pause:3.10"


CLI = [sys.executable, "-m", "kubeplane.cli.main"]


def cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                                 "src"), env.get("PYTHONPATH", "")] if p)
    return env


def cleanup_node_dir(data_dir: str, bridge: str, cgroup_root: str | None = None) -> None:
    """Every pod the node left (its sandboxes through containerd, with CNI DEL), shims, mounts, the bridge,
    and the pods' cgroups under ``cgroup_root``."""
    from kubeplane.node.containerd import ManagedContainerd, kill_shims, unmount_under

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
    if cgroup_root:
        remove_cgroup_root(cgroup_root)


def kubectl(kubeconfig: str, *args: str, check: bool = True, input: str | None = None):
    p = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True, text=True,
                       timeout=60, input=input)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def wait_for(what: str, fn, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:g}s (last: {last!r})")


def stop_process(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def start_up(tmp_path, *args: str, listen: str = "127.0.0.1:0"):
    """``kubeplane up`` in a process of its own (memory storage, a free port, TLS as by default), its data
    directory ``tmp_path/up``; (process, admin kubeconfig, log path) once the kubeconfig is there."""
    data_dir = str(tmp_path / "up")
    kubeconfig = str(tmp_path / "kubeconfig")
    log_path = tmp_path / "up.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(CLI + ["up", "--storage", "memory", "--listen", listen, "--data-dir",
                                       data_dir, "--kubeconfig", kubeconfig, "--metrics-listen", "",
                                       "--dns-addr", "127.0.0.1:0", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=cli_env())
    try:
        wait_for("the kubeconfig", lambda: os.path.exists(kubeconfig) or proc.poll() is not None, 120)
        assert proc.poll() is None, log_path.read_text()[-3000:]
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, kubeconfig, log_path


def own_cgroup_root(name: str) -> str:
    """A cgroup root of this test process's own (nodes of tests running side by side stay apart)."""
    return f"/kubeplane-test-{os.getpid()}-{name}"


def remove_cgroup_root(root: str) -> None:
    """Remove the cgroups under ``root`` in every hierarchy (only empty ones can go: a
    cgroup still holding a process stays, and the check that follows sees it)."""
    from kubeplane.node.cgroups import mounted_hierarchies

    for h in mounted_hierarchies():
        top = os.path.join(h.path, root.strip("/"))
        for d, _, _ in os.walk(top, topdown=False):
            try:
                os.rmdir(d)
            except OSError:
                pass


def netns_sh(*argv: str, check: bool = True, netns: str | None = None,
             timeout: float = 20) -> subprocess.CompletedProcess:
    """Run a command (in network namespace ``netns`` when given); raise on failure when ``check``."""
    if netns:
        argv = ("ip", "netns", "exec", netns, *argv)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.stderr or p.stdout}")
    return p


def in_netns(netns: str):
    """A command runner (as kubeplane.node.routes' ``Runner``) running in network namespace ``netns``."""
    async def run(argv, stdin=None):
        proc = await asyncio.create_subprocess_exec("ip", "netns", "exec", netns, *argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(stdin)
        return proc.returncode, out.decode(), err.decode()
    return run


def network_policy_kubeconfig(admin_kubeconfig: str, path: str) -> str:
    """A kubeconfig of the kube-system ServiceAccount the bootstrap policy lets read what
    NetworkPolicy enforcement needs (every pod, namespace and policy): the ServiceAccount
    made, a token requested for it (``kubectl create token``), as a policy agent is given one."""
    import yaml

    from kubeplane.client.kubeconfig import write_kubeconfig

    kubectl(admin_kubeconfig, "create", "serviceaccount", "kubeplane-network-policy", "-n", "kube-system",
            check=False)
    token = kubectl(admin_kubeconfig, "create", "token", "kubeplane-network-policy", "-n", "kube-system",
                    "--duration", "2h").stdout.strip()
    import base64

    with open(admin_kubeconfig) as f:
        cluster = yaml.safe_load(f)["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]) if cluster.get("certificate-authority-data") else None
    write_kubeconfig(path, cluster["server"], ca_data=ca, token=token, durable=False)
    return path
