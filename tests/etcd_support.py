"""etcd for tests: members of a fresh cluster on 127.0.0.1, stopped afterwards."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, AsyncIterator

from kubeplane.storage.etcd import EtcdConfig, EtcdStore
from kubeplane.storage.etcdprocess import EtcdCluster


@contextlib.asynccontextmanager
async def etcd_store(base: Path, *, size: int = 1, progress_notify_interval: str | None = None,
                     **config: Any) -> AsyncIterator[tuple[EtcdStore, EtcdCluster]]:
    """An EtcdStore on a new ``size``-member cluster in ``base``."""
    cluster = EtcdCluster(str(base), size, progress_notify_interval=progress_notify_interval)
    try:
        cluster.start()
        config.setdefault("compaction_interval", 0)
        store = await EtcdStore.open(EtcdConfig(servers=cluster.client_urls, **config))
        try:
            yield store, cluster
        finally:
            await store.close()
    finally:
        cluster.stop()
