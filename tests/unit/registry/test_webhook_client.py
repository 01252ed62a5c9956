"""The webhook HTTPS client: caBundle-verified TLS, the per-call timeout, the
bounded response body, services resolved to their address."""

from __future__ import annotations

import asyncio
import base64

import orjson
import pytest
from aiohttp import web

from kubeplane.api.resources import resource
from kubeplane.registry import webhookclient
from kubeplane.registry.webhookclient import CallError, WebhookClient
from kubeplane.registry.webhooks import compile_configuration
from kubeplane.storage.memory import MemoryStore
from kubeplane.testing import WebhookInstallOptions, generate_certificates


@pytest.fixture
async def server():
    certs = WebhookInstallOptions()
    behaviour = {"delay": 0.0, "body": None}

    async def serve(request: web.Request) -> web.Response:
        review = orjson.loads(await request.read())
        if behaviour["delay"]:
            await asyncio.sleep(behaviour["delay"])
        if behaviour["body"] is not None:
            return web.Response(body=behaviour["body"], content_type="application/json")
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": review["request"]["uid"], "allowed": True, "warnings": [request.path, request.query_string,
                                                                           request.headers.get("Host", "")]}})

    app = web.Application()
    app.router.add_post("/{tail:.*}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", certs.port, ssl_context=certs.server_ssl_context()).start()
    yield certs, behaviour
    await runner.cleanup()


def hook_for(client_config: dict, timeout: int = 10):
    return compile_configuration({"metadata": {"name": "c"}, "webhooks": [{
        "name": "h.example.com", "clientConfig": client_config, "timeoutSeconds": timeout}]}, False)[0]


def review():
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u1"}}


async def test_tls_is_verified_against_the_ca_bundle(server):
    certs, _ = server
    client = WebhookClient()
    try:
        ca = base64.b64encode(certs.ca_pem).decode()
        out = await client.post(hook_for({"url": certs.url("/check"), "caBundle": ca}), review())
        assert out["response"]["warnings"][:2] == ["/check", "timeout=10s"]
        other_ca = base64.b64encode(generate_certificates(["127.0.0.1"])[0]).decode()
        with pytest.raises(CallError) as exc:
            await client.post(hook_for({"url": certs.url("/check"), "caBundle": other_ca}), review())
        assert str(exc.value) == (f'failed calling webhook "h.example.com": failed to call webhook: '
                                  f'Post "{certs.url("/check")}?timeout=10s": tls: failed to verify certificate: '
                                  "x509: certificate signed by unknown authority")
        # no bundle: the system roots, which do not know the test CA
        with pytest.raises(CallError, match="certificate signed by unknown authority"):
            await client.post(hook_for({"url": certs.url("/check")}), review())
    finally:
        await client.close()


async def test_timeout_and_body_limit(server, monkeypatch):
    certs, behaviour = server
    client = WebhookClient()
    ca = base64.b64encode(certs.ca_pem).decode()
    try:
        behaviour["delay"] = 3.0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(CallError, match=r'\?timeout=1s": context deadline exceeded$'):
            await client.post(hook_for({"url": certs.url("/slow"), "caBundle": ca}, timeout=1), review())
        assert loop.time() - t0 < 2.0
        behaviour["delay"] = 0.0
        behaviour["body"] = b'{"padding": "' + b"x" * 5000 + b'"}'
        monkeypatch.setattr(webhookclient, "MAX_RESPONSE_BYTES", 4096)
        with pytest.raises(CallError, match="response body larger than 4096 bytes"):
            await client.post(hook_for({"url": certs.url("/big"), "caBundle": ca}), review())
        behaviour["body"] = b"not json"
        monkeypatch.setattr(webhookclient, "MAX_RESPONSE_BYTES", 1 << 20)
        with pytest.raises(CallError, match="received invalid webhook response"):
            await client.post(hook_for({"url": certs.url("/junk"), "caBundle": ca}), review())
    finally:
        await client.close()


async def test_connection_refused_reads_as_upstreams():
    from kubeplane.testing._webhooks import _free_port

    port = _free_port("127.0.0.1")
    client = WebhookClient()
    try:
        with pytest.raises(CallError) as exc:
            await client.post(hook_for({"url": f"https://127.0.0.1:{port}/x"}), review())
        assert exc.value.reason == (f'failed to call webhook: Post "https://127.0.0.1:{port}/x?timeout=10s": '
                                    f"dial tcp 127.0.0.1:{port}: connect: connection refused")
    finally:
        await client.close()


async def test_service_reference_is_resolved(server):
    certs, _ = server
    store = MemoryStore()
    client = WebhookClient(store)
    ca = base64.b64encode(certs.ca_pem).decode()
    svc = resource("services")
    try:
        cc = {"service": {"name": "hooks", "namespace": "default", "port": certs.port, "path": "/via-service"},
              "caBundle": ca}
        with pytest.raises(CallError, match='service "hooks" not found'):
            await client.post(hook_for(cc), review())
        await store.create(svc.storage_key("hooks", "default"), {"metadata": {"name": "hooks"}, "spec": {
            "type": "ClusterIP", "clusterIP": "127.0.0.1", "ports": [{"port": certs.port}]}})
        url, server_name = await client.resolve(hook_for(cc))
        assert (url, server_name) == (f"https://127.0.0.1:{certs.port}/via-service", "hooks.default.svc")
        # the certificate is checked for the service's DNS name, which the test one lacks
        with pytest.raises(CallError, match="certificate is not valid for"):
            await client.post(hook_for(cc), review())
        await store.update(svc.storage_key("hooks", "default"), {"metadata": {"name": "hooks"}, "spec": {
            "type": "ExternalName", "externalName": "localhost"}})
        url, _ = await client.resolve(hook_for(cc))
        assert url == f"https://localhost:{certs.port}/via-service"
    finally:
        await client.close()
        await store.close()
