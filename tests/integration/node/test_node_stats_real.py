"""``kubectl top`` on a real node: the agent measures its pods through the CRI
and reports with its Lease renewals."""

from __future__ import annotations

import json
import time

from kubeplane.api.quantity import parse_quantity

BURNER = """
apiVersion: v1
kind: Pod
metadata: {name: burner, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: burn
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "head -c 33554432 /dev/zero > /dev/shm/fill; while :; do :; done"]
  - name: idle
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"""


def _eventually(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1.0)
    raise AssertionError(f"{what} within {timeout:g}s; last: {last!r}")


def test_kubectl_top_pod_and_node_on_a_real_node(real_node):
    uid = None
    real_node.kubectl("apply", "-f", "-", input=BURNER % (real_node.busybox, real_node.busybox))
    try:
        real_node.kubectl("wait", "--for=condition=Ready", "pod/burner", "--timeout=90s", timeout=100)

        def top_containers():
            r = real_node.kubectl("top", "pod", "burner", "--containers", check=False)
            if r.returncode != 0:
                return None
            rows = {ln.split()[1]: ln.split()[2:] for ln in r.stdout.splitlines()[1:]}
            if set(rows) != {"burn", "idle"}:
                return None
            # the first sample of a new container rates it over its life so far, start-up
            # included; a later one covers a window in which the idle container only sleeps
            if parse_quantity(rows["idle"][0]) >= parse_quantity("50m"):
                return None
            return rows

        rows = _eventually(top_containers, 90, "kubectl top pod burner --containers shows the idle container idle")
        assert parse_quantity(rows["burn"][0]) >= parse_quantity("100m"), rows
        assert parse_quantity(rows["burn"][1]) >= parse_quantity("30Mi"), rows
        assert parse_quantity(rows["idle"][0]) < parse_quantity("50m"), rows
        assert parse_quantity(rows["idle"][1]) < parse_quantity("8Mi"), rows

        r = real_node.kubectl("top", "node", real_node.name)
        row = r.stdout.splitlines()[1].split()
        assert row[0] == real_node.name and parse_quantity(row[1]) >= parse_quantity("100m"), row

        # the metrics API's own object: a window and a fresh timestamp
        raw = json.loads(real_node.kubectl(
            "get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/burner").stdout)
        assert raw["window"].endswith("s") and float(raw["window"][:-1]) >= 1.0
        uid = json.loads(real_node.kubectl("get", "pod", "burner", "-o", "json").stdout)["metadata"]["uid"]
        assert uid in _reported(real_node)
    finally:
        real_node.kubectl("delete", "pod", "burner", "--wait=true", "--timeout=60s", check=False, timeout=90)
    # gone from the node's next report
    _eventually(lambda: uid not in _reported(real_node), 40, "the deleted pod left the node's usage report")


def _reported(real_node) -> set[str]:
    """The pod uids the node's Lease reports usage for."""
    lease = json.loads(real_node.kubectl("-n", "kube-node-lease", "get", "lease", real_node.name, "-o", "json").stdout)
    report = json.loads(lease["metadata"]["annotations"]["node.kubeplane.io/resource-usage"])
    return {p["uid"] for p in report["pods"]}
