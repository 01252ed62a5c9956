"""Endpoints, EndpointSlices, Ingresses, IngressClasses and NetworkPolicies
through the registry: v1 defaults, upstream's validation messages, and the
DefaultIngressClass admission plugin."""

from __future__ import annotations

import copy

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

EP = resource("endpoints")
SLICES = resource("endpointslices")
ING = resource("ingresses")
IC = resource("ingressclasses")
NP = resource("networkpolicies")
NS = "default"


@pytest.fixture
async def reg():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    yield registry
    await registry.close()
    await store.close()


async def invalid(coro) -> str:
    with pytest.raises(StatusError) as info:
        await coro
    assert info.value.code == 422, info.value.message
    return info.value.message


def ingress(name: str, **spec) -> dict:
    spec = spec or {"rules": [{"host": "a.example.com", "http": {"paths": [
        {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
    return {"metadata": {"name": name}, "spec": spec}


async def test_endpoints_defaults_and_checks(reg: Registry) -> None:
    ep = await reg.create(EP, {"metadata": {"name": "a"}, "subsets": [
        {"addresses": [{"ip": "10.1.0.1"}], "ports": [{"port": 80}]}]}, NS)
    assert ep["subsets"][0]["ports"][0]["protocol"] == "TCP"
    assert "generation" not in ep["metadata"]
    msg = await invalid(reg.create(EP, {"metadata": {"name": "b"}, "subsets": [
        {"addresses": [{"ip": "127.0.0.1"}, {"ip": "nope"}], "ports": [{"port": 80}, {"port": 0}]},
        {"ports": [{"port": 1}]}]}, NS))
    assert msg == (
        'Endpoints "b" is invalid: [subsets[0].addresses[0].ip: Invalid value: "127.0.0.1": may not be in the '
        'loopback range (127.0.0.0/8, ::1/128), subsets[0].addresses[1].ip: Invalid value: "nope": must be a '
        'valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff), subsets[0].addresses[1].ip: Invalid value: "nope": '
        'must be a valid IP address, subsets[0].ports[0].name: Required value, subsets[0].ports[1].name: Required '
        'value, subsets[0].ports[1].port: Invalid value: 0: must be between 1 and 65535, inclusive, subsets[1]: '
        'Required value: must specify `addresses` or `notReadyAddresses`]')


async def test_endpoint_slice_defaults_and_checks(reg: Registry) -> None:
    es = await reg.create(SLICES, {"metadata": {"name": "s"}, "addressType": "IPv4", "ports": [{"port": 80}],
                                   "endpoints": [{"addresses": ["10.1.0.1"]}]}, NS)
    assert es["ports"] == [{"port": 80, "name": "", "protocol": "TCP"}]
    assert es["metadata"]["generation"] == 1
    bumped = copy.deepcopy(es)
    bumped["endpoints"][0]["addresses"] = ["10.1.0.2"]
    bumped = await reg.update(SLICES, bumped, name="s", namespace=NS)
    assert bumped["metadata"]["generation"] == 2
    changed = copy.deepcopy(bumped)
    changed["addressType"] = "IPv6"
    changed["endpoints"] = []
    assert "addressType: Invalid value: \"IPv6\": field is immutable" in await invalid(
        reg.update(SLICES, changed, name="s", namespace=NS))
    msg = await invalid(reg.create(SLICES, {"metadata": {"name": "t"}, "addressType": "IPv4", "endpoints": [
        {"addresses": ["fd00::1"]}, {"addresses": []}]}, NS))
    assert msg == ('EndpointSlice.discovery.k8s.io "t" is invalid: [endpoints[0].addresses: Invalid value: '
                   '"fd00::1": must be an IPv4 address, endpoints[1].addresses: Required value: must contain at '
                   'least 1 address]')
    msg = await invalid(reg.create(SLICES, {"metadata": {"name": "u"}, "addressType": "IP"}, NS))
    assert msg == ('EndpointSlice.discovery.k8s.io "u" is invalid: addressType: Unsupported value: "IP": supported '
                   'values: "FQDN", "IPv4", "IPv6"')


async def test_ingress_checks(reg: Registry) -> None:
    created = await reg.create(ING, ingress("ok"), NS)
    assert created["status"] == {"loadBalancer": {}} and created["metadata"]["generation"] == 1
    assert await invalid(reg.create(ING, {"metadata": {"name": "empty"}, "spec": {}}, NS)) == (
        'Ingress.networking.k8s.io "empty" is invalid: spec: Invalid value: null: either `defaultBackend` or '
        '`rules` must be specified')
    msg = await invalid(reg.create(ING, ingress("bad", rules=[
        {"host": "*.*.example.com", "http": {"paths": [
            {"path": "a//b", "pathType": "Prefix", "backend": {"service": {"name": "Web", "port": {}}}},
            {"path": "/x", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
            {"path": "/y", "pathType": "Regex", "backend": {"resource": {"kind": "Bucket", "name": "b"},
                                                              "service": {"name": "s"}}}]}}]), NS))
    assert msg == (
        'Ingress.networking.k8s.io "bad" is invalid: [spec.rules[0].host: Invalid value: "*.*.example.com": a '
        "wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of "
        "lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. "
        "'*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]"
        "([-a-z0-9]*[a-z0-9])?)*'), spec.rules[0].http.paths[0].path: Invalid value: \"a//b\": must be an absolute "
        "path, spec.rules[0].http.paths[0].path: Invalid value: \"a//b\": must not contain '//', "
        "spec.rules[0].http.paths[0].backend.service.name: Invalid value: \"Web\": a DNS-1035 label must consist "
        "of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an "
        "alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is "
        "'[a-z]([-a-z0-9]*[a-z0-9])?'), spec.rules[0].http.paths[0].backend: Required value: port name or number "
        "is required, spec.rules[0].http.paths[1].pathType: Required value: pathType must be specified, "
        "spec.rules[0].http.paths[2].pathType: Unsupported value: \"Regex\": supported values: \"Exact\", "
        "\"ImplementationSpecific\", \"Prefix\", spec.rules[0].http.paths[2].backend: Invalid value: \"\": cannot "
        "set both resource and service backends]")
    # the class annotation and the field must agree on create
    body = ingress("both")
    body["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "a"}
    body["spec"]["ingressClassName"] = "b"
    assert await invalid(reg.create(ING, body, NS)) == (
        'Ingress.networking.k8s.io "both" is invalid: annotations.kubernetes.io/ingress.class: Invalid value: '
        '"a": must match `ingressClassName` when both are specified')


async def test_ingress_class_defaults_checks_and_default_class(reg: Registry) -> None:
    ic = await reg.create(IC, {"metadata": {"name": "nginx"}, "spec": {
        "controller": "k8s.io/ingress-nginx", "parameters": {"kind": "P", "name": "p"}}})
    assert ic["spec"]["parameters"]["scope"] == "Cluster"
    msg = await invalid(reg.create(IC, {"metadata": {"name": "bad"}, "spec": {
        "controller": "nginx", "parameters": {"kind": "P", "name": "p", "scope": "Namespace"}}}))
    assert msg == ('IngressClass.networking.k8s.io "bad" is invalid: [spec.controller: Invalid value: "nginx": '
                   'must be a domain-prefixed path (such as "acme.io/foo"), spec.parameters.namespace: Required '
                   "value: `parameters.scope` is set to 'Namespace']")
    changed = copy.deepcopy(ic)
    changed["spec"]["controller"] = "example.com/other"
    assert 'spec.controller: Invalid value: "example.com/other": field is immutable' in await invalid(
        reg.update(IC, changed, name="nginx"))
    # no default class yet: nothing is set
    plain = await reg.create(ING, ingress("plain"), NS)
    assert "ingressClassName" not in plain["spec"]
    await reg.create(IC, {"metadata": {"name": "old-default", "creationTimestamp": "2020-01-01T00:00:00Z",
                                       "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
                          "spec": {"controller": "example.com/a"}})
    defaulted = await reg.create(ING, ingress("defaulted"), NS)
    assert defaulted["spec"]["ingressClassName"] == "old-default"
    chosen = ingress("chosen")
    chosen["spec"]["ingressClassName"] = "nginx"
    assert (await reg.create(ING, chosen, NS))["spec"]["ingressClassName"] == "nginx"
    annotated = ingress("annotated")
    annotated["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "legacy"}
    assert "ingressClassName" not in (await reg.create(ING, annotated, NS))["spec"]


async def test_network_policy_defaults_and_checks(reg: Registry) -> None:
    np = await reg.create(NP, {"metadata": {"name": "p"}, "spec": {
        "egress": [{"ports": [{"port": 53}]}]}}, NS)
    assert np["spec"]["podSelector"] == {}
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert np["spec"]["egress"][0]["ports"][0]["protocol"] == "TCP"
    msg = await invalid(reg.create(NP, {"metadata": {"name": "q"}, "spec": {"podSelector": {}, "ingress": [
        {"from": [{}, {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16", "10.0.0.0/8"]},
                       "podSelector": {}}],
         "ports": [{"port": 80, "endPort": 70, "protocol": "ICMP"}, {"port": "http", "endPort": 90}]}],
        "policyTypes": ["Ingress", "Sideways"]}}, NS))
    assert msg == (
        'NetworkPolicy.networking.k8s.io "q" is invalid: [spec.ingress[0].ports[0].protocol: Unsupported value: '
        '"ICMP": supported values: "TCP", "UDP", "SCTP", spec.ingress[0].ports[0].endPort: Invalid value: 80: '
        'must be greater than or equal to `port`, spec.ingress[0].ports[1].endPort: Invalid value: 90: may not be '
        'specified when `port` is non-numeric, spec.ingress[0].from[0]: Required value: must specify a peer, '
        'spec.ingress[0].from[1].ipBlock.except[0]: Invalid value: "11.0.0.0/16": must be a strict subset of '
        '`cidr`, spec.ingress[0].from[1].ipBlock.except[1]: Invalid value: "10.0.0.0/8": must be a strict subset '
        'of `cidr`, spec.ingress[0].from[1]: Forbidden: may not specify both ipBlock and another peer, '
        'spec.policyTypes[1]: Unsupported value: "Sideways": supported values: "Ingress", "Egress"]')
