"""Versioned key-value storage with watch (the etcd model) and its backends."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kubeplane.storage.interface import Store
from kubeplane.storage.memory import (
    DEFAULT_HISTORY,
    DEFAULT_HISTORY_BYTES,
    DEFAULT_WATCH_QUEUE,
    DEFAULT_WATCH_QUEUE_BYTES,
    MemoryStore,
)

if TYPE_CHECKING:
    from kubeplane.storage.etcd import EtcdConfig

__all__ = ["MemoryStore", "SQLiteStore", "open_store"]


def __getattr__(name: str):
    # the SQLite backend (and the sqlite3 module) only when asked for
    if name in ("SQLiteStore", "DB_FILE"):
        from kubeplane.storage import sqlite

        return getattr(sqlite, name)
    raise AttributeError(f"module 'kubeplane.storage' has no attribute {name!r}")


async def open_store(
    kind: str,
    data_dir: str | None = None,
    *,
    history: int = DEFAULT_HISTORY,
    watch_queue: int = DEFAULT_WATCH_QUEUE,
    history_bytes: int = DEFAULT_HISTORY_BYTES,
    watch_queue_bytes: int = DEFAULT_WATCH_QUEUE_BYTES,
    etcd: "EtcdConfig | None" = None,
) -> Store:
    """Open a store of ``kind``: "memory", "sqlite" (kept in ``<data_dir>/kubeplane.db``)
    or "etcd" (reached as ``etcd`` says)."""
    if kind == "memory":
        return MemoryStore(history=history, watch_queue=watch_queue, history_bytes=history_bytes,
                           watch_queue_bytes=watch_queue_bytes)
    if kind == "sqlite":
        if not data_dir:
            raise ValueError("the sqlite store needs a data directory")
        from kubeplane.storage.sqlite import DB_FILE, SQLiteStore

        return await SQLiteStore.open(os.path.join(data_dir, DB_FILE), history=history, watch_queue=watch_queue,
                                      history_bytes=history_bytes, watch_queue_bytes=watch_queue_bytes)
    if kind == "etcd":
        from kubeplane.storage.etcd import EtcdConfig, EtcdStore

        return await EtcdStore.open(etcd or EtcdConfig(), watch_queue=watch_queue,
                                    watch_queue_bytes=watch_queue_bytes)
    raise ValueError(f"unknown storage kind {kind!r}; expected 'memory', 'sqlite' or 'etcd'")
