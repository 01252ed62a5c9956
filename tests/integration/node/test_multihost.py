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
    out = until("the answer across hosts", lambda: hosts.exec("client-h1", "wget", "-qO-", "-T", "3",
                                                              f"http://{ip}/", check=False).stdout)
    assert out.strip() == "web-h2"
