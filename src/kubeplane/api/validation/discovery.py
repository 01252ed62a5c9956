"""Validation of discovery.k8s.io/v1 EndpointSlices (upstream's
``pkg/apis/discovery/validation``).
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, duplicate, invalid_value, not_supported, required, too_many
from kubeplane.api.strings import is_dns1123_label, is_dns1123_subdomain, is_qualified_name, is_valid_label_value
from kubeplane.api.validation.common import _d, _immutable, _l, _s
from kubeplane.api.validation.ip import parse_ip, validate_endpoint_ip, validate_ip
from kubeplane.api.validation.meta import validate_labels

ADDRESS_TYPES = ("FQDN", "IPv4", "IPv6")
PROTOCOLS = ("SCTP", "TCP", "UDP")
MAX_TOPOLOGY_LABELS = 16
MAX_ADDRESSES = 100
MAX_PORTS = 20000
MAX_ENDPOINTS = 1000
MAX_ZONE_HINTS = 8
MAX_NODE_HINTS = 8
ZONE_LABEL = "topology.kubernetes.io/zone"


def _fqdn_errors(value: str) -> list[str]:
    """apimachinery's IsFullyQualifiedDomainName, for the FQDN address type."""
    if not value:
        return ["must not be empty"]
    name = value[:-1] if value.endswith(".") else value
    errs = is_dns1123_subdomain(name)
    if errs:
        return errs
    if len(name.split(".")) < 2:
        return ["should be a domain with at least two segments separated by dots"]
    for label in name.split("."):
        errs += is_dns1123_label(label)
    return errs


def _validate_endpoints(endpoints: list[Any], addr_type: Any, path: str) -> list[Cause]:
    if len(endpoints) > MAX_ENDPOINTS:
        return [too_many(path, len(endpoints), MAX_ENDPOINTS)]
    out: list[Cause] = []
    for i, ep in enumerate(endpoints):
        ep = _d(ep)
        p = f"{path}[{i}]"
        addrs = _l(ep.get("addresses"))
        if not addrs:
            out.append(required(f"{p}.addresses", "must contain at least 1 address"))
        elif len(addrs) > MAX_ADDRESSES:
            out.append(too_many(f"{p}.addresses", len(addrs), MAX_ADDRESSES))
        for j, addr in enumerate(addrs):
            ap = f"{p}.addresses[{j}]"
            if addr_type in ("IPv4", "IPv6"):
                errs = validate_ip(addr, ap)
                if errs:
                    out += errs
                    continue
                ip = parse_ip(addr)
                if addr_type == "IPv4" and ip is not None and ip.version != 4:
                    out.append(invalid_value(f"{p}.addresses", addr, "must be an IPv4 address"))
                if addr_type == "IPv6" and ip is not None and ip.version != 6:
                    out.append(invalid_value(f"{p}.addresses", addr, "must be an IPv6 address"))
                out += validate_endpoint_ip(addr, ap)
            elif addr_type == "FQDN":
                out += [invalid_value(ap, addr, m) for m in _fqdn_errors(_s(addr))]
        node = ep.get("nodeName")
        if node is not None:
            out += [invalid_value(f"{p}.nodeName", node, m) for m in is_dns1123_subdomain(_s(node))]
        topo = ep.get("deprecatedTopology")
        if isinstance(topo, dict):
            if len(topo) > MAX_TOPOLOGY_LABELS:
                out.append(too_many(f"{p}.deprecatedTopology", len(topo), MAX_TOPOLOGY_LABELS))
            out += validate_labels(topo, f"{p}.deprecatedTopology")
        hostname = ep.get("hostname")
        if hostname is not None:
            out += [invalid_value(f"{p}.hostname", hostname, m) for m in is_dns1123_label(_s(hostname))]
        hints = ep.get("hints")
        if isinstance(hints, dict):
            out += _validate_hints(hints, f"{p}.hints")
    return out


def _validate_hints(hints: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    zones = _l(hints.get("forZones"))
    if len(zones) > MAX_ZONE_HINTS:
        return [too_many(f"{path}.forZones", len(zones), MAX_ZONE_HINTS)]
    seen: set[str] = set()
    for i, z in enumerate(zones):
        name = _s(_d(z).get("name"))
        zp = f"{path}.forZones[{i}].name"
        if name in seen:
            out.append(duplicate(zp, name))
        seen.add(name)
        out += [invalid_value(zp, name, m) for m in is_valid_label_value(name)]
    nodes = _l(hints.get("forNodes"))
    if len(nodes) > MAX_NODE_HINTS:
        return out + [too_many(f"{path}.forNodes", len(nodes), MAX_NODE_HINTS)]
    seen = set()
    for i, n in enumerate(nodes):
        name = _s(_d(n).get("name"))
        np_ = f"{path}.forNodes[{i}].name"
        if name in seen:
            out.append(duplicate(np_, name))
        seen.add(name)
        out += [invalid_value(np_, name, m) for m in is_dns1123_subdomain(name)]
    return out


def _validate_ports(ports: list[Any], path: str) -> list[Cause]:
    if len(ports) > MAX_PORTS:
        return [too_many(path, len(ports), MAX_PORTS)]
    out: list[Cause] = []
    names: set[str] = set()
    for i, port in enumerate(ports):
        port = _d(port)
        p = f"{path}[{i}]"
        name = _s(port.get("name"))
        if name:
            out += [invalid_value(f"{p}.name", name, m) for m in is_dns1123_label(name)]
        if name in names:
            out.append(duplicate(f"{p}.name", name))
        names.add(name)
        proto = port.get("protocol")
        if proto is None:
            out.append(required(f"{p}.protocol"))
        elif proto not in PROTOCOLS:
            out.append(not_supported(f"{p}.protocol", proto, PROTOCOLS))
        app = port.get("appProtocol")
        if app is not None:
            out += [invalid_value(f"{p}.appProtocol", app, m) for m in is_qualified_name(_s(app))]
    return out


def _addresses_checked(obj: dict[str, Any]) -> list[Cause]:
    addr_type = obj.get("addressType")
    out: list[Cause] = []
    if not addr_type:
        out.append(required("addressType"))
    elif addr_type not in ADDRESS_TYPES:
        out.append(not_supported("addressType", addr_type, ADDRESS_TYPES))
    out += _validate_ports(_l(obj.get("ports")), "ports")
    return out


def _validate_endpoint_slice(obj: dict[str, Any]) -> list[Cause]:
    return _addresses_checked(obj) + _validate_endpoints(_l(obj.get("endpoints")), obj.get("addressType"),
                                                         "endpoints")


def _validate_endpoint_slice_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable(new.get("addressType"), old.get("addressType"), "addressType")
