"""Malformed requests get the right 4xx Status; nothing is stored; the server stays healthy."""

from __future__ import annotations

import uuid

import aiohttp
import orjson

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ok"},
       "spec": {"containers": [{"name": "c", "image": "nginx"}]}}

CASES = [
    # (id, method, path template, content-type, body, expected code, expected reason)
    ("malformed-json", "POST", "/api/v1/namespaces/{ns}/pods", "application/json", b'{"kind": "Pod", ', 400, "BadRequest"),
    ("malformed-yaml", "POST", "/api/v1/namespaces/{ns}/pods", "application/yaml", b"kind: Pod\n  bad: [\n", 400, "BadRequest"),
    ("json-array", "POST", "/api/v1/namespaces/{ns}/pods", "application/json", b"[1,2]", 400, "BadRequest"),
    ("json-scalar", "POST", "/api/v1/namespaces/{ns}/pods", "application/json", b'"pod"', 400, "BadRequest"),
    ("empty-body", "POST", "/api/v1/namespaces/{ns}/pods", "application/json", b"", 400, "BadRequest"),
    ("wrong-kind", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "kind": "Service"}), 400, "BadRequest"),
    ("unknown-kind", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "kind": "Widget", "apiVersion": "example.com/v1"}), 400, "BadRequest"),
    ("unknown-resource", "GET", "/api/v1/namespaces/{ns}/widgets", None, b"", 404, "NotFound"),
    ("unknown-group", "GET", "/apis/example.com/v1/widgets", None, b"", 404, "NotFound"),
    ("unknown-field-strict", "POST", "/api/v1/namespaces/{ns}/pods?fieldValidation=Strict", "application/json",
     orjson.dumps({**POD, "spec": {**POD["spec"], "bogus": 1}}), 400, "BadRequest"),
    ("wrong-type", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "spec": {"containers": "nginx"}}), 400, "BadRequest"),
    ("labels-not-strings", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "metadata": {"name": "x", "labels": {"a": 1}}}), 400, "BadRequest"),
    ("invalid-name", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "metadata": {"name": "Not_Valid"}}), 422, "Invalid"),
    ("missing-image", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "spec": {"containers": [{"name": "c"}]}}), 422, "Invalid"),
    ("bad-label-key", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "metadata": {"name": "x", "labels": {"bad key!": "v"}}}), 422, "Invalid"),
    ("unsupported-media", "POST", "/api/v1/namespaces/{ns}/pods", "text/csv", b"a,b", 415, "UnsupportedMediaType"),
    ("bad-protobuf", "POST", "/api/v1/namespaces/{ns}/configmaps", "application/vnd.kubernetes.protobuf",
     b"k8s\x00\x0a\xff\xff", 400, "BadRequest"),
    ("bad-patch-type", "PATCH", "/api/v1/namespaces/{ns}/pods/ok", "application/json", b"{}", 415, "UnsupportedMediaType"),
    ("bad-json-patch", "PATCH", "/api/v1/namespaces/{ns}/pods/ok", "application/json-patch+json",
     b'{"op":"add"}', 400, "BadRequest"),
    ("missing-namespace", "POST", "/api/v1/namespaces/nope-{ns}/pods", "application/json",
     orjson.dumps(POD), 404, "NotFound"),
    ("namespace-mismatch", "POST", "/api/v1/namespaces/{ns}/pods", "application/json",
     orjson.dumps({**POD, "metadata": {"name": "x", "namespace": "other"}}), 400, "BadRequest"),
    ("stale-update", "PUT", "/api/v1/namespaces/{ns}/pods/ok", "application/json",
     orjson.dumps({**POD, "metadata": {"name": "ok", "resourceVersion": "1"}}), 409, "Conflict"),
    ("bad-label-selector", "GET", "/api/v1/namespaces/{ns}/pods?labelSelector=a%20in%20(", None, b"", 400, "BadRequest"),
    ("bad-field-selector", "GET", "/api/v1/namespaces/{ns}/pods?fieldSelector=spec.bogus%3Dx", None, b"", 400, "BadRequest"),
    ("bad-limit", "GET", "/api/v1/namespaces/{ns}/pods?limit=abc", None, b"", 400, "BadRequest"),
    ("bad-continue", "GET", "/api/v1/namespaces/{ns}/pods?limit=1&continue=garbage", None, b"", 400, "BadRequest"),
    ("bad-resource-version", "GET", "/api/v1/namespaces/{ns}/pods?resourceVersion=abc&resourceVersionMatch=Exact",
     None, b"", 400, "BadRequest"),
    ("bad-dry-run", "POST", "/api/v1/namespaces/{ns}/pods?dryRun=Some", "application/json",
     orjson.dumps(POD), 400, "BadRequest"),
    ("binding-unknown-pod", "POST", "/api/v1/namespaces/{ns}/pods/nope/binding", "application/json",
     orjson.dumps({"metadata": {"name": "nope"}, "target": {"kind": "Node", "name": "n"}}), 404, "NotFound"),
    ("method-not-allowed", "PUT", "/api/v1/namespaces/{ns}/pods", "application/json", orjson.dumps(POD), 405,
     "MethodNotAllowed"),
    ("too-large", "POST", "/api/v1/namespaces/{ns}/configmaps", "application/json",
     b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},"data":{"a":"' + b"x" * (3 * 1024 * 1024 + 10) + b'"}}',
     413, "RequestEntityTooLarge"),
]


async def test_bad_input_table(server):
    ns = f"bad-{uuid.uuid4().hex[:8]}"
    async with server.session() as s:
        r = await s.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        assert r.status == 201
        r = await s.post(f"/api/v1/namespaces/{ns}/pods", json=POD)
        assert r.status == 201
        before = await (await s.get(f"/api/v1/namespaces/{ns}/pods/ok")).json()
        failures = []
        for case_id, method, path, ctype, body, code, reason in CASES:
            headers = {"Content-Type": ctype} if ctype else {}
            resp = await s.request(method, path.format(ns=ns), data=body, headers=headers)
            text = await resp.read()
            try:
                status = orjson.loads(text)
            except orjson.JSONDecodeError:
                failures.append(f"{case_id}: not JSON: {text[:200]!r}")
                continue
            if resp.status != code or status.get("kind") != "Status" or status.get("reason") != reason:
                failures.append(f"{case_id}: got {resp.status} {status.get('reason')} {status.get('message')!r}")
            elif status.get("code") != code or not status.get("message"):
                failures.append(f"{case_id}: Status body incomplete: {status}")
        assert not failures, "\n".join(failures)
        # Nothing partial was written and the original object is unchanged.
        listed = await (await s.get(f"/api/v1/namespaces/{ns}/pods")).json()
        assert [p["metadata"]["name"] for p in listed["items"]] == ["ok"]
        after = await (await s.get(f"/api/v1/namespaces/{ns}/pods/ok")).json()
        assert after == before
        cms = await (await s.get(f"/api/v1/namespaces/{ns}/configmaps")).json()
        assert cms["items"] == []
        health = await s.get("/readyz")
        assert health.status == 200


async def test_dropped_connections_do_not_hurt(server):
    """Clients that vanish mid-request or mid-watch leave the server healthy."""
    import asyncio

    for _ in range(5):
        reader, writer = await server.open_connection()
        writer.write(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"kind\":")
        await writer.drain()
        writer.close()
        reader2, writer2 = await server.open_connection()
        writer2.write(b"GET /api/v1/configmaps?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer2.drain()
        await reader2.readline()
        writer2.transport.abort()
    async with server.session() as s:
        r = await s.get("/healthz")
        assert r.status == 200
        r = await s.get("/api/v1/namespaces/default/configmaps")
        assert r.status == 200
