"""The controller roles of the CronJob controller and the ReplicationController
manager, as upstream's bootstrap policy has them, and the controller
manager's grants through them."""

from __future__ import annotations

from kubeplane.apiserver.bootstrappolicy import controller_roles, policy
from kubeplane.cluster import CONTROLLERS


def rules(name: str) -> list[dict]:
    (role,) = [r for r in controller_roles() if r["metadata"]["name"] == name]
    return role["rules"]


def test_cronjob_controller_role() -> None:
    assert rules("system:controller:cronjob-controller")[:5] == [
        {"verbs": ["get", "list", "update", "watch"], "apiGroups": ["batch"], "resources": ["cronjobs"]},
        {"verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "apiGroups": ["batch"],
         "resources": ["jobs"]},
        {"verbs": ["update"], "apiGroups": ["batch"], "resources": ["cronjobs/status"]},
        {"verbs": ["update"], "apiGroups": ["batch"], "resources": ["cronjobs/finalizers"]},
        {"verbs": ["delete", "list", "watch"], "apiGroups": [""], "resources": ["pods"]},
    ]


def test_replication_controller_role() -> None:
    assert rules("system:controller:replication-controller")[:4] == [
        {"verbs": ["get", "list", "update", "watch"], "apiGroups": [""], "resources": ["replicationcontrollers"]},
        {"verbs": ["update"], "apiGroups": [""], "resources": ["replicationcontrollers/status"]},
        {"verbs": ["update"], "apiGroups": [""], "resources": ["replicationcontrollers/finalizers"]},
        {"verbs": ["create", "delete", "list", "patch", "watch"], "apiGroups": [""], "resources": ["pods"]},
    ]


def test_controllers_are_registered_under_upstreams_names_and_bound() -> None:
    defs = {d.name: d for d in CONTROLLERS}
    assert defs["cronjob-controller"].aliases == ("cronjob",)
    assert defs["cronjob-controller"].account == "cronjob-controller"
    assert defs["replicationcontroller-controller"].aliases == ("replicationcontroller",)
    assert defs["replicationcontroller-controller"].account == "replication-controller"
    _, bindings = policy()
    bound = {b["roleRef"]["name"] for b in bindings
             if any(s.get("name") == "system:kube-controller-manager" for s in b.get("subjects") or [])}
    assert {"system:controller:cronjob-controller", "system:controller:replication-controller"} <= bound


def test_controllers_flag_selects_them_by_name_or_alias() -> None:
    from kubeplane.controllers.manager import select_controllers

    names = {d.name for d in select_controllers(CONTROLLERS, ["*", "-cronjob"])}
    assert "cronjob-controller" not in names and "replicationcontroller-controller" in names
    names = {d.name for d in select_controllers(CONTROLLERS, ["replicationcontroller-controller"])}
    assert names == {"replicationcontroller-controller"}
