"""Streaming through the API server to a real node's kubelet API, with real
kubectl: logs (-f, --tail, --previous), exec with output and exit code, exec
-it through a pseudo-terminal, cp both ways, port-forward to busybox httpd."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import select
import struct
import subprocess
import termios
import time
import urllib.request

import pytest


def _pod(real_node, name: str, command: list[str], restart: str = "Always") -> None:
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 1, "containers": [
                    {"name": "main", "image": real_node.busybox, "imagePullPolicy": "Never", "command": command}]}}
    real_node.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def _wait(predicate, timeout: float = 60.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _running(real_node, name: str) -> None:
    real_node.cluster.wait_for("pods", name, namespace="default", condition="Ready", timeout=60)


@pytest.fixture
def cleanup(real_node):
    names: list[str] = []
    yield names
    for n in names:
        real_node.kubectl("delete", "pod", n, "--wait=false", "--ignore-not-found", check=False)


def _restarts(real_node, name: str) -> int:
    pod = real_node.cluster.get("pods", name, namespace="default")
    return sum(c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def test_logs_tail_timestamps_follow_and_previous(real_node, cleanup):
    cleanup += ["logger", "follower", "crasher"]
    _pod(real_node, "logger", ["sh", "-c", "echo start $(hostname); for i in 1 2 3; do echo tick $i; done; "
                                           "exec sleep 3600"])
    _pod(real_node, "crasher", ["sh", "-c", "echo run; exit 1"])
    _running(real_node, "logger")
    _wait(lambda: "tick 3" in real_node.kubectl("logs", "logger").stdout, what="the logger's output")
    assert real_node.kubectl("logs", "logger").stdout == "start logger\ntick 1\ntick 2\ntick 3\n"
    assert real_node.kubectl("logs", "logger", "--tail=2").stdout == "tick 2\ntick 3\n"
    out = real_node.kubectl("logs", "logger", "--tail=1", "--timestamps").stdout
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z tick 3\n", out), out
    p = real_node.kubectl("logs", "logger", "--previous", check=False)
    assert p.returncode == 1 and 'previous terminated container "main" in pod "logger" not found' in p.stderr
    # -f ends with the container
    _pod(real_node, "follower", ["sh", "-c", "for i in 1 2 3; do echo f $i; sleep 0.5; done"], restart="Never")
    _running(real_node, "follower")
    assert real_node.kubectl("logs", "-f", "follower", timeout=60).stdout == "f 1\nf 2\nf 3\n"
    # after a restart, --previous shows the run before
    _wait(lambda: _restarts(real_node, "crasher") >= 1, timeout=90, what="a restart")
    assert real_node.kubectl("logs", "crasher", "--previous").stdout == "run\n"


def test_exec_output_exit_code_and_tty(real_node, cleanup):
    cleanup.append("sleeper")
    _pod(real_node, "sleeper", ["sleep", "3600"])
    _running(real_node, "sleeper")
    p = real_node.kubectl("exec", "sleeper", "--", "sh", "-c", "echo out; echo err >&2; exit 7", check=False)
    assert (p.returncode, p.stdout, p.stderr.splitlines()[0]) == (7, "out\n", "err")
    assert "command terminated with exit code 7" in p.stderr
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 99, 0, 0))
    proc = subprocess.Popen(["kubectl", "--kubeconfig", real_node.kubeconfig, "exec", "-it", "sleeper", "--", "sh"],
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        time.sleep(1.0)
        os.write(master, b"stty size; echo done-$((3*4)); exit 3\n")
        deadline = time.monotonic() + 30
        while b"done-12" not in seen and time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 1)
            if r:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert b"24 99" in seen and b"done-12" in seen, seen
        assert proc.wait(30) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_cp_both_ways(real_node, cleanup, tmp_path):
    cleanup.append("files")
    _pod(real_node, "files", ["sleep", "3600"])
    _running(real_node, "files")
    src = tmp_path / "in.txt"
    src.write_bytes(b"kubeplane cp\n" * 1000)
    real_node.kubectl("cp", str(src), "files:/tmp/in.txt")
    assert real_node.kubectl("exec", "files", "--", "md5sum", "/tmp/in.txt").stdout.split()[0] == \
        hashlib.md5(src.read_bytes()).hexdigest()
    dst = tmp_path / "out.txt"
    real_node.kubectl("cp", "files:/tmp/in.txt", str(dst))
    assert dst.read_bytes() == src.read_bytes()


def test_port_forward_to_httpd(real_node, cleanup):
    cleanup.append("httpd")
    _pod(real_node, "httpd", ["sh", "-c", "mkdir -p /www && echo real-node-httpd > /www/index.html && "
                                          "exec httpd -f -p 8080 -h /www"])
    _running(real_node, "httpd")
    proc = subprocess.Popen(["kubectl", "--kubeconfig", real_node.kubeconfig, "port-forward", "pod/httpd", ":8080"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
        assert m, line
        for _ in range(2):
            with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/index.html", timeout=10) as r:
                assert r.read() == b"real-node-httpd\n"
    finally:
        proc.terminate()
        proc.wait(10)
