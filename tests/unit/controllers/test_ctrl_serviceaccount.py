"""The ServiceAccount controller and the root CA publisher: one object in
every active namespace, put back when deleted (and, for the CA ConfigMap,
when edited); nothing is made in a terminating namespace."""

from __future__ import annotations

import pytest

from helpers import eventually, settled
from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.serviceaccount import (
    DESCRIPTION_ANNOTATION,
    ROOT_CA_DESCRIPTION,
    RootCACertPublisher,
    ServiceAccountsController,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

NS = resource("namespaces")
SAS = resource("serviceaccounts")
CMS = resource("configmaps")
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
async def env():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    started = []

    async def start(ctrl):
        await ctrl.start()
        started.append(ctrl)
        return ctrl

    yield client, start
    for ctrl in started:
        await ctrl.stop()
    await client.close()
    await registry.close()
    await store.close()


async def _get(client, res, name, ns):
    try:
        return await client.get(res, name, ns)
    except StatusError as err:
        if err.code == 404:
            return None
        raise


async def test_default_account_in_every_namespace_and_recreated(env):
    client, start = env
    ctrl = await start(ServiceAccountsController(client))
    for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
        await eventually(lambda ns=ns: _get(client, SAS, "default", ns), what=f"default SA in {ns}")
    await client.create(NS, {"metadata": {"name": "team"}})
    sa = await eventually(lambda: _get(client, SAS, "default", "team"))
    assert sa["metadata"]["namespace"] == "team" and "secrets" not in sa
    await client.delete(SAS, "default", "team")
    again = await eventually(lambda: _get(client, SAS, "default", "team"), what="re-created")
    assert again["metadata"]["uid"] != sa["metadata"]["uid"]
    # other accounts are left alone: once a later deletion of default is
    # repaired, bob is still gone
    await client.create(SAS, {"metadata": {"name": "bob"}}, "team")
    await client.delete(SAS, "bob", "team")
    await client.delete(SAS, "default", "team")
    await eventually(lambda: _get(client, SAS, "default", "team"), what="re-created again")
    assert await _get(client, SAS, "bob", "team") is None
    assert ctrl.running


async def test_nothing_is_made_in_a_terminating_namespace(env):
    client, start = env
    await client.create(NS, {"metadata": {"name": "going", "finalizers": ["x.io/hold"]}})
    await client.delete(NS, "going")  # terminating, held by the finalizer (no namespace controller)
    ctrl = await start(ServiceAccountsController(client))
    await eventually(lambda: _get(client, SAS, "default", "default"))
    await settled(ctrl, client, (ctrl.namespaces, NS))
    assert await _get(client, SAS, "default", "going") is None


async def test_root_ca_published_and_kept(env):
    client, start = env
    ctrl = await start(RootCACertPublisher(client, CA.encode()))
    cm = await eventually(lambda: _get(client, CMS, "kube-root-ca.crt", "kube-system"))
    assert cm["data"] == {"ca.crt": CA}
    assert cm["metadata"]["annotations"] == {DESCRIPTION_ANNOTATION: ROOT_CA_DESCRIPTION}
    await client.create(NS, {"metadata": {"name": "team"}})
    await eventually(lambda: _get(client, CMS, "kube-root-ca.crt", "team"))
    # an edit is put back
    edited = {**cm, "data": {"ca.crt": "tampered", "other": "x"}}
    await client.update(CMS, edited)

    async def restored():
        now = await _get(client, CMS, "kube-root-ca.crt", "kube-system")
        return now is not None and now["data"] == {"ca.crt": CA}

    await eventually(restored, what="restored")
    # other ConfigMaps are not touched (checked once a later deletion is repaired)
    app = await client.create(CMS, {"metadata": {"name": "app"}, "data": {"a": "b"}}, "team")
    # a deleted one comes back
    await client.delete(CMS, "kube-root-ca.crt", "team")
    await eventually(lambda: _get(client, CMS, "kube-root-ca.crt", "team"), what="re-created")
    assert (await client.get(CMS, "app", "team")) == app
    assert ctrl.running


def test_root_ca_publisher_needs_a_bundle():
    with pytest.raises(ValueError):
        RootCACertPublisher(None, b"  \n")  # type: ignore[arg-type]
