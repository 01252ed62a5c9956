"""Several hosts, one cluster: network namespaces joined by a link, each running
its own ``kubeplane node`` and containerd (multihost.py)."""

from __future__ import annotations

import pytest

from multihost import KUBE_DNS_IP, Hosts, client_pod, until, web_pod


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


def test_pods_resolve_services_through_cluster_dns(hosts):
    """A pod's resolv.conf names the kube-dns Service; the Service proxy of its host takes the
    question to the DNS server of the control plane, which answers from the Services."""
    h1, h2 = hosts.hosts
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-dns"},
           "spec": {"selector": {"app": "web-dns"}, "ports": [{"name": "http", "port": 80}]}}
    hosts.apply(svc, web_pod("web-dns-h2", h2.name, labels={"app": "web-dns"}), client_pod("dns-client-h1", h1.name))
    cluster_ip = hosts.get("service", "web-dns")["spec"]["clusterIP"]
    until("client running", lambda: hosts.get("pod", "dns-client-h1")["status"].get("phase") == "Running", 90)
    resolv = hosts.exec("dns-client-h1", "cat", "/etc/resolv.conf").stdout.splitlines()
    assert f"nameserver {KUBE_DNS_IP}" in resolv and "options ndots:5" in resolv, resolv
    assert any(line.startswith("search default.svc.cluster.local svc.cluster.local cluster.local")
               for line in resolv), resolv
    out = until("the Service's name through cluster DNS", lambda: (lambda p: p.stdout if cluster_ip in p.stdout
                                                                  else None)(
        hosts.exec("dns-client-h1", "nslookup", "web-dns.default.svc.cluster.local", check=False)), 60)
    assert "web-dns.default.svc.cluster.local" in out
    # and the answer is the way to the pod: the Service by its name's address
    ready = hosts.wait_pod_ready("web-dns-h2")
    assert ready["spec"]["nodeName"] == h2.name
    got = until("the Service by its resolved address", lambda: hosts.exec(
        "dns-client-h1", "wget", "-qO-", f"http://{cluster_ip}/", check=False).stdout, 60)
    assert got.strip() == "web-dns-h2"


def test_a_service_and_a_stateful_set_pod_by_name_from_the_other_host(hosts):
    """``wget http://<svc>.<ns>.svc.cluster.local`` and a StatefulSet pod by its stable name
    (``<pod>.<service>.<ns>.svc.cluster.local``), from a pod on the other host."""
    from nodetest import BUSYBOX

    h1, h2 = hosts.hosts
    script = "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 80 -h /www"
    labels = {"app": "stable"}
    hosts.apply(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "stable"},
         "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "stable"},
         "spec": {"serviceName": "stable", "replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"nodeSelector": {"kubernetes.io/hostname": h2.name}, "terminationGracePeriodSeconds": 1,
                      "containers": [{"name": "web", "image": BUSYBOX, "imagePullPolicy": "Never",
                                      "command": ["sh", "-c", script], "ports": [{"containerPort": 80}],
                                      "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "named"},
         "spec": {"selector": labels, "ports": [{"port": 80}]}},
        client_pod("name-client-h1", h1.name))
    hosts.wait_pod_ready("stable-0")
    assert hosts.get("pod", "stable-0")["spec"]["nodeName"] == h2.name
    until("client running", lambda: hosts.get("pod", "name-client-h1")["status"].get("phase") == "Running", 90)
    for url in ("http://stable-0.stable.default.svc.cluster.local/", "http://named.default.svc.cluster.local/",
                "http://named/"):  # the last through the search path
        got = until(f"{url} from h1", lambda url=url: hosts.exec("name-client-h1", "wget", "-qO-", url,
                                                                  check=False).stdout, 60)
        assert got.strip() == "stable-0", url
    hosts.kubectl("delete", "statefulset", "stable", "--wait=false")
    hosts.kubectl("delete", "service", "stable", "named")


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

    def by_name():
        return hosts.exec("client-svc", "wget", "-qO-", "http://spread.default.svc.cluster.local/",
                          check=False).stdout.strip()

    # and by the Service's name, through cluster DNS
    until("answers by name from both hosts' pods", lambda: _answers(by_name, 12) >= set(pods), 60)
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


def test_a_host_whose_node_stops_loses_its_pods_to_the_other_and_the_service_keeps_answering(hosts):
    """Last of the module: it stops h2's node (and starts it again at the end)."""
    import json

    h1, h2 = hosts.hosts
    tolerations = [{"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 1} for t in ("not-ready", "unreachable")]
    deployment, service = _web_deployment("moving", 2, tolerations=tolerations)
    deployment["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "ScheduleAnyway"
    hosts.apply(deployment, service, client_pod("client-moving", h1.name))
    until("a ready pod on each host", lambda: set(_ready_pods(hosts, "moving").values()) == {h1.name, h2.name}, 120)
    until("client running", lambda: hosts.get("pod", "client-moving")["status"].get("phase") == "Running", 90)
    cluster_ip = hosts.get("service", "moving")["spec"]["clusterIP"]

    def via_cluster_ip():
        return hosts.exec("client-moving", "wget", "-qO-", f"http://{cluster_ip}/", check=False).stdout.strip()

    hosts.stop_node(h2)
    try:
        def ready_condition():
            node = hosts.get("node", h2.name)
            return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")
        until("h2 no longer Ready", lambda: ready_condition() == "Unknown", 60)
        # its pod evicted after the 1 s toleration, the Deployment's second pod runs on h1
        until("both ready pods on h1", lambda: list(_ready_pods(hosts, "moving").values()) == [h1.name] * 2, 120)
        names = set(_ready_pods(hosts, "moving"))
        until("the Service answering from h1's pods only", lambda: _answers(via_cluster_ip, 10) <= names
              and _answers(via_cluster_ip, 10), 30)
        node = hosts.get("node", h2.name)
        assert {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"} in [
            {k: t[k] for k in ("key", "effect")} for t in node["spec"].get("taints") or []]
    finally:
        hosts.start_node(h2)
        hosts.wait_ready(h2)
        hosts.kubectl("delete", "deployment", "moving", "--wait=false")
        hosts.kubectl("delete", "service", "moving")
    # back and Ready, the node loses the taint at the node lifecycle controller's next pass (every 5 s)
    until("h2's unreachable taint removed", lambda: json.loads(
        hosts.kubectl("get", "node", h2.name, "-o", "json").stdout)["spec"].get("taints") is None, 30)


def _labelled(pod: dict, **labels: str) -> dict:
    pod["metadata"]["labels"] = labels
    return pod


def test_network_policies_apply_on_the_host_of_each_end(hosts):
    """Ingress is enforced by the destination's node, egress by the source's;
    the kubelet's probes (traffic from the pod's own node) still pass."""
    h1, h2 = hosts.hosts
    hosts.apply(web_pod("np-web", h2.name), _labelled(client_pod("np-client", h1.name), role="client"),
                _labelled(client_pod("np-stranger", h1.name), role="other"))
    ip = hosts.wait_pod_ready("np-web")["status"]["podIP"]
    for name in ("np-client", "np-stranger"):
        until(f"{name} running", lambda: hosts.get("pod", name)["status"].get("phase") == "Running", 90)

    def answers(pod: str) -> bool:
        return (hosts.http_get(pod, ip) or "").strip() == "np-web"

    until("both reach the server", lambda: answers("np-client") and answers("np-stranger"), 60)
    hosts.apply({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "web"},
                 "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                          "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                                       "ports": [{"port": "http"}]}]}})
    until("the stranger kept out by the server's node", lambda: not answers("np-stranger"), 15)
    assert answers("np-client")
    hosts.apply({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "no-egress"},
                 "spec": {"podSelector": {"matchLabels": {"role": "client"}}, "policyTypes": ["Egress"]}})
    until("the client held back by its own node", lambda: not answers("np-client"), 15)
    # the server's node still probes it
    pod = hosts.get("pod", "np-web")
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"])
    hosts.kubectl("delete", "networkpolicy", "web", "no-egress")
    until("everyone back in", lambda: answers("np-client") and answers("np-stranger"), 15)
    hosts.kubectl("delete", "pod", "np-web", "np-client", "np-stranger", "--wait=false")
