"""Several hosts, one cluster: network namespaces joined by a link, each running
its own ``kubeplane node`` and containerd (multihost.py)."""

from __future__ import annotations

import pytest

from multihost import Hosts, client_pod, until, web_pod


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, image_archives):
    h = Hosts(str(tmp_path_factory.mktemp("hosts")), image_archives["dir"])
    try:
        yield h.start()
    finally:
        h.stop()


def test_pods_reach_each_other_by_ip_across_hosts(hosts):
    h1, h2 = hosts.hosts
    hosts.apply(web_pod("web-h2", h2.name), client_pod("client-h1", h1.name))
    web = hosts.wait_pod_ready("web-h2")
    until("client running", lambda: hosts.get("pod", "client-h1")["status"].get("phase") == "Running", 90)
    ip = web["status"]["podIP"]
    n1, n2 = hosts.get("node", h1.name), hosts.get("node", h2.name)
    assert n1["spec"]["podCIDR"] != n2["spec"]["podCIDR"]
    # each host routes the other's pod CIDR through it
    until("the route on h1", lambda: f"{n2['spec']['podCIDR']} via {h2.ip}" in h1.run("ip", "route").stdout)
    out = until("the answer across hosts", lambda: hosts.exec("client-h1", "wget", "-qO-",
                                                              f"http://{ip}/", check=False).stdout)
    assert out.strip() == "web-h2"


def _web_deployment(name: str, replicas: int, **extra) -> list[dict]:
    from nodetest import BUSYBOX

    script = "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 80 -h /www"
    labels = {"app": name}
    return [{
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                    "whenUnsatisfiable": "DoNotSchedule",
                                                    "labelSelector": {"matchLabels": labels}}],
                     **extra,
                     "containers": [{"name": "web", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", script],
                                     "ports": [{"containerPort": 80, "name": "http"}],
                                     "readinessProbe": {"httpGet": {"port": 80, "path": "/"}, "periodSeconds": 1,
                                                        "failureThreshold": 1}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"type": "NodePort", "selector": labels, "ports": [{"port": 80, "targetPort": "http"}]}}]


def _ready_pods(hosts, app: str) -> dict[str, str]:
    """{pod name: node} of the app's ready pods."""
    import json

    pods = json.loads(hosts.kubectl("get", "pods", "-l", f"app={app}", "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))}


def _answers(fetch, n: int) -> set[str]:
    return {fetch() for _ in range(n)}


def test_a_service_reaches_pods_on_both_hosts_by_cluster_ip_and_node_port(hosts):
    import json
    import urllib.request

    h1, h2 = hosts.hosts
    hosts.apply(*_web_deployment("spread", 2), client_pod("client-svc", h1.name))
    pods = until("two ready pods, one per host", lambda: len(set(_ready_pods(hosts, "spread").values())) == 2
                 and _ready_pods(hosts, "spread"), 120)
    svc = hosts.get("service", "spread")
    cluster_ip, node_port = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["nodePort"]
    until("client running", lambda: hosts.get("pod", "client-svc")["status"].get("phase") == "Running", 90)

    def via_cluster_ip():
        return hosts.exec("client-svc", "wget", "-qO-", f"http://{cluster_ip}/", check=False).stdout.strip()

    # from a pod on h1, requests land on the pods of both hosts
    seen = until("answers from both hosts' pods", lambda: _answers(via_cluster_ip, 12) >= set(pods) and True, 60)
    assert seen
    # the NodePort on every host's address, from outside the hosts (the test's own namespace)
    for h in (h1, h2):
        def via_node_port(h=h):
            with urllib.request.urlopen(f"http://{h.ip}:{node_port}/", timeout=5) as r:
                return r.read().decode().strip()
        until(f"the NodePort on {h.name}", lambda: _answers(via_node_port, 12) >= set(pods), 60)

    # a pod whose readiness fails leaves the Service within a few seconds
    gone, kept = sorted(pods)
    hosts.exec(gone, "rm", "/www/index.html")
    until(f"{gone} not ready", lambda: gone not in _ready_pods(hosts, "spread"), 20)
    until(f"only {kept} answers", lambda: _answers(via_cluster_ip, 10) == {kept}, 10)
    eps = json.loads(hosts.kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=spread", "-o",
                                   "json").stdout)["items"]
    ready = [e["targetRef"]["name"] for s in eps for e in s.get("endpoints") or [] if e["conditions"].get("ready")]
    assert ready == [kept]
    hosts.kubectl("delete", "deployment", "spread", "--wait=false")
    hosts.kubectl("delete", "service", "spread")
