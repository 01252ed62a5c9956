"""Fixtures shared by the unit tests (polling helpers and fakes: tests/helpers.py,
tests/fake_client.py)."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore


@pytest.fixture
async def inprocess_client() -> AsyncIterator[InProcessClient]:
    """An in-process client of a registry over a memory store, with the default namespaces."""
    store = MemoryStore(history=1000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    yield client
    await client.close()
    await registry.close()
    await store.close()
