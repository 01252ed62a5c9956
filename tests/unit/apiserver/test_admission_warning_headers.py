"""Warnings admission adds reach the client as Warning headers, on an
accepted write and on a refused one, through the one recorder."""

from __future__ import annotations

import aiohttp
from aiohttp.test_utils import TestServer

from kubeplane.api import errors
from kubeplane.api.resources import CATALOGUE
from kubeplane.api.warning import add_warning
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.admission import AdmissionChain, AdmissionPlugin, NamespaceLifecycle
from kubeplane.registry.registry import Registry
from kubeplane.storage import MemoryStore


class Warner(AdmissionPlugin):
    name = "Warner"

    def handles(self, operation, res):
        return res.kind == "ConfigMap"

    async def admit(self, attrs):
        add_warning("from mutating")

    async def validate(self, attrs):
        add_warning("from validating")
        add_warning("from mutating")  # kept once
        if attrs.name == "long":
            add_warning("a" * 3000)
            add_warning("b" * 3000)  # over 4 Ki in all: every warning is cut to 256 characters
        if attrs.name == "refused":
            raise errors.forbidden("no")


async def test_warnings_on_accepted_and_refused_writes() -> None:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE, admission=AdmissionChain([NamespaceLifecycle(store), Warner()]))
    await ensure_default_namespaces(registry)
    server = TestServer(build_app(registry, CATALOGUE), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            url = str(server.make_url("/api/v1/namespaces/default/configmaps"))
            for name, code in (("ok", 201), ("refused", 403)):
                async with session.post(url, json={"apiVersion": "v1", "kind": "ConfigMap",
                                                   "metadata": {"name": name}}) as resp:
                    assert resp.status == code
                    assert resp.headers.getall("Warning") == ['299 - "from mutating"', '299 - "from validating"']
            async with session.post(url, json={"apiVersion": "v1", "kind": "ConfigMap",
                                               "metadata": {"name": "long"}}) as resp:
                assert resp.status == 201
                assert resp.headers.getall("Warning") == [
                    '299 - "from mutating"', '299 - "from validating"', f'299 - "{"a" * 256}"', f'299 - "{"b" * 256}"']
    finally:
        await server.close()
        await registry.close()
        await store.close()
