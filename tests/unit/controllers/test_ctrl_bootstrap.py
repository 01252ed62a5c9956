"""The bootstrap signer (one detached JWS per signing token in cluster-info,
kept as tokens come and go) and the token cleaner (expired tokens deleted);
cluster-info as the API server publishes it, read by a joining node."""

from __future__ import annotations

import datetime as dt

import pytest

from helpers import eventually
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.clusterinfo import publish_cluster_info
from kubeplane.auth import bootstraptoken as bt
from kubeplane.auth.pki import cert_pem, make_ca
from kubeplane.client.bootstrap import JoinError, ca_from_cluster_info
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.bootstrap import BootstrapSigner, TokenCleaner
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CONFIGMAPS = resource("configmaps")
SECRETS = resource("secrets")
T1 = "aaaaaa.0123456789abcdef"
T2 = "bbbbbb.0123456789abcdef"


@pytest.fixture
async def env():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    ca = cert_pem(make_ca()[0])
    await publish_cluster_info(registry, "https://10.0.0.1:6443", ca)
    yield client, ca
    await client.close()
    await registry.close()
    await store.close()


async def _cluster_info(client):
    return await client.get(CONFIGMAPS, bt.CLUSTER_INFO, bt.CLUSTER_INFO_NAMESPACE)


async def test_signatures_follow_the_tokens(env):
    client, ca = env
    signer = BootstrapSigner(client)
    await signer.start()
    try:
        await client.create(SECRETS, bt.token_secret(T1), "kube-system")
        await client.create(SECRETS, bt.token_secret(T2, usages=("authentication",)), "kube-system")

        async def signed():
            data = (await _cluster_info(client))["data"]
            return data if "jws-kubeconfig-aaaaaa" in data else None

        data = await eventually(signed)
        assert "jws-kubeconfig-bbbbbb" not in data  # may not sign
        cm = await _cluster_info(client)
        assert ca_from_cluster_info(cm, T1) == ca
        assert ca_from_cluster_info(cm, T1, [bt.ca_cert_hash(ca)]) == ca
        assert ca_from_cluster_info(cm, T2) is None  # not signed for it (yet): a join waits
        with pytest.raises(JoinError, match="none of the public keys"):
            ca_from_cluster_info(cm, T1, ["sha256:" + "1" * 64])
        with pytest.raises(JoinError, match="failed to verify JWS signature"):
            ca_from_cluster_info(cm, "aaaaaa.ffffffffffffffff")
        await client.delete(SECRETS, "bootstrap-token-aaaaaa", "kube-system")

        async def unsigned():
            return "jws-kubeconfig-aaaaaa" not in (await _cluster_info(client))["data"]

        await eventually(unsigned)
    finally:
        await signer.stop()


async def test_cleaner_deletes_expired_tokens(env):
    client, _ = env
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=2)
    await client.create(SECRETS, bt.token_secret(T1, ttl=dt.timedelta(hours=1), now=past), "kube-system")
    await client.create(SECRETS, bt.token_secret(T2), "kube-system")
    cleaner = TokenCleaner(client)
    await cleaner.start()
    try:
        async def gone():
            names = [s["metadata"]["name"] for s in (await client.list(SECRETS, "kube-system"))["items"]]
            return "bootstrap-token-aaaaaa" not in names and names

        names = await eventually(gone)
        assert "bootstrap-token-bbbbbb" in names
    finally:
        await cleaner.stop()


async def test_anonymous_may_read_cluster_info_only(env):
    client, _ = env
    roles = await client.get(resource("roles", "rbac.authorization.k8s.io"), "kubeplane:bootstrap-signer-clusterinfo",
                             "kube-public")
    assert roles["rules"] == [{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"],
                               "resourceNames": ["cluster-info"]}]
