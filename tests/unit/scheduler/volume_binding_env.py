"""The VolumeBinding plugin in a fake cluster (informers, a client recording
PUTs) and builders of nodes, classes, claims, volumes and pods, shared by the
volume binding tests."""

from __future__ import annotations

import copy
import random
from typing import Any

from kubeplane.api.errors import conflict
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.types import CycleState
from kubeplane.scheduler.plugins.volumebinding.volume_binding import VolumeBinding
from kubeplane.volume.matching import (
    ANN_BETA_STORAGE_CLASS, ANN_BIND_COMPLETED, ANN_SELECTED_NODE, hostname_affinity, pinned_hostnames,
)

from fake_client import FakeInformer


class FakeFactory:
    def __init__(self) -> None:
        self.informers: dict[str, FakeInformer] = {}

    def informer_for(self, res, *args: Any, **kw: Any) -> FakeInformer:
        return self.informers.setdefault(res.plural, FakeInformer())


class FakeClient:
    """Records PUTs and returns the object with a new resourceVersion (optionally a 409)."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, dict]] = []
        self.conflict_on: set[str] = set()
        self._rv = 1000

    async def update(self, res, obj: dict, **kw: Any) -> dict:
        name = obj["metadata"]["name"]
        if name in self.conflict_on:
            raise conflict(res.plural, name, "the object has been modified")
        self.updates.append((res.plural, copy.deepcopy(obj)))
        self._rv += 1
        out = copy.deepcopy(obj)
        out["metadata"]["resourceVersion"] = str(self._rv)
        return out


class Env:
    def __init__(self, args: dict | None = None) -> None:
        self.factory = FakeFactory()
        self.client = FakeClient()
        self.handle = Handle(client=self.client, informer_factory=self.factory)
        self.plugin = VolumeBinding(args, self.handle)
        self._rv = 0
        for n in ("n1", "n2"):
            self.put("nodes", node(n))

    def inf(self, plural: str) -> FakeInformer:
        return self.factory.informers[plural]

    def put(self, plural: str, obj: dict, notify: bool = True) -> dict:
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        return self.factory.informer_for(_Res(plural)).put(obj, notify)

    def get(self, plural: str, key: str) -> dict:
        obj = self.inf(plural).indexer.get_by_key(key)
        assert obj is not None
        return obj

    def node_info(self, name: str) -> NodeInfo:
        return NodeInfo(self.get("nodes", name))

    def cycle(self, p: dict) -> tuple[CycleState, PodInfo, Any]:
        state = CycleState()
        pi = PodInfo(p)
        result, st = self.plugin.pre_filter(state, pi, [])
        return state, pi, (result, st)

    def feasible(self, p: dict) -> dict[str, Any]:
        """PreFilter + Filter on both nodes: node -> Status|None (or the PreFilter status)."""
        state, pi, (_, st) = self.cycle(p)
        if st is not None:
            return {"prefilter": st}
        return {n: self.plugin.filter(state, pi, self.node_info(n)) for n in ("n1", "n2")}


class _Res:
    def __init__(self, plural: str) -> None:
        self.plural = plural


def node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


def sc(name: str, mode: str | None = "WaitForFirstConsumer", provisioner: str = "kubernetes.io/no-provisioner",
       **extra: Any) -> dict:
    obj: dict = {"metadata": {"name": name}, "provisioner": provisioner, **extra}
    if mode is not None:
        obj["volumeBindingMode"] = mode
    return obj


def pvc(name: str, cls: str = "local", size: str = "1Gi", volume: str = "", bound: bool = False,
        ns: str = "default", **ann: str) -> dict:
    anns = dict(ann)
    if bound:
        anns[ANN_BIND_COMPLETED] = "yes"
    spec: dict = {"storageClassName": cls, "accessModes": ["ReadWriteOnce"],
                  "resources": {"requests": {"storage": size}}}
    if volume:
        spec["volumeName"] = volume
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": anns},
            "spec": spec, "status": {"phase": "Bound" if bound else "Pending"}}


def pv(name: str, cls: str = "local", size: str = "1Gi", on: str | None = None, claim: dict | None = None,
       phase: str = "Available") -> dict:
    spec: dict = {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": cls}
    if on:
        spec["nodeAffinity"] = hostname_affinity(on)
    if claim is not None:
        spec["claimRef"] = {"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"],
                            "uid": claim["metadata"]["uid"]}
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


def pod(name: str, *claims: str, ephemeral: str | None = None) -> dict:
    vols: list[dict] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)]
    if ephemeral:
        vols.append({"name": ephemeral, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}})
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c"}], "volumes": vols}}


def random_volume(rng: random.Random, i: int, claims: list[dict]) -> dict:
    spec: dict = {"capacity": {"storage": rng.choice(["1Gi", "2Gi", "3Gi", "500Mi"])},
                  "accessModes": rng.choice([["ReadWriteOnce"], ["ReadOnlyMany"], ["ReadWriteOnce", "ReadOnlyMany"]]),
                  "storageClassName": rng.choice(["local", "local", "other"])}
    if rng.random() < 0.1:
        spec["volumeMode"] = "Block"
    kind = rng.randrange(5)
    if kind == 1:
        spec["nodeAffinity"] = hostname_affinity(rng.choice(["n1", "n2", "n3"]))
    elif kind == 2:  # pinned to two hosts and a zone
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]},
            {"key": "zone", "operator": "In", "values": [rng.choice(["a", "b"])]}]}]}}
    elif kind == 3:  # zone only: checked per node
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": [rng.choice(["a", "b"])]}]}]}}
    elif kind == 4:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": []}}
    md: dict = {"name": f"pv{i}", "resourceVersion": str(i), "labels": {"tier": rng.choice(["gold", "silver"])}}
    if rng.random() < 0.05:
        md["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    if rng.random() < 0.05:
        md["annotations"] = {ANN_BETA_STORAGE_CLASS: "other"}
    r = rng.random()
    if r < 0.15:
        spec["claimRef"] = {"namespace": "default", "name": "someone-else", "uid": "x"}
    elif r < 0.2:
        c = rng.choice(claims)
        spec["claimRef"] = {"namespace": "default", "name": c["metadata"]["name"], "uid": c["metadata"]["uid"]}
    phase = "Available" if rng.random() < 0.85 else rng.choice(["Bound", "Released", "Pending"])
    return {"metadata": md, "spec": spec, "status": {"phase": phase}}


def random_env(rng: random.Random) -> tuple[Env, list[str], list[dict]]:
    env = Env()
    names = ["n1", "n2"]
    for i in range(3, 7):
        env.put("nodes", node(f"n{i}", zone=rng.choice(["a", "b"])))
        names.append(f"n{i}")
    env.put("nodes", {"metadata": {"name": "bare", "labels": {"zone": "b"}}})
    names.append("bare")
    env.put("storageclasses", sc("local"))
    dyn_extra: dict = {}
    if rng.random() < 0.3:
        dyn_extra["allowedTopologies"] = [{"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}]
    env.put("storageclasses", sc("other", provisioner=rng.choice(["kubeplane.io/local", "kubernetes.io/no-provisioner"]),
                                 **dyn_extra))
    claims = []
    for i in range(4):
        c = pvc(f"c{i}", cls=rng.choice(["local", "other"]), size=rng.choice(["1Gi", "2Gi", "600Mi"]))
        if rng.random() < 0.05:
            c["metadata"]["annotations"][ANN_SELECTED_NODE] = rng.choice(names)
        claims.append(env.put("persistentvolumeclaims", c))
    for i in range(rng.randrange(0, 25)):
        v = random_volume(rng, i, claims)
        v["metadata"].pop("resourceVersion")
        affinity = v["spec"].get("nodeAffinity")
        if affinity is not None and pinned_hostnames(v) is None and rng.random() < 0.8:
            del v["spec"]["nodeAffinity"]  # mostly volumes usable anywhere or pinned to hosts
        env.put("persistentvolumes", v)
    return env, names, claims
