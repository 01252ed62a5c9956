"""The etcd backend's own guarantees: failover between members, durability,
compaction on an interval, progress notifications."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from kubeplane.storage.etcd import EtcdConfig, EtcdStore, parse_servers
from kubeplane.storage.etcdprocess import EtcdCluster
from kubeplane.storage.etcdrpc import rpc_pb2 as pb
from kubeplane.storage.etcdrpc import rpc_pb2_grpc as pbg
from kubeplane.storage.interface import CompactedError, StorageError

from etcd_support import etcd_store

PODS = "/registry/core/pods/a/"


async def _leader(cluster: EtcdCluster):
    """The member that leads the cluster now."""
    for m in cluster.members:
        if m.process is None:
            continue
        async with grpc.aio.insecure_channel(f"127.0.0.1:{m.client_port}") as ch:
            st = await pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=5)
            if st.leader == st.header.member_id:
                return m
    raise AssertionError("no member leads")


async def test_leader_killed_during_writes_loses_no_acknowledged_write(tmp_path: Path) -> None:
    async with etcd_store(tmp_path, size=3) as (store, cluster):
        acked: list[str] = []
        failed = 0
        stop = asyncio.Event()

        async def writer(n: int) -> None:
            nonlocal failed
            i = 0
            while not stop.is_set():
                key = f"{PODS}w{n}-{i}"
                i += 1
                try:
                    await store.create(key, {"metadata": {"name": key}})
                except StorageError:
                    failed += 1
                    await asyncio.sleep(0.05)
                    continue
                acked.append(key)

        tasks = [asyncio.create_task(writer(n)) for n in range(4)]
        await asyncio.sleep(1.0)
        leader = await _leader(cluster)
        before = len(acked)
        cluster.kill(leader)
        killed_at = time.monotonic()
        # clients recover within seconds: writes are acknowledged again
        while len(acked) < before + 50:
            assert time.monotonic() - killed_at < 15, "writes did not resume after the leader was killed"
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
        listed = {kv.key for kv in (await store.list(PODS)).items}
        assert set(acked) <= listed
        assert len(acked) > before


async def test_acknowledged_writes_survive_kill_9_of_the_only_member(tmp_path: Path) -> None:
    cluster = EtcdCluster(str(tmp_path), 1).start()
    try:
        store = await EtcdStore.open(EtcdConfig(servers=cluster.client_urls, compaction_interval=0))
        keys = [f"{PODS}p{i}" for i in range(200)]
        await asyncio.gather(*(store.create(k, {"metadata": {"name": k}}) for k in keys))
        revision = store.revision
        await store.close()
        cluster.kill(cluster.members[0])
        cluster.start_member(cluster.members[0], new=False)
        cluster.wait_ready()
        store = await EtcdStore.open(EtcdConfig(servers=cluster.client_urls, compaction_interval=0))
        try:
            result = await store.list(PODS)
            assert sorted(kv.key for kv in result.items) == sorted(keys)
            assert result.revision == revision
        finally:
            await store.close()
    finally:
        cluster.stop()


async def test_compaction_on_an_interval_makes_old_revisions_gone(tmp_path: Path) -> None:
    async with etcd_store(tmp_path, compaction_interval=0.3) as (store, _):
        first = await store.create(PODS + "x", {})
        for i in range(5):
            await store.update(PODS + "x", {"v": i})
        # the compactor compacts what it saw one interval earlier
        deadline = time.monotonic() + 10
        while store.compacted_revision <= first.mod_revision:
            assert time.monotonic() < deadline, "no compaction happened"
            await asyncio.sleep(0.1)
        with pytest.raises(CompactedError):
            await store.list(PODS, revision=first.mod_revision)
        with pytest.raises(CompactedError):
            store.watch(PODS, first.mod_revision - 1)


async def test_watch_progress_advances_without_events(tmp_path: Path) -> None:
    # etcd's progress notifications tell a quiet watch that it has seen every
    # revision up to the newest one (the bookmarks' resourceVersion)
    async with etcd_store(tmp_path, progress_notify_interval="200ms") as (store, _):
        w = store.watch(PODS, store.revision)
        other = await store.create("/registry/core/other/y", {})
        assert w.progress_revision() < other.mod_revision
        deadline = time.monotonic() + 10
        while w.progress_revision() < other.mod_revision:
            assert time.monotonic() < deadline, "no progress notification arrived"
            await asyncio.sleep(0.05)
        w.close()


def test_etcd_servers_are_parsed_and_checked() -> None:
    assert parse_servers("http://127.0.0.1:2379, http://127.0.0.1:2380") == [
        "http://127.0.0.1:2379", "http://127.0.0.1:2380"]
    for bad in ("", "127.0.0.1:2379", "ftp://h:1", "http://h"):
        with pytest.raises(ValueError):
            parse_servers(bad)
