"""The kubeplane command as an operator meets it: one server per data
directory, one-line startup errors, flags checked at startup, components that
wait for their API server, klog lines, private files, `kubeplane version`."""

from __future__ import annotations

import json
import re
import signal
import socket
import stat
import subprocess
import sys

import pytest
import yaml

from conftest import start_server
from helpers import eventually_sync as wait_for

CLI = [sys.executable, "-m", "kubeplane.cli.main"]
KLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +(\d+) [\w.]+:\d+\] ")


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_second_server_on_a_data_dir_is_refused(tmp_path):
    first = start_server(tmp_path / "a", storage="sqlite")
    try:
        before = first.kubeconfig.read_text()
        other_kc = tmp_path / "other-kubeconfig"
        for command in ("apiserver", "up"):
            extra = ["--nodes", "0", "--metrics-listen", "", "--dns-addr", "", "--real-node", "off"] \
                if command == "up" else []
            p = run(command, "--data-dir", str(first.data_dir), "--listen", "127.0.0.1:0",
                    "--kubeconfig", str(other_kc), *extra)
            assert p.returncode == 1, p.stderr
            assert p.stderr == (f"error: data directory {first.data_dir} is in use by another kubeplane process "
                                f"(pid {first.proc.pid}); stop it or choose another --data-dir\n")
            assert not other_kc.exists()
        assert first.kubeconfig.read_text() == before
        assert first.proc.poll() is None
        # Private files: the directory 0700, the database and the kubeconfig 0600.
        assert stat.S_IMODE(first.data_dir.stat().st_mode) == 0o700
        for name in ("kubeplane.db", "kubeplane.db-wal"):
            path = first.data_dir / name
            if path.exists():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
        assert stat.S_IMODE(first.kubeconfig.stat().st_mode) == 0o600
    finally:
        first.stop()
    assert first.proc.returncode == 0
    assert not first.kubeconfig.exists()  # withdrawn on exit


def test_busy_port_is_one_line_and_exit_1(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        p = run("apiserver", "--storage", "memory", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path))
        assert p.returncode == 1
        assert p.stderr == f"error: listen tcp 127.0.0.1:{port}: bind: address already in use\n"
        # The components' metrics address too (up stops its API server again and leaves no kubeconfig).
        p = run("up", "--storage", "memory", "--listen", "127.0.0.1:0", "--nodes", "0", "--real-node", "off",
                "--metrics-listen", f"127.0.0.1:{port}", "--dns-addr", "127.0.0.1:0", "--data-dir",
                str(tmp_path / "up"))
        assert p.returncode == 1
        assert p.stderr.splitlines()[-1] == f"error: listen tcp 127.0.0.1:{port}: bind: address already in use"
        assert "Traceback" not in p.stderr
        assert not (tmp_path / "up" / "kubeconfig").exists()
        # and the DNS server's (its UDP port is free, its TCP port is not)
        p = run("up", "--storage", "memory", "--listen", "127.0.0.1:0", "--nodes", "0", "--real-node", "off",
                "--metrics-listen", "", "--dns-addr", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "up"))
        assert p.returncode == 1
        assert p.stderr.splitlines()[-1] == f"error: listen tcp 127.0.0.1:{port}: bind: address already in use"
        assert "Traceback" not in p.stderr
        assert not (tmp_path / "up" / "kubeconfig").exists()
    finally:
        holder.close()


@pytest.mark.parametrize("args, option", [
    (["up", "--node-cpu", "abc"], "--node-cpu"),
    (["up", "--node-memory", "-1Gi"], "--node-memory"),
    (["nodes", "--node-cpu", "4x"], "--node-cpu"),
    (["up", "--node-prefix", "Bad_Prefix"], "--node-prefix"),
    (["apiserver", "--listen", "localhost"], "--listen"),
    (["apiserver", "--listen", "127.0.0.1:99999"], "--listen"),
    (["apiserver", "--data-dir", ""], "--data-dir"),
    (["up", "--metrics-listen", "nowhere"], "--metrics-listen"),
    (["scheduler", "--metrics-listen", "1.2.3.4"], "--metrics-listen"),
    (["controllers", "--provisioner-name", "not a name"], "--provisioner-name"),
    (["apiserver", "-v=x"], "-v"),
    (["apiserver", "--history-revisions", "0"], "--history-revisions"),
    (["up", "--dns-addr", "nowhere"], "--dns-addr"),
    (["up", "--cluster-domain", "Not_A_Domain"], "--cluster-domain"),
    (["up", "--dns-advertise-address", "127.0.0.1"], "--dns-advertise-address"),
    (["dns", "--dns-addr", "127.0.0.1:70000"], "--dns-addr"),
    (["dns", "--service-cluster-ip-range", "10.96.0.0/8"], "--service-cluster-ip-range"),
    (["node", "--cluster-dns", "not-an-ip"], "--cluster-dns"),
])
def test_invalid_flags_are_usage_errors(tmp_path, args, option):
    if args[0] in ("nodes", "scheduler", "controllers", "dns", "node"):
        p = run(*args, "--kubeconfig", str(tmp_path / "kc"))
    elif "--data-dir" in args:
        p = run(*args)
    else:
        p = run(*args, "--data-dir", str(tmp_path / "d"))
    assert p.returncode == 2, p.stderr
    assert "Invalid value for" in p.stderr and option in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "d").exists()  # nothing was started


def test_version():
    line = run("version").stdout
    assert re.fullmatch(r"kubeplane v\d+\.\d+\.\d+\S* \(Kubernetes v1\.\d+\.\d+\S*\)\n", line)
    assert run("--version").stdout == line
    info = json.loads(run("version", "-o", "json").stdout)
    assert info["gitVersion"].startswith("v1.") and {"major", "minor", "platform"} <= set(info)


@pytest.mark.parametrize("command, ready", [
    ("scheduler", "kubeplane scheduler running"),
    ("controllers", "kubeplane controllers running"),
    ("nodes", "simulated node(s) running"),
    ("dns", "kubeplane DNS serving cluster.local"),
])
def test_component_waits_for_an_unreachable_api_server(tmp_path, command, ready):
    from kubeplane.client.kubeconfig import write_kubeconfig

    port = free_port()
    kc = tmp_path / "kc"
    write_kubeconfig(str(kc), f"http://127.0.0.1:{port}")
    log_path = tmp_path / "component.log"
    extra = {"scheduler": ["--no-leader-elect", "--metrics-listen", ""], "controllers": ["--metrics-listen", ""],
             "nodes": ["--nodes", "1"], "dns": ["--dns-addr", "127.0.0.1:0"]}[command]
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen([*CLI, command, "--kubeconfig", str(kc), *extra], stdout=logf,
                                stderr=subprocess.STDOUT)
    server = None
    try:
        wait_for(lambda: log_path.read_text().count("cannot reach the API server") >= 2, timeout=30, what="two logged retries")
        assert proc.poll() is None  # still trying, not exited
        lines = [l for l in log_path.read_text().splitlines() if "cannot reach the API server" in l]
        assert all(KLOG.match(l) and l.startswith("E") for l in lines), lines
        assert f'Get "http://127.0.0.1:{port}/version": dial tcp 127.0.0.1:{port}: connect: connection refused' \
            in lines[0]
        # plain HTTP, as the kubeconfig says (this is about retrying, not TLS)
        server = subprocess.Popen([*CLI, "apiserver", "--storage", "memory", "--listen", f"127.0.0.1:{port}",
                                   "--insecure-http", "--data-dir", str(tmp_path / "d")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_for(lambda: ready in log_path.read_text(), timeout=60, what=f"{command} to start once the API server is up")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    assert rc == 0, log_path.read_text()
    assert "Traceback" not in log_path.read_text()


def test_klog_lines_and_verbosity(tmp_path):
    srv = start_server(tmp_path, storage="memory", extra=["-v=4"])
    srv.stop()
    logged = [l for l in srv.log().splitlines() if l.strip()]
    assert logged and all(KLOG.match(l) for l in logged), logged
    assert all(int(KLOG.match(l).group(1)) == srv.proc.pid for l in logged)
    assert any(l.startswith("I") and "app.py:" in l and "] API server listening on https://127.0.0.1:" in l
               for l in logged)
    # upstream's spellings of the flag, and the old --verbose
    for flags in (["-v", "2"], ["--v=3"], ["-v4"], ["--verbose"]):
        other = start_server(tmp_path / flags[0].strip("-="), storage="memory", extra=flags)
        other.stop()
        assert other.proc.returncode == 0, other.log()


def test_a_killed_servers_lock_and_kubeconfig_do_not_linger(tmp_path):
    first = start_server(tmp_path, storage="sqlite")
    stale_url = first.url
    first.stop(signal.SIGKILL)  # no chance to clean up: the kernel drops the lock, the kubeconfig stays
    assert first.kubeconfig.exists()
    log_path = tmp_path / "second.log"
    with open(log_path, "wb") as logf:
        second = subprocess.Popen([*CLI, "apiserver", "--listen", "127.0.0.1:0", "--data-dir", str(first.data_dir),
                                   "--kubeconfig", str(first.kubeconfig)], stdout=logf, stderr=subprocess.STDOUT)
    try:
        def fresh() -> bool:
            try:
                doc = yaml.safe_load(first.kubeconfig.read_text())
            except (OSError, yaml.YAMLError):
                return False
            return bool(doc) and doc["clusters"][0]["cluster"]["server"] != stale_url

        wait_for(fresh, timeout=30, what="the second server's kubeconfig")
        assert second.poll() is None
        assert "removed the stale kubeconfig" in log_path.read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert second.returncode == 0 and not first.kubeconfig.exists()
