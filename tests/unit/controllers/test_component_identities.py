"""kubeplane's components act as upstream's: system:node:<name>, system:kube-scheduler,
system:kube-controller-manager (seen by the registry through the in-process client)."""

from __future__ import annotations

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.auth.user import current_user
from kubeplane.client.inprocess import InProcessClient
from kubeplane.cluster import Components, start_components
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore


async def test_nodes_and_controllers_write_as_themselves():
    store = MemoryStore(history=1000)
    reg = Registry(store, CATALOGUE)
    await ensure_default_namespaces(reg)
    writers: list[tuple[str, str, tuple[str, ...]]] = []
    create, list_ = reg.create, reg.list

    async def recording_create(res, obj, *args, **kwargs):
        user = current_user()
        writers.append((res.plural, user.name, user.groups))
        return await create(res, obj, *args, **kwargs)

    async def recording_list(res, *args, **kwargs):
        writers.append(("list " + res.plural, current_user().name, ()))
        return await list_(res, *args, **kwargs)

    reg.create, reg.list = recording_create, recording_list
    comps = Components()
    try:
        await start_components(comps, InProcessClient(reg), (2, "4", "8Gi", 110, 0, "node", 0), {},
                               controllers=True, scheduler=False)
    finally:
        await comps.stop()
        await reg.close()
        await store.close()
    nodes = [(name, groups) for plural, name, groups in writers if plural == "nodes"]
    assert nodes == [("system:node:node-0", ("system:nodes", "system:authenticated")),
                     ("system:node:node-1", ("system:nodes", "system:authenticated"))]
    listers = {name for plural, name, _ in writers if plural.startswith("list ")}
    assert "system:kube-controller-manager" in listers
    # each controller writes as its own kube-system ServiceAccount: the
    # ServiceAccount controller makes the namespaces' default accounts
    sa_writers = {(name, groups) for plural, name, groups in writers if plural == "serviceaccounts"}
    assert sa_writers == {("system:serviceaccount:kube-system:service-account-controller",
                           ("system:serviceaccounts", "system:serviceaccounts:kube-system",
                            "system:authenticated"))}


def test_controller_selection_as_kube_controller_manager_reads_it():
    from kubeplane.cluster import CONTROLLERS
    from kubeplane.controllers.manager import select_controllers

    every = [d.name for d in CONTROLLERS if d.enabled_by_default]
    assert [d.name for d in select_controllers(CONTROLLERS, ["*"])] == every
    # an alias or the full name turns one off; the order stays the table's
    without = [d.name for d in select_controllers(CONTROLLERS, ["*", "-deployment", "-replicaset-controller"])]
    assert without == [n for n in every if n not in ("deployment-controller", "replicaset-controller")]
    assert [d.name for d in select_controllers(CONTROLLERS, ["garbagecollector", "namespace"])] == [
        "namespace-controller", "garbage-collector-controller"]
    assert select_controllers(CONTROLLERS, []) == []
    import pytest

    with pytest.raises(ValueError, match='"nope" is not in the list of known controllers'):
        select_controllers(CONTROLLERS, ["*", "-nope"])
