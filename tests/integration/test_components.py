"""Separate processes: API server, scheduler (with leader election), controllers and
simulated nodes, talking HTTP — the way kubeplane uses more than one core and
the way the scheduler runs against any cluster."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync


def _spawn(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kubeplane.cli.main", *args], stdout=log,
                            stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("components")
    srv = start_server(tmp, storage="memory")
    yield srv, tmp
    srv.stop()


def _lease_holder(kubectl: Kubectl) -> str:
    r = kubectl("get", "lease", "kube-scheduler", "-n", "kube-system", "-o", "jsonpath={.spec.holderIdentity}",
                check=False)
    return r.out.strip() if r.rc == 0 else ""


def test_split_processes_with_leader_election_failover(apiserver):
    srv, tmp = apiserver
    kubectl = Kubectl(srv.kubeconfig, tmp / "home")
    log = open(tmp / "components.log", "ab")
    kc = ["--kubeconfig", str(srv.kubeconfig)]
    procs = {
        "nodes": _spawn(["nodes", *kc, "--nodes", "2"], log),
        "controllers": _spawn(["controllers", *kc, "--metrics-listen", ""], log),
        "sched-a": _spawn(["scheduler", *kc, "--leader-elect", "--metrics-listen", ""], log),
    }
    try:
        holder_a = eventually_sync(lambda: _lease_holder(kubectl), timeout=30, interval=0.2, what="first leader")
        procs["sched-b"] = _spawn(["scheduler", *kc, "--leader-elect", "--metrics-listen", ""], log)
        kubectl("create", "deployment", "web", "--image=nginx", "--replicas=3")

        def ready():
            out = kubectl("get", "deploy", "web", "-o", "json").out
            return json.loads(out).get("status", {}).get("readyReplicas") == 3

        eventually_sync(ready, timeout=40, interval=0.2, what="3 ready replicas")
        # Kill the leader: the other replica takes over within the lease duration (15 s).
        leader = procs["sched-a"]
        leader.send_signal(signal.SIGKILL)
        leader.wait(10)
        holder_b = eventually_sync(lambda: (h := _lease_holder(kubectl)) and h != holder_a and h, timeout=40, interval=0.2,
                                   what="second leader")
        assert holder_b != holder_a
        kubectl("run", "after-failover", "--image=nginx")

        def bound():
            r = kubectl("get", "pod", "after-failover", "-o", "jsonpath={.spec.nodeName}", check=False)
            return r.out.strip()

        assert eventually_sync(bound, timeout=40, interval=0.2, what="pod scheduled by the new leader").startswith("node-")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
