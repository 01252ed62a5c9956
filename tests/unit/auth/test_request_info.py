"""Request info as upstream's RequestInfoFactory derives it."""

from __future__ import annotations

import pytest

from kubeplane.auth.requestinfo import RequestInfo, request_info


@pytest.mark.parametrize("method, path, query, expected", [
    ("GET", "/api/v1/namespaces/a/pods", {}, ("list", "", "a", "pods", "", "")),
    ("GET", "/api/v1/namespaces/a/pods", {"watch": "true"}, ("watch", "", "a", "pods", "", "")),
    ("GET", "/api/v1/namespaces/a/pods", {"watch": "false"}, ("list", "", "a", "pods", "", "")),
    ("GET", "/api/v1/namespaces/a/pods", {"watch": "1"}, ("watch", "", "a", "pods", "", "")),
    ("GET", "/api/v1/watch/namespaces/a/pods/p", {}, ("watch", "", "a", "pods", "", "p")),
    ("GET", "/api/v1/namespaces/a/pods", {"fieldSelector": "metadata.name=p"}, ("list", "", "a", "pods", "", "p")),
    ("GET", "/api/v1/namespaces/a/pods", {"fieldSelector": "metadata.name!=p"}, ("list", "", "a", "pods", "", "")),
    ("GET", "/api/v1/namespaces/a/pods/p", {}, ("get", "", "a", "pods", "", "p")),
    ("HEAD", "/api/v1/namespaces/a/pods/p", {}, ("get", "", "a", "pods", "", "p")),
    ("GET", "/api/v1/namespaces/a/pods/p/log", {}, ("get", "", "a", "pods", "log", "p")),
    ("POST", "/api/v1/namespaces/a/pods", {}, ("create", "", "a", "pods", "", "")),
    ("POST", "/api/v1/namespaces/a/pods/p/binding", {}, ("create", "", "a", "pods", "binding", "p")),
    ("PUT", "/apis/apps/v1/namespaces/a/deployments/d/scale", {}, ("update", "apps", "a", "deployments", "scale", "d")),
    ("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", {}, ("patch", "apps", "a", "deployments", "", "d")),
    ("DELETE", "/api/v1/namespaces/a/pods/p", {}, ("delete", "", "a", "pods", "", "p")),
    ("DELETE", "/api/v1/namespaces/a/pods", {}, ("deletecollection", "", "a", "pods", "", "")),
    ("GET", "/api/v1/pods", {}, ("list", "", "", "pods", "", "")),
    ("GET", "/api/v1/nodes/n", {}, ("get", "", "", "nodes", "", "n")),
    # a namespace names itself, and its status and finalize are subresources
    ("GET", "/api/v1/namespaces/a", {}, ("get", "", "a", "namespaces", "", "a")),
    ("PUT", "/api/v1/namespaces/a/finalize", {}, ("update", "", "a", "namespaces", "finalize", "a")),
    ("GET", "/api/v1/namespaces", {}, ("list", "", "", "namespaces", "", "")),
    # proxy takes no subresource: the rest is the proxied path
    ("GET", "/api/v1/proxy/namespaces/a/pods/p/x/y", {}, ("proxy", "", "a", "pods", "", "p")),
    ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {},
     ("create", "authorization.k8s.io", "", "selfsubjectaccessreviews", "", "")),
])
def test_resource_requests(method, path, query, expected):
    info = request_info(method, path, query)
    assert info.resource_request
    assert (info.verb, info.api_group, info.namespace, info.resource, info.subresource, info.name) == expected


@pytest.mark.parametrize("method, path", [
    ("GET", "/healthz"), ("GET", "/version"), ("GET", "/api"), ("GET", "/api/v1"), ("GET", "/apis"),
    ("GET", "/apis/apps"), ("GET", "/apis/apps/v1"), ("GET", "/openapi/v3"), ("POST", "/metrics"),
])
def test_non_resource_requests(method, path):
    assert request_info(method, path, {}) == RequestInfo(False, path, method.lower())
