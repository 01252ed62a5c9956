"""Strategies of core/v1 Endpoints, discovery.k8s.io/v1 EndpointSlice and the
networking.k8s.io/v1 kinds (Ingress, IngressClass, NetworkPolicy): upstream's
v1 defaulting functions (``pkg/apis/<group>/v1/defaults.go``) and generation
rules (``pkg/registry/<group>/<kind>/strategy.go``).

Imported by :mod:`kubeplane.registry.strategies` (import that module, not this
one, first).
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.validation import register_extra_validator
from kubeplane.api.validation.networking import validate_ingress_class_annotation
from kubeplane.registry.strategies import NoGenerationStrategy, Strategy

Obj = dict[str, Any]

# upstream checks the class annotation of an Ingress on create only
register_extra_validator("ingresses.networking.k8s.io", validate_ingress_class_annotation)


def _dicts(v: Any) -> list[Obj]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


class EndpointsStrategy(NoGenerationStrategy):
    """SetDefaults_Endpoints: every port's protocol is TCP unless given."""

    def default(self, obj: Obj) -> None:
        for subset in _dicts(obj.get("subsets")):
            for port in _dicts(subset.get("ports")):
                if not port.get("protocol"):
                    port["protocol"] = "TCP"


class EndpointSliceStrategy(Strategy):
    """SetDefaults_EndpointPort (name "", protocol TCP); the generation moves
    when anything but metadata changes, as upstream's strategy does."""

    def default(self, obj: Obj) -> None:
        for port in _dicts(obj.get("ports")):
            if port.get("name") is None:
                port["name"] = ""
            if not port.get("protocol"):
                port["protocol"] = "TCP"


class IngressStrategy(Strategy):
    """Status is written through ``ingresses/status``; the generation follows the spec."""

    def initial_status(self, obj: Obj) -> Obj | None:
        return {"loadBalancer": {}}


class IngressClassStrategy(Strategy):
    """SetDefaults_IngressClass: a parameters reference is cluster-scoped unless told."""

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        params = spec.get("parameters") if isinstance(spec, dict) else None
        if isinstance(params, dict) and params.get("scope") is None:
            params["scope"] = "Cluster"


class NetworkPolicyStrategy(Strategy):
    """SetDefaults_NetworkPolicy(Port): ports are TCP, and policyTypes is
    Ingress, plus Egress when egress rules are given."""

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        for direction in ("ingress", "egress"):
            for rule in _dicts(spec.get(direction)):
                for port in _dicts(rule.get("ports")):
                    if not port.get("protocol"):
                        port["protocol"] = "TCP"
        if not spec.get("policyTypes"):
            types = ["Ingress"]
            if spec.get("egress"):
                types.append("Egress")
            spec["policyTypes"] = types
        if spec.get("podSelector") is None:
            spec["podSelector"] = {}
