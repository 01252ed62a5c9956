"""A fake informer factory and snapshot for the VolumeRestrictions, VolumeZone
and NodeVolumeLimits tests, with builders of their nodes, pods and claims."""

from __future__ import annotations

import copy
from typing import Any

from kubeplane.client.informer import Indexer
from kubeplane.scheduler.framework.nodeinfo import NodeInfo


class _Inf:
    def __init__(self) -> None:
        self.indexer = Indexer()

    def add_event_handler(self, *a: Any, **kw: Any) -> None:
        return None


class Factory:
    def __init__(self) -> None:
        self.informers: dict[str, _Inf] = {}

    def informer_for(self, res, *a: Any, **kw: Any) -> _Inf:
        return self.informers.setdefault(res.plural, _Inf())

    def put(self, plural: str, obj: dict) -> None:
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("resourceVersion", "1")
        self.informer_for(type("R", (), {"plural": plural})).indexer.add(obj)


class Snapshot:
    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.node_info_list = nodes
        self.have_pods_with_affinity_list: list[NodeInfo] = []
        self.have_pods_with_required_anti_affinity_list: list[NodeInfo] = []

    def get(self, name: str) -> NodeInfo:
        return next(n for n in self.node_info_list if n.name == name)

    def num_nodes(self) -> int:
        return len(self.node_info_list)


def node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


def pod(name: str, *volumes: dict, node_name: str = "", uid: str = "") -> dict:
    spec: dict = {"containers": [{"name": "c"}], "volumes": list(volumes)}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"}, "spec": spec}


def claim_vol(claim: str, name: str = "") -> dict:
    return {"name": name or claim, "persistentVolumeClaim": {"claimName": claim}}


def pvc(name: str, modes: list[str] | None = None, volume: str = "", cls: str = "") -> dict:
    spec: dict = {"accessModes": modes or ["ReadWriteOnce"], "storageClassName": cls}
    if volume:
        spec["volumeName"] = volume
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}
