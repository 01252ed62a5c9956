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
    out = until("the answer across hosts", lambda: hosts.http_get("client-h1", ip))
    assert out.strip() == "web-h2"


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
