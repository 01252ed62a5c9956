"""Services, Endpoints, EndpointSlices, Ingresses, IngressClasses and
NetworkPolicies with the real kubectl against `kubeplane up`: the kubernetes
Service, endpoints following a Deployment as it scales, upstream's columns,
describe, node port conflicts, and cascading deletion."""

from __future__ import annotations

import json

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync

NS = "endpoints-it"

APP = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - name: c
        image: nginx:1
        ports: [{{name: http, containerPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NS}}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: http}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-np, namespace: {NS}}}
spec:
  type: NodePort
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080, nodePort: 31234}}]
"""

NETWORKING = f"""
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: it-default
  annotations: {{ingressclass.kubernetes.io/is-default-class: "true"}}
spec:
  controller: example.com/ingress-controller
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: web, namespace: {NS}}}
spec:
  tls: [{{hosts: [web.example.com], secretName: web-tls}}]
  rules:
  - host: web.example.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{name: http}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: only-web, namespace: {NS}}}
spec:
  podSelector: {{matchLabels: {{app: web}}}}
  ingress:
  - from: [{{ipBlock: {{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}}}]
    ports: [{{port: 8080}}]
"""


@pytest.fixture(scope="module")
def ns(cluster_kubectl):
    cluster_kubectl("create", "namespace", NS)
    yield NS
    cluster_kubectl("delete", "namespace", NS, "--wait=false", check=False)
    cluster_kubectl("delete", "ingressclass", "it-default", "--ignore-not-found", check=False)


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


def _endpoint_ips(kubectl, name: str) -> list[str]:
    ep = json.loads(kubectl("get", "endpoints", name, "-n", NS, "-o", "json").out)
    return sorted(a["ip"] for ss in ep.get("subsets") or [] for a in ss.get("addresses") or [])


def test_kubernetes_service_and_its_endpoints(cluster_kubectl) -> None:
    k = cluster_kubectl
    rows = _rows(k("get", "service", "kubernetes", "-n", "default").out)
    assert rows[0] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    assert rows[1][:5] == ["kubernetes", "ClusterIP", "10.96.0.1", "<none>", "443/TCP"]
    ep = json.loads(k("get", "endpoints", "kubernetes", "-n", "default", "-o", "json").out)
    (subset,) = ep["subsets"]
    assert subset["ports"][0]["name"] == "https" and len(subset["addresses"]) == 1
    rows = _rows(k("get", "endpointslices", "kubernetes", "-n", "default").out)
    assert rows[0] == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert rows[1][:4] == ["kubernetes", "IPv4", str(subset["ports"][0]["port"]), subset["addresses"][0]["ip"]]


def test_endpoints_follow_a_deployment(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    k("apply", "-f", "-", stdin=APP)
    ips = eventually_sync(lambda: (lambda got: got if len(got) == 2 else None)(_endpoint_ips(k, "web")),
                          timeout=30, interval=0.2, what="two endpoints")
    pods = json.loads(k("get", "pods", "-n", NS, "-l", "app=web", "-o", "json").out)["items"]
    assert sorted(p["status"]["podIP"] for p in pods) == ips
    res = k("get", "endpoints", "web", "-n", NS)
    assert "Warning: v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice" in res.err
    rows = _rows(res.out)
    assert rows[0] == ["NAME", "ENDPOINTS", "AGE"]
    assert rows[1][1] == ",".join(f"{ip}:8080" for ip in ips)
    rows = _rows(k("get", "endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=web").out)
    assert rows[0] == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert rows[1][0].startswith("web-") and rows[1][1:3] == ["IPv4", "8080"]
    assert sorted(rows[1][3].split(",")) == ips
    described = k("describe", "service", "web", "-n", NS).out
    assert any(line.split(":", 1)[0].strip() == "TargetPort" and "http/TCP" in line
               for line in described.splitlines())
    assert any(line.split(":", 1)[0].strip() == "Endpoints" and all(f"{ip}:8080" in line for ip in ips)
               for line in described.splitlines())
    k("scale", "deployment", "web", "-n", NS, "--replicas=3")
    eventually_sync(lambda: len(_endpoint_ips(k, "web")) == 3, timeout=30, interval=0.2, what="three endpoints")
    slices = json.loads(k("get", "endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=web",
                          "-o", "json").out)["items"]
    (es,) = slices
    assert es["metadata"]["ownerReferences"][0]["kind"] == "Service"
    assert {e["nodeName"] for e in es["endpoints"]} <= {"node-0", "node-1", "node-2"}
    assert all(e["conditions"] == {"ready": True, "serving": True, "terminating": False} for e in es["endpoints"])


def test_node_port_and_cluster_ip_conflicts(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    k("apply", "-f", "-", stdin=APP)
    rows = _rows(k("get", "service", "web-np", "-n", NS).out)
    assert rows[1][1] == "NodePort" and rows[1][4] == "80:31234/TCP"
    res = k("create", "service", "nodeport", "taken", "-n", NS, "--tcp=80:8080", "--node-port=31234", check=False)
    assert res.rc == 1
    assert res.err.strip() == ('error: failed to create NodePort service: Service "taken" is invalid: '
                               'spec.ports[0].nodePort: Invalid value: 31234: provided port is already allocated')
    res = k("create", "service", "clusterip", "taken-ip", "-n", NS, "--tcp=80", "--clusterip=10.96.0.1",
            check=False)
    assert res.rc == 1
    assert 'spec.clusterIPs: Invalid value: []string{"10.96.0.1"}: failed to allocate IP 10.96.0.1: provided IP ' \
           'is already allocated' in res.err
    res = k("create", "service", "nodeport", "far", "-n", NS, "--tcp=80:8080", "--node-port=40000", check=False)
    assert "provided port is not in the valid range. The range of valid ports is 30000-32767" in res.err
    # the port is free again once its Service is gone
    k("delete", "service", "web-np", "-n", NS)
    k("create", "service", "nodeport", "reuse", "-n", NS, "--tcp=80:8080", "--node-port=31234")
    k("delete", "service", "reuse", "-n", NS)


def test_ingress_class_ingress_and_network_policy(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    k("apply", "-f", "-", stdin=NETWORKING)
    rows = _rows(k("get", "ingressclass", "it-default").out)
    assert rows[0] == ["NAME", "CONTROLLER", "PARAMETERS", "AGE"]
    assert rows[1][:4] == ["it-default", "(default)", "example.com/ingress-controller", "<none>"]
    out = k("get", "ingress", "web", "-n", NS).out
    rows = _rows(out)
    assert rows[0] == ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]
    # the DefaultIngressClass admission gave it the default class
    assert rows[1][:3] == ["web", "it-default", "web.example.com"] and "80, 443" in out
    described = k("describe", "ingress", "web", "-n", NS).out
    assert "Ingress Class:    it-default" in described and "web:http" in described
    rows = _rows(k("get", "networkpolicy", "-n", NS).out)
    assert rows[0] == ["NAME", "POD-SELECTOR", "AGE"] and rows[1][:2] == ["only-web", "app=web"]
    described = k("describe", "networkpolicy", "only-web", "-n", NS).out
    assert "Except: 10.1.0.0/16" in described and "Policy Types: Ingress" in described
    res = k("create", "ingress", "by-ip", "-n", NS, "--rule=1.2.3.4/x=web:80", check=False)
    assert res.rc == 1 and 'spec.rules[0].host: Invalid value: "1.2.3.4": must be a DNS name, not an IP address' \
        in res.err
    k("delete", "ingress", "web", "-n", NS)
    k("delete", "networkpolicy", "only-web", "-n", NS)


def test_deleting_a_service_takes_its_endpoints_and_slices(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    k("apply", "-f", "-", stdin=APP)
    eventually_sync(lambda: _endpoint_ips(k, "web"), timeout=30, interval=0.2, what="endpoints")
    k("delete", "service", "web", "-n", NS)

    def gone() -> bool:
        ep = k("get", "endpoints", "web", "-n", NS, "--ignore-not-found").out.strip()
        slices = k("get", "endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=web", "-o", "name").out
        return not ep and not slices.strip()

    eventually_sync(gone, timeout=30, interval=0.2, what="endpoints and slices deleted")


def test_ranges_from_the_flags(tmp_path) -> None:
    srv = start_server(tmp_path / "ranges", extra=["--service-cluster-ip-range", "10.43.0.0/16",
                                                   "--service-node-port-range", "32000-32010",
                                                   "--advertise-address", "192.0.2.44"])
    try:
        k = Kubectl(srv.kubeconfig, tmp_path / "home")
        svc = json.loads(k("get", "service", "kubernetes", "-n", "default", "-o", "json").out)
        assert svc["spec"]["clusterIP"] == "10.43.0.1"
        ep = json.loads(k("get", "endpoints", "kubernetes", "-n", "default", "-o", "json").out)
        assert ep["subsets"][0]["addresses"] == [{"ip": "192.0.2.44"}]
        k("create", "service", "nodeport", "np", "--tcp=80:8080")
        created = json.loads(k("get", "service", "np", "-o", "json").out)
        assert 32000 <= created["spec"]["ports"][0]["nodePort"] <= 32010
        assert created["spec"]["clusterIP"].startswith("10.43.")
        res = k("create", "service", "nodeport", "np2", "--tcp=80:8080", "--node-port=30080", check=False)
        assert "The range of valid ports is 32000-32010" in res.err
    finally:
        srv.stop()
