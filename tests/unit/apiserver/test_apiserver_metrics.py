"""The API server's /metrics: upstream's names and labels after real requests."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client.parser import text_string_to_metric_families

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import APIServer, APIServerConfig
from kubeplane.apiserver.metrics import REQUEST_DURATION_BUCKETS, request_labels, storage_type

CM = "/api/v1/namespaces/default/configmaps"


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def req_labels(verb, resource, scope, code=None, group="", version="v1", subresource="", dry_run=""):
    labels = {"verb": verb, "dry_run": dry_run, "group": group, "version": version, "resource": resource,
              "subresource": subresource, "scope": scope, "component": "apiserver"}
    if code is not None:
        labels["code"] = str(code)
    return frozenset(labels.items())


@pytest.fixture
async def server(tmp_path):
    srv = APIServer(APIServerConfig(insecure_http=True, data_dir=str(tmp_path), listen="127.0.0.1:0", storage="memory"))
    await srv.start()
    yield srv
    await srv.stop()


async def scrape(session, srv) -> dict:
    async with session.get(srv.url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return samples(await r.text())


async def test_request_counters_have_upstreams_labels(server):
    async with aiohttp.ClientSession() as s:
        for i in range(3):
            async with s.post(server.url + CM, json={"metadata": {"name": f"c{i}"}}) as r:
                assert r.status == 201
        async with s.post(server.url + CM, json={"metadata": {"name": "c0"}}) as r:
            assert r.status == 409
        async with s.post(server.url + CM + "?dryRun=All", json={"metadata": {"name": "dry"}}) as r:
            assert r.status == 201
        async with s.get(server.url + CM) as r:
            assert r.status == 200
        async with s.get(server.url + "/api/v1/configmaps") as r:
            assert r.status == 200
        async with s.get(server.url + CM + "/c0") as r:
            assert r.status == 200
        async with s.get(server.url + CM + "/missing") as r:
            assert r.status == 404
        async with s.put(server.url + CM + "/c0", json={"metadata": {"name": "c0"}, "data": {"a": "b"}}) as r:
            assert r.status == 200
        async with s.patch(server.url + CM + "/c0", data=b'{"data":{"x":"y"}}',
                           headers={"Content-Type": "application/merge-patch+json"}) as r:
            assert r.status == 200
        async with s.patch(server.url + CM + "/c1?fieldManager=t", data=b'{"apiVersion":"v1","kind":"ConfigMap",'
                           b'"metadata":{"name":"c1"},"data":{"k":"v"}}',
                           headers={"Content-Type": "application/apply-patch+yaml"}) as r:
            assert r.status == 200
        async with s.get(server.url + CM + "?watch=true&timeoutSeconds=1&resourceVersion=0") as r:
            assert r.status == 200
            await r.read()
        async with s.get(server.url + "/api/v1/watch/namespaces/default/configmaps?timeoutSeconds=1") as r:
            await r.read()
        async with s.delete(server.url + CM + "/c2") as r:
            assert r.status == 200
        async with s.delete(server.url + CM) as r:
            assert r.status == 200
        async with s.get(server.url + "/api/v1/namespaces/default/status") as r:
            pass
        async with s.get(server.url + "/apis/apps/v1/namespaces/default/deployments") as r:
            assert r.status == 200
        async with s.get(server.url + "/api/v1/nosuchthings") as r:
            assert r.status == 404
        async with s.get(server.url + "/healthz") as r:
            assert r.status == 200
        m = await scrape(s, server)

    total = "apiserver_request_total"
    assert m[(total, req_labels("POST", "configmaps", "resource", 201))] == 3
    assert m[(total, req_labels("POST", "configmaps", "resource", 409))] == 1
    assert m[(total, req_labels("POST", "configmaps", "resource", 201, dry_run="All"))] == 1
    assert m[(total, req_labels("LIST", "configmaps", "namespace", 200))] == 1
    assert m[(total, req_labels("LIST", "configmaps", "cluster", 200))] == 1
    assert m[(total, req_labels("GET", "configmaps", "resource", 200))] == 1
    assert m[(total, req_labels("GET", "configmaps", "resource", 404))] == 1
    assert m[(total, req_labels("PUT", "configmaps", "resource", 200))] == 1
    assert m[(total, req_labels("PATCH", "configmaps", "resource", 200))] == 1
    assert m[(total, req_labels("APPLY", "configmaps", "resource", 200))] == 1
    assert m[(total, req_labels("WATCH", "configmaps", "namespace", 200))] == 2
    assert m[(total, req_labels("DELETE", "configmaps", "resource", 200))] == 1
    assert m[(total, req_labels("DELETECOLLECTION", "configmaps", "namespace", 200))] == 1
    # (labelled as upstream whatever the answer: a namespace's status subresource)
    assert sum(v for k, v in m.items() if k[0] == total
               and req_labels("GET", "namespaces", "resource", subresource="status") <= k[1]) == 1
    assert m[(total, req_labels("LIST", "deployments", "namespace", 200, group="apps"))] == 1
    # Unknown resources are counted without their (client-chosen) names.
    assert m[(total, req_labels("GET", "", "", 404, version=""))] == 1
    assert m[(total, req_labels("GET", "", "", 200, version="", subresource="/healthz"))] == 1
    assert not any(k[0] == total and ("resource", "nosuchthings") in k[1] for k in m)
    # Durations: a histogram per label set, upstream's buckets.
    hist = req_labels("POST", "configmaps", "resource")
    assert m[("apiserver_request_duration_seconds_count", hist)] == 4
    les = sorted(float(dict(k[1])["le"]) for k in m
                 if k[0] == "apiserver_request_duration_seconds_bucket" and hist <= k[1])
    assert les == sorted([*REQUEST_DURATION_BUCKETS, float("inf")])
    # In flight: only the scrape itself, a read.
    assert m[("apiserver_current_inflight_requests", frozenset({("request_kind", "readOnly")}))] == 1
    assert m[("apiserver_current_inflight_requests", frozenset({("request_kind", "mutating")}))] == 0
    # Stored objects: the collection delete removed every configmap.
    assert m[("apiserver_storage_objects", frozenset({("resource", "configmaps")}))] == 0
    assert m[("apiserver_storage_objects", frozenset({("resource", "namespaces")}))] == 4
    assert m[("apiserver_storage_objects", frozenset({("resource", "deployments.apps")}))] == 0
    # Storage timings by operation and resource, as etcd's.
    # three creates and the one that found c0 there (dry runs do not reach storage)
    assert m[("etcd_request_duration_seconds_count", frozenset({("operation", "create"), ("type", "configmaps")}))] == 4
    assert m[("etcd_request_duration_seconds_count", frozenset({("operation", "delete"), ("type", "configmaps")}))] >= 3


async def test_watch_events_and_stored_objects(server):
    async with aiohttp.ClientSession() as s:
        for i in range(2):
            async with s.post(server.url + CM, json={"metadata": {"name": f"w{i}"}}) as r:
                assert r.status == 201
        async with s.get(server.url + CM + "?watch=1&resourceVersion=0&timeoutSeconds=1") as r:
            body = await r.read()
        assert body.count(b'"ADDED"') == 2
        m = await scrape(s, server)
    watch = frozenset({("group", ""), ("version", "v1"), ("kind", "ConfigMap")})
    assert m[("apiserver_watch_events_total", watch)] == 2
    assert m[("apiserver_storage_objects", frozenset({("resource", "configmaps")}))] == 2


async def test_each_server_counts_its_own(tmp_path):
    a = APIServer(APIServerConfig(insecure_http=True, data_dir=str(tmp_path / "a"), listen="127.0.0.1:0", storage="memory"))
    b = APIServer(APIServerConfig(insecure_http=True, data_dir=str(tmp_path / "b"), listen="127.0.0.1:0", storage="memory"))
    await a.start()
    await b.start()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(a.url + CM) as r:
                assert r.status == 200
            ma, mb = await scrape(s, a), await scrape(s, b)
        key = ("apiserver_request_total", req_labels("LIST", "configmaps", "namespace", 200))
        assert ma[key] == 1 and key not in mb
    finally:
        await a.stop()
        await b.stop()


async def test_authorization_hook_can_refuse(server):
    async def only_monitoring(request: web.Request) -> None:
        raise web.HTTPForbidden(text="forbidden: only system:monitoring may read /metrics")

    server.metrics.authorize = only_monitoring
    async with aiohttp.ClientSession() as s:
        async with s.get(server.url + "/metrics") as r:
            assert r.status == 403


@pytest.mark.parametrize("method, path, headers, want", [
    ("GET", "/api/v1/namespaces/ns/pods", {}, ("LIST", "", "", "v1", "pods", "", "namespace")),
    ("GET", "/api/v1/namespaces/ns/pods/p/log", {}, ("GET", "", "", "v1", "pods", "log", "resource")),
    ("POST", "/api/v1/namespaces/ns/pods/p/binding", {}, ("POST", "", "", "v1", "pods", "binding", "resource")),
    ("GET", "/api/v1/namespaces/ns", {}, ("GET", "", "", "v1", "namespaces", "", "resource")),
    ("GET", "/api/v1/nodes?watch=1", {}, ("WATCH", "", "", "v1", "nodes", "", "cluster")),
    ("GET", "/apis/apps/v1/watch/namespaces/ns/deployments/d", {},
     ("WATCH", "", "apps", "v1", "deployments", "", "resource")),
    ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", {"Content-Type": "application/apply-patch+yaml"},
     ("APPLY", "", "apps", "v1", "deployments", "scale", "resource")),
    ("DELETE", "/api/v1/namespaces/ns/pods?dryRun=Bogus", {}, ("DELETECOLLECTION", "invalid", "", "v1", "pods", "",
                                                               "namespace")),
    ("GET", "/api/v9/pods", {}, ("GET", "", "", "", "", "", "")),
    ("BREW", "/version", {}, ("other", "", "", "", "", "/version", "")),
    ("GET", "/openapi/v3/apis/apps/v1", {}, ("GET", "", "", "", "", "/openapi/v3", "")),
])
def test_request_labels(method, path, headers, want):
    assert request_labels(make_mocked_request(method, path, headers=headers), CATALOGUE) == want


def test_storage_type():
    assert storage_type("/registry/core/pods/ns/p") == "pods"
    assert storage_type("/registry/apps/deployments/") == "deployments.apps"
    assert storage_type("/registry/core/nodes/n1") == "nodes"
    assert storage_type("elsewhere") == ""
