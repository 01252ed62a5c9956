"""pods/log, pods/exec, pods/attach and pods/portforward in front of the
kubelet: validation worded as upstream's, simulated nodes, unreachable kubelets."""

from __future__ import annotations

import socket

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

P = "/api/v1/namespaces/default/pods"
WS = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
      "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": "v5.channel.k8s.io"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def api():
    registry = Registry(MemoryStore(), CATALOGUE)
    await ensure_default_namespaces(registry)
    nodes = resource("nodes")
    await registry.create(nodes, {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "sim", "labels": {"type": "kubeplane-simulated"}}}, None)
    await registry.create(nodes, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "real"}, "status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": _free_port()}}}}, None)
    pods = resource("pods")
    for name, node, containers in (("one", "real", ["c"]), ("two", "real", ["a", "b"]),
                                   ("unbound", None, ["c"]), ("simulated", "sim", ["c"])):
        spec = {"containers": [{"name": c, "image": "busybox"} for c in containers]}
        if node:
            spec["nodeName"] = node
        await registry.create(pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                     "spec": spec}, "default")
    async with TestClient(TestServer(build_app(registry, CATALOGUE))) as client:
        yield client


async def call(client, method, path, headers=None):
    r = await client.request(method, path, headers=headers)
    text = await r.text()
    return r.status, (orjson.loads(text) if text.startswith("{") else text)


async def test_log_options_are_validated_as_upstream(api):
    code, out = await call(api, "GET", f"{P}/one/log?tailLines=-1&limitBytes=0")
    assert code == 422 and out["reason"] == "Invalid"
    assert out["message"] == ('PodLogOptions "one" is invalid: [tailLines: Invalid value: -1: must be greater '
                              'than or equal to 0, limitBytes: Invalid value: 0: must be greater than 0]')
    code, out = await call(api, "GET", f"{P}/one/log?sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z")
    assert code == 422 and "at most one of `sinceTime` or `sinceSeconds` may be specified" in out["message"]
    code, out = await call(api, "GET", f"{P}/one/log?follow=perhaps")
    assert code == 400
    code, out = await call(api, "GET", f"{P}/two/log")
    assert (code, out["message"]) == (400, "a container name must be specified for pod two, choose one of: [a b]")
    code, out = await call(api, "GET", f"{P}/one/log?container=x")
    assert (code, out["message"]) == (400, "container x is not valid for pod one")


async def test_logs_of_pods_without_a_real_node_are_empty(api):
    assert await call(api, "GET", f"{P}/unbound/log") == (200, "")
    assert await call(api, "GET", f"{P}/simulated/log") == (200, "")


async def test_logs_from_an_unreachable_kubelet(api):
    code, out = await call(api, "GET", f"{P}/one/log")
    assert code == 500 and out["message"].startswith('Get "https://127.0.0.1:')
    assert "/containerLogs/default/one/c" in out["message"]


async def test_exec_options_are_validated(api):
    code, out = await call(api, "GET", f"{P}/one/exec?stdout=true", WS)
    assert (code, out["message"]) == (400, "you must specify at least 1 command")
    code, out = await call(api, "GET", f"{P}/one/exec?command=ls", WS)
    assert (code, out["message"]) == (400, "you must specify at least 1 of stdin, stdout, stderr")
    code, out = await call(api, "GET", f"{P}/two/exec?command=ls&stdout=true", WS)
    assert code == 400 and "choose one of: [a b]" in out["message"]
    code, out = await call(api, "POST", f"{P}/unbound/exec?command=ls&stdout=true", WS)
    assert (code, out["message"]) == (400, "pod unbound does not have a host assigned")
    code, out = await call(api, "GET", f"{P}/simulated/attach?stdout=true", WS)
    assert (code, out["message"]) == (400, "pod simulated is on the simulated node sim, which runs no containers")
    code, out = await call(api, "GET", f"{P}/missing/exec?command=ls&stdout=true", WS)
    assert code == 404
    code, out = await call(api, "PUT", f"{P}/one/exec?command=ls&stdout=true", WS)
    assert code == 405
    code, out = await call(api, "GET", f"{P}/one/portforward?ports=0", WS)
    assert code == 400 and "ports must be in the range 1-65535" in out["message"]


async def test_upgrades_and_unreachable_kubelets(api):
    code, out = await call(api, "GET", f"{P}/one/exec?command=ls&stdout=true")
    assert (code, out["message"]) == (400, "Upgrade request required")
    spdy = {"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
    code, out = await call(api, "POST", f"{P}/one/exec?command=ls&stdout=true",
                           {**spdy, "X-Stream-Protocol-Version": "v9.channel.k8s.io"})
    assert (code, out["message"]) == (403, "unable to upgrade: unable to negotiate protocol: client supports "
                                           "[v9.channel.k8s.io], server supports [v5.channel.k8s.io v4.channel.k8s.io]")
    code, out = await call(api, "POST", f"{P}/one/exec?command=ls&stdout=true",
                           {**spdy, "X-Stream-Protocol-Version": "v4.channel.k8s.io"})
    assert code == 500 and out["message"].startswith("error dialing backend")
    # the kubelet is down: the WebSocket attempt fails, and kubectl's SPDY retry gets the same answer
    code, out = await call(api, "GET", f"{P}/one/exec?command=ls&stdout=true", WS)
    assert code == 500 and out["message"].startswith("error dialing backend")
    code, again = await call(api, "POST", f"{P}/one/exec?command=ls&stdout=true",
                             {**spdy, "X-Stream-Protocol-Version": "v5.channel.k8s.io"})
    assert (code, again["message"]) == (500, out["message"])


async def test_discovery_lists_the_connect_subresources(api):
    code, out = await call(api, "GET", "/api/v1")
    subs = {r["name"]: r for r in out["resources"] if r["name"].startswith("pods/")}
    for name, kind in (("pods/exec", "PodExecOptions"), ("pods/attach", "PodAttachOptions"),
                       ("pods/portforward", "PodPortForwardOptions")):
        assert subs[name]["kind"] == kind and subs[name]["verbs"] == ["create", "get"]
