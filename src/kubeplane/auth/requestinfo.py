"""What an HTTP request asks for, in authorization terms (upstream's
k8s.io/apiserver/pkg/endpoints/request.RequestInfoFactory).

``/api`` and ``/apis`` paths naming a resource are resource requests: the verb
comes from the method (``get`` becomes ``list`` or ``watch`` without a name,
``delete`` becomes ``deletecollection``), or from a ``watch``/``proxy`` path
segment; the namespace, resource, name and subresource from the path (and a
``metadata.name=`` field selector names the object of a list or watch).
Everything else (``/healthz``, ``/version``, discovery roots) is a
non-resource request whose verb is the lower-cased method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kubeplane.auth.authorizer import Attributes
from kubeplane.auth.user import UserInfo

_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                 "DELETE": "delete"}
_SPECIAL_VERBS = ("proxy", "watch")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    resource_request: bool
    path: str
    verb: str
    api_prefix: str = ""
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    #: the field selector of a list, watch or deletecollection
    field_selector: str = ""


def to_attributes(user: UserInfo, info: RequestInfo) -> Attributes:
    """The authorizer attributes of ``info`` asked by ``user``."""
    if not info.resource_request:
        return Attributes(user, info.verb, resource_request=False, path=info.path)
    return Attributes(user, info.verb, True, info.namespace, info.api_group, info.api_version, info.resource,
                      info.subresource, info.name, info.path, info.field_selector)


def _valid_path_segment(name: str) -> bool:
    return name not in (".", "..") and "/" not in name and "%" not in name


def _name_from_field_selector(selector: str) -> str:
    """The name a field selector requires exactly (``metadata.name=x`` or ``==``), else ""."""
    found = ""
    for term in selector.split(","):
        term = term.strip()
        if not term:
            continue
        for op in ("==", "="):
            field, sep, value = term.partition(op)
            if sep and not field.endswith("!"):
                if field.strip() == "metadata.name":
                    found = value.strip()
                break
    return found


def request_info(method: str, path: str, query: Mapping[str, str]) -> RequestInfo:
    """The request info of ``method path?query`` (``query``: first value per key)."""
    trimmed = path.strip("/")
    parts = trimmed.split("/") if trimmed else []
    verb = method.lower()
    plain = RequestInfo(False, path, verb)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return plain
    prefix = parts[0]
    rest = parts[1:]
    group = ""
    if prefix == "apis":
        if len(rest) < 3:
            return plain
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    if rest[0] in _SPECIAL_VERBS:
        if len(rest) < 2:
            # upstream fails the request here ("unable to determine kind and namespace")
            return RequestInfo(True, path, rest[0], prefix, group, version)
        verb, rest = rest[0], rest[1:]
    else:
        verb = _METHOD_VERBS.get(method.upper(), "")
    namespace = ""
    if rest[0] == "namespaces":
        if len(rest) > 1:
            namespace = rest[1]
            if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
                rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        watch = query.get("watch")
        verb = "watch" if watch is not None and watch.lower() not in ("false", "0") else "list"
        selector = query.get("fieldSelector")
        if selector:
            wanted = _name_from_field_selector(selector)
            if wanted and _valid_path_segment(wanted):
                name = wanted
    if not name and verb == "delete":
        verb = "deletecollection"
    selector = ""
    if verb in ("list", "watch", "deletecollection"):
        selector = query.get("fieldSelector") or ""
    return RequestInfo(True, path, verb, prefix, group, version, namespace, resource, subresource, name, selector)
