"""API servers on etcd: the real kubectl against one, and two API servers
serving one cluster (a write through one is watched through the other,
exactly once; an acknowledged write survives SIGKILL of the server)."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from conftest import Kubectl, start_server
from kubeplane.storage.etcdprocess import EtcdCluster


@pytest.fixture
def etcd(tmp_path):
    cluster = EtcdCluster(str(tmp_path / "etcd"), 1).start()
    yield cluster
    cluster.stop()


def _server(tmp_path, name, etcd, shared):
    srv = start_server(tmp_path / name, storage="etcd",
                       extra=["--etcd-servers", ",".join(etcd.client_urls), "--data-dir", str(shared)])
    srv.data_dir = shared  # where its PKI is
    return srv


def test_kubectl_against_an_api_server_on_etcd(tmp_path, etcd):
    srv = _server(tmp_path, "a", etcd, tmp_path / "shared")
    try:
        kubectl = Kubectl(srv.kubeconfig, tmp_path / "home")
        kubectl("create", "configmap", "c1", "--from-literal=a=1")
        out = json.loads(kubectl("get", "configmap", "c1", "-o", "json").out)
        assert out["data"] == {"a": "1"}
        kubectl("label", "configmap", "c1", "x=y")
        dup = kubectl("create", "configmap", "c1", check=False)
        assert dup.rc != 0 and 'configmaps "c1" already exists' in dup.err
        kubectl("delete", "configmap", "c1")
        gone = kubectl("get", "configmap", "c1", check=False)
        assert gone.rc != 0 and 'configmaps "c1" not found' in gone.err
    finally:
        srv.stop()


def test_two_api_servers_serve_one_cluster(tmp_path, etcd):
    shared = tmp_path / "shared"
    a = _server(tmp_path, "a", etcd, shared)
    b = None
    try:
        # the second server finds the CA and ServiceAccount keys the first made
        b = _server(tmp_path, "b", etcd, shared)

        async def run() -> None:
            async with a.session() as sa, b.session() as sb:
                r = await sb.get("/api/v1/namespaces/default/configmaps")
                rv = (await r.json())["metadata"]["resourceVersion"]
                watch = await sb.get("/api/v1/namespaces/default/configmaps",
                                     params={"watch": "1", "resourceVersion": rv})
                names = [f"cm-{i}" for i in range(20)]
                for n in names:
                    r = await sa.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": n}})
                    assert r.status == 201, await r.text()
                seen: list[tuple[str, str]] = []
                while len(seen) < len(names):
                    line = await asyncio.wait_for(watch.content.readline(), 10)
                    ev = json.loads(line)
                    seen.append((ev["type"], ev["object"]["metadata"]["name"]))
                assert seen == [("ADDED", n) for n in names]  # in order, exactly once
                watch.close()
                # and the other way round, by a plain read
                r = await sb.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "from-b"}})
                assert r.status == 201
                r = await sa.get("/api/v1/namespaces/default/configmaps/from-b")
                assert r.status == 200

        asyncio.run(run())
        a.stop(signal.SIGKILL)

        async def after() -> None:
            async with b.session() as sb:
                r = await sb.get("/api/v1/namespaces/default/configmaps")
                names = {i["metadata"]["name"] for i in (await r.json())["items"]}
                assert {f"cm-{i}" for i in range(20)} | {"from-b"} <= names

        asyncio.run(after())
    finally:
        a.stop()
        if b is not None:
            b.stop()
