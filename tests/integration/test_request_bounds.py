"""Bounded work per request against a real server process: the YAML alias
bomb, slowloris connections, and a watch from a resourceVersion far ahead
seen by the official client."""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path

import orjson
import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from conftest import start_server


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def laughs(levels: int = 7, width: int = 10) -> bytes:
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata: {name: lol}", "data:", '  a0: &a0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return ("\n".join(lines) + "\n").encode()


def post(server, path: str, body: bytes, content_type: str) -> tuple[int, dict, float]:
    conn = server.http_connection(timeout=30)
    t0 = time.monotonic()
    conn.request("POST", path, body=body, headers={"Content-Type": content_type})
    resp = conn.getresponse()
    data = resp.read()
    elapsed = time.monotonic() - t0
    conn.close()
    return resp.status, orjson.loads(data), elapsed


def test_yaml_alias_bomb_is_answered_400_fast_with_bounded_rss(server):
    path = "/api/v1/namespaces/default/configmaps"
    # Warm the path first so the measurement is of the bomb alone.
    status, _, _ = post(server, path, b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: warm}\n",
                        "application/yaml")
    assert status in (201, 409)
    before = rss_kb(server.proc.pid)
    for _ in range(3):
        status, body, elapsed = post(server, path, laughs(), "application/yaml")
        assert status == 400, body
        assert body["message"] == "error converting YAML to JSON: yaml: document contains excessive aliasing"
        assert elapsed < 1.0, elapsed
    grown = rss_kb(server.proc.pid) - before
    assert grown < 20 * 1024, f"RSS grew by {grown} kB"
    # Nothing was stored.
    status, _, _ = post(server, path, b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: after}\n",
                        "application/yaml")
    assert status == 201


def test_official_client_watch_from_a_resource_version_far_ahead(server):
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        v1 = client.CoreV1Api(api)
        with pytest.raises(ApiException) as err:
            for _ in watch.Watch().stream(v1.list_namespaced_config_map, "default",
                                          resource_version="1000000000000", timeout_seconds=10):
                pass
        assert err.value.status == 504
        status = orjson.loads(err.value.body)
        assert status["reason"] == "Timeout"
        assert status["message"].startswith("Timeout: Too large resource version: 1000000000000, current: ")
        # The connection pool is still fine for the next call.
        assert v1.list_namespaced_config_map("default").kind == "ConfigMapList"


def test_header_and_idle_timeouts_from_the_command_line(tmp_path):
    srv = start_server(tmp_path, extra=["--header-timeout", "500ms", "--idle-timeout", "1s"])
    try:
        slow = [srv.connect(timeout=10) for _ in range(50)]
        for s in slow:
            s.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        t0 = time.monotonic()
        for s in slow:
            assert s.recv(1024) == b""  # closed by the server
            s.close()
        assert time.monotonic() - t0 < 5
        idle = srv.connect(timeout=10)
        idle.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        t0 = time.monotonic()
        while True:
            chunk = idle.recv(65536)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 200")
        assert 0.8 <= time.monotonic() - t0 < 5
        idle.close()
    finally:
        srv.stop()
