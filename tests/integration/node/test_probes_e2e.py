"""Probes on a real node, end to end with kubectl: a liveness failure restarts
the container, readiness gates the pod's Ready condition and its Service's
endpoints, and a ready pod stays ready across an agent restart."""

from __future__ import annotations

import datetime
import json
import time

from kubeplane.node.cri.client import pb

from nodetest import BUSYBOX

WEB = ["sh", "-c", "mkdir -p /www && echo ok > /www/healthz && touch /tmp/alive && exec httpd -f -p 8080 -h /www"]


def _apply(node, obj: dict) -> None:
    node.kubectl("apply", "-f", "-", input=json.dumps(obj))


def _pod(name: str, container: dict, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", **container}]}}


def _get(node, kind: str, name: str) -> dict:
    return json.loads(node.kubectl("get", kind, name, "-o", "json").stdout)


def _wait(node, name: str, pred, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        proc = node.kubectl("get", "pod", name, "-o", "json", check=False)
        if proc.returncode == 0:
            pod = json.loads(proc.stdout)
            if pred(pod):
                return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {name} never got there; last: {json.dumps((pod or {}).get('status'))[:2000]}")


def _cond(pod: dict, t: str) -> str:
    return next((c["status"] for c in pod.get("status", {}).get("conditions", []) if c["type"] == t), "")


def _exec(node, pod: dict, cmd: list[str]) -> int:
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    return node.run(node.agent.cri.runtime("ExecSync", pb.ExecSyncRequest(
        container_id=cid, cmd=cmd, timeout=5))).exit_code


def _delete(node, *what: str) -> None:
    node.kubectl("delete", *what, "--ignore-not-found", "--wait=true", timeout=90)


def test_liveness_failure_restarts_the_container(real_node):
    _apply(real_node, _pod("live", {
        "command": WEB,
        "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 1,
                          "failureThreshold": 2},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}}))
    try:
        pod = _wait(real_node, "live", lambda p: _cond(p, "Ready") == "True")
        first = pod["status"]["containerStatuses"][0]
        assert first["restartCount"] == 0 and first["started"] is True and first["ready"] is True
        assert _exec(real_node, pod, ["rm", "/tmp/alive"]) == 0
        pod = _wait(real_node, "live", lambda p: p["status"]["containerStatuses"][0]["restartCount"] >= 1
                    and _cond(p, "Ready") == "True")
        cs = pod["status"]["containerStatuses"][0]
        assert cs["containerID"] != first["containerID"] and "terminated" in cs["lastState"]
        out = real_node.kubectl("get", "pod", "live").stdout
        assert "1/1" in out and "Running" in out
    finally:
        _delete(real_node, "pod", "live")


def test_readiness_gates_ready_and_the_service_endpoints(real_node):
    _apply(real_node, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gated"},
                       "spec": {"selector": {"app": "gated"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    _apply(real_node, _pod("gated", {
        "command": WEB,
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1,
                           "failureThreshold": 1}}, labels={"app": "gated"}))
    try:
        pod = _wait(real_node, "gated", lambda p: _cond(p, "Ready") == "True")
        assert _endpoint_ready(real_node, "gated", pod["status"]["podIP"]) is True
        # the health page goes away: unready (not restarted), out of the Service's ready endpoints
        assert _exec(real_node, pod, ["rm", "/www/healthz"]) == 0
        pod = _wait(real_node, "gated", lambda p: _cond(p, "Ready") == "False")
        cs = pod["status"]["containerStatuses"][0]
        assert cs["ready"] is False and cs["restartCount"] == 0 and "running" in cs["state"]
        assert _cond(pod, "ContainersReady") == "False"
        assert _endpoint_ready(real_node, "gated", pod["status"]["podIP"]) is False
        assert "0/1" in real_node.kubectl("get", "pod", "gated").stdout
        assert _exec(real_node, pod, ["sh", "-c", "echo ok > /www/healthz"]) == 0
        pod = _wait(real_node, "gated", lambda p: _cond(p, "Ready") == "True")
        assert _endpoint_ready(real_node, "gated", pod["status"]["podIP"]) is True
    finally:
        _delete(real_node, "pod", "gated")
        _delete(real_node, "service", "gated")


def _endpoint_ready(node, service: str, ip: str, timeout: float = 30.0) -> bool | None:
    """The ready condition of ``ip`` in the Service's EndpointSlice, once the slice has it
    and agrees with the pod's Ready condition (the controller follows the pod)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        slices = json.loads(node.kubectl("get", "endpointslices", "-l", f"kubernetes.io/service-name={service}",
                                         "-o", "json").stdout)["items"]
        pod_ready = _cond(_get(node, "pod", service), "Ready") == "True"
        for s in slices:
            for ep in s.get("endpoints") or []:
                if ip in ep.get("addresses", []):
                    last = ep.get("conditions", {}).get("ready")
                    if last is pod_ready:
                        return last
        time.sleep(0.3)
    return last


def test_ready_pod_stays_ready_across_an_agent_restart(real_node):
    # a long period: after the restart the pod is not probed again before the checks below
    _apply(real_node, _pod("steady", {
        "command": WEB,
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 30}}))
    try:
        pod = _wait(real_node, "steady", lambda p: _cond(p, "Ready") == "True")
        before = pod["status"]["containerStatuses"][0]
        # a container that started less than 10 s before the agent counts as new (upstream's
        # grace): let it run longer than that
        started = datetime.datetime.fromisoformat(before["state"]["running"]["startedAt"].replace("Z", "+00:00"))
        time.sleep(max(0.0, 11 - (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()))
        real_node.restart_agent()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            pod = _get(real_node, "pod", "steady")
            assert _cond(pod, "Ready") == "True", pod["status"]
            time.sleep(0.3)
        cs = pod["status"]["containerStatuses"][0]
        assert cs["containerID"] == before["containerID"] and cs["ready"] is True and cs["started"] is True
    finally:
        _delete(real_node, "pod", "steady")
