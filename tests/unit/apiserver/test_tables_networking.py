"""Table columns and cells of Endpoints, EndpointSlices, Ingresses,
IngressClasses and NetworkPolicies, as upstream's printers give them."""

from __future__ import annotations

import datetime as dt

from kubeplane.api.resources import resource
from kubeplane.apiserver.tables import build_table, column_definitions

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)
MD = {"name": "x", "namespace": "default", "creationTimestamp": "2026-11-29T11:55:00Z"}


def cells(res: str, obj: dict) -> list:
    return build_table(resource(res), [{"metadata": MD, **obj}], now=NOW)["rows"][0]["cells"]


def headers(res: str) -> list[str]:
    return [c["name"] for c in column_definitions(resource(res))]


def test_endpoints() -> None:
    assert headers("endpoints") == ["Name", "Endpoints", "Age"]
    assert cells("endpoints", {}) == ["x", "<none>", "5m"]
    subsets = [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]},
               {"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 90}]}]
    assert cells("endpoints", {"subsets": subsets})[1] == "10.0.0.1:80,10.0.0.2:80,10.0.0.1:81 + 2 more..."
    assert cells("endpoints", {"subsets": subsets[1:]})[1] == "[fd00::1]:90"
    # a headless Service without ports: bare addresses
    assert cells("endpoints", {"subsets": [{"addresses": [{"ip": "10.0.0.9"}]}]})[1] == "10.0.0.9"


def test_endpoint_slices() -> None:
    assert headers("endpointslices") == ["Name", "AddressType", "Ports", "Endpoints", "Age"]
    assert cells("endpointslices", {"addressType": "IPv4", "ports": [], "endpoints": []}) == [
        "x", "IPv4", "<unset>", "<unset>", "5m"]
    eps = [{"addresses": [f"10.0.0.{i}"]} for i in range(1, 6)]
    ports = [{"name": "a", "port": 80}, {"name": "b"}, {"port": None}, {"name": "d", "port": 83}]
    assert cells("endpointslices", {"addressType": "IPv4", "ports": ports, "endpoints": eps})[2:4] == [
        "80,b,* + 1 more...", "10.0.0.1,10.0.0.2,10.0.0.3 + 2 more..."]


def test_ingresses() -> None:
    assert headers("ingresses") == ["Name", "Class", "Hosts", "Address", "Ports", "Age"]
    assert cells("ingresses", {"spec": {"defaultBackend": {}}}) == ["x", "<none>", "*", "", "80", "5m"]
    rules = [{"host": h} for h in ("a.com", "b.com", "c.com", "d.com", "e.com")]
    ing = {"spec": {"ingressClassName": "nginx", "rules": rules, "tls": [{"hosts": ["a.com"]}]},
           "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}, {"hostname": "lb.example.com"}]}}}
    assert cells("ingresses", ing)[1:5] == ["nginx", "a.com,b.com,c.com + 2 more...", "192.0.2.9,lb.example.com",
                                            "80, 443"]


def test_ingress_classes() -> None:
    assert headers("ingressclasses") == ["Name", "Controller", "Parameters", "Age"]
    ic = {"metadata": {**MD, "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
          "spec": {"controller": "example.com/ic",
                   "parameters": {"apiGroup": "k8s.example.com", "kind": "Params", "name": "p"}}}
    row = build_table(resource("ingressclasses"), [ic], now=NOW)["rows"][0]["cells"]
    assert row == ["x (default)", "example.com/ic", "Params.k8s.example.com/p", "5m"]
    assert cells("ingressclasses", {"spec": {"controller": "example.com/ic"}})[2] == "<none>"


def test_network_policies() -> None:
    assert headers("networkpolicies") == ["Name", "Pod-Selector", "Age"]
    assert cells("networkpolicies", {"spec": {"podSelector": {}}}) == ["x", "<none>", "5m"]
    sel = {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In",
                                                                "values": ["b", "a"]}]}
    assert cells("networkpolicies", {"spec": {"podSelector": sel}})[1] == "app=web,tier in (a,b)"
