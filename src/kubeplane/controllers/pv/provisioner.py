"""Dynamic provisioner for kubeplane's simulated local storage.

Behaves like an external (CSI) provisioner: it acts on claims the PV
controller has annotated with ``volume.kubernetes.io/storage-provisioner``
naming it, creates a PV ``pvc-<claim uid>`` pre-bound to the claim (the PV
controller completes the binding), and deletes its Released volumes whose
reclaim policy is Delete.

* WaitForFirstConsumer: provisions on the node in
  ``volume.kubernetes.io/selected-node``, pinned with a required
  ``kubernetes.io/hostname`` node affinity. A node outside the class's
  ``allowedTopologies`` makes it drop the annotation (the scheduler retries).
* Immediate: no node affinity unless the class restricts topology or limits
  capacity; then a matching node with the most remaining capacity is chosen.
* ``parameters.capacityPerNode`` (a quantity): total provisioned on one node
  for the class. A claim that does not fit waits (``ProvisioningFailed``
  event) and is retried when one of the class's volumes is deleted.
* With ``publish_capacity``, one CSIStorageCapacity per (class with a
  capacity limit, matching node) in ``kube-system`` reports what remains.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
from fractions import Fraction

from kubeplane.api.errors import StatusError
from kubeplane.api.quantity import format_quantity, parse_quantity
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.pv.binder import PVCS, PVS, STORAGE_CLASSES, WAIT_FOR_FIRST_CONSUMER, claim_key
from kubeplane.volume.matching import (
    ANN_BETA_STORAGE_PROVISIONER,
    ANN_PROVISIONED_BY,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    HOSTNAME_LABEL,
    annotations_of,
    claim_class,
    claim_request,
    hostname_affinity,
    pinned_hostnames,
    topology_matches,
    volume_capacity,
    volume_class,
)

log = logging.getLogger(__name__)

NODES = resource("nodes")
CAPACITIES = resource("csistoragecapacities")

DEFAULT_PROVISIONER = "kubeplane.io/local"
PARAM_CAPACITY_PER_NODE = "capacityPerNode"
LABEL_DRIVER = "csi.storage.k8s.io/drivername"
LABEL_MANAGED_BY = "csi.storage.k8s.io/managed-by"
MANAGED_BY = "kubeplane-provisioner"


def _name(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _labels(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def hostname_of(node: Obj) -> str:
    """The node's ``kubernetes.io/hostname`` label (its name when unlabelled)."""
    return _labels(node).get(HOSTNAME_LABEL) or _name(node)


def driver_label_value(provisioner: str) -> str:
    """The provisioner name as a label value ("/" is not allowed there)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", provisioner)[:63]
    return value.strip("-_.")


def capacity_object_name(storage_class: str, node: str) -> str:
    """Deterministic CSIStorageCapacity name for (class, node)."""
    digest = hashlib.sha256(f"{storage_class}/{node}".encode()).hexdigest()[:20]
    return f"csisc-{digest}"


class LocalProvisioner(Controller):
    """Provisions and deletes PVs for classes whose provisioner is ``provisioner_name``.

    ``reschedule_on_exhausted``: when the selected node lacks capacity, also
    remove the selected-node annotation so the scheduler picks again (what
    CSI provisioners do on ResourceExhausted); by default the claim waits.
    """

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        provisioner_name: str = DEFAULT_PROVISIONER,
        workers: int = 4,
        publish_capacity: bool = True,
        capacity_namespace: str = "kube-system",
        reschedule_on_exhausted: bool = False,
        name: str = "kubeplane-provisioner",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.provisioner_name = provisioner_name
        self.publish_capacity = publish_capacity
        self.capacity_namespace = capacity_namespace
        self.reschedule_on_exhausted = reschedule_on_exhausted
        self.pv_informer = self.factory.informer_for(PVS)
        self.pvc_informer = self.factory.informer_for(PVCS)
        self.class_informer = self.factory.informer_for(STORAGE_CLASSES)
        self.node_informer = self.factory.informer_for(NODES)
        self.capacity_informer = self.factory.informer_for(
            CAPACITIES, namespace=capacity_namespace, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}")
        self.claims = self.add_queue("claims", self.sync_claim)
        self.volumes = self.add_queue("volumes", self.sync_volume)
        self.capacity = self.add_queue("capacity", self.sync_capacity)
        # PVs created but not yet seen by the informer: name -> (class, node, size).
        self._inflight: dict[str, tuple[str, str | None, Fraction]] = {}
        # Claims waiting for capacity or a node, by storage class.
        self._waiting: dict[str, set[str]] = {}
        self.pvc_informer.add_event_handler(
            lambda c: self.claims.add(claim_key(c)), lambda o, n: self.claims.add(claim_key(n)), None)
        self.pv_informer.add_event_handler(self._volume_added, self._volume_updated, self._volume_deleted)
        self.class_informer.add_event_handler(
            self._class_changed, lambda o, n: self._class_changed(n), self._class_changed)
        self.node_informer.add_event_handler(
            self._node_changed, lambda o, n: self._node_changed(n), self._node_changed)

    # ------------------------------------------------------------- handlers

    def _is_ours(self, pv: Obj) -> bool:
        return annotations_of(pv).get(ANN_PROVISIONED_BY) == self.provisioner_name

    def _our_classes(self) -> list[str]:
        return [_name(sc) for sc in self.class_informer.indexer.list()
                if sc.get("provisioner") == self.provisioner_name]

    def _volume_added(self, pv: Obj) -> None:
        self._inflight.pop(_name(pv), None)
        if self._is_ours(pv):
            self.volumes.add(_name(pv))
            self.capacity.add(volume_class(pv))

    def _volume_updated(self, old: Obj, new: Obj) -> None:
        self._volume_added(new)

    def _volume_deleted(self, pv: Obj) -> None:
        pv = unwrap_deleted(pv)
        self._inflight.pop(_name(pv), None)
        if self._is_ours(pv):
            cls = volume_class(pv)
            self.capacity.add(cls)
            self._wake_waiting(cls)

    def _class_changed(self, sc: Obj) -> None:
        sc = unwrap_deleted(sc)
        self.capacity.add(_name(sc))
        self._wake_waiting(_name(sc))

    def _node_changed(self, node: Obj) -> None:
        for cls in self._our_classes():
            self.capacity.add(cls)
            self._wake_waiting(cls)

    def _wake_waiting(self, cls: str) -> None:
        for key in self._waiting.pop(cls, set()):
            self.claims.add(key)

    def _wait(self, cls: str, key: str) -> None:
        self._waiting.setdefault(cls, set()).add(key)

    # ------------------------------------------------------------- capacity

    @staticmethod
    def capacity_limit(sc: Obj) -> Fraction | None:
        raw = (sc.get("parameters") or {}).get(PARAM_CAPACITY_PER_NODE)
        if raw is None:
            return None
        try:
            return parse_quantity(raw)
        except ValueError:
            log.warning("storage class %s: invalid %s %r", _name(sc), PARAM_CAPACITY_PER_NODE, raw)
            return None

    def used_on_node(self, cls: str, node: str) -> Fraction:
        """Capacity of this provisioner's volumes of ``cls`` pinned to hostname ``node``."""
        total = Fraction(0)
        seen: set[str] = set()
        for pv in self.pv_informer.indexer.list():
            if not self._is_ours(pv) or volume_class(pv) != cls:
                continue
            seen.add(_name(pv))
            hosts = pinned_hostnames(pv)
            if hosts is not None and node in hosts:
                total += volume_capacity(pv)
        for pv_name, (icls, inode, size) in self._inflight.items():
            if pv_name not in seen and icls == cls and inode == node:
                total += size
        return total

    def remaining_on_node(self, sc: Obj, node: str) -> Fraction | None:
        """Remaining capacity of the class on hostname ``node`` (None: unlimited)."""
        limit = self.capacity_limit(sc)
        if limit is None:
            return None
        return max(limit - self.used_on_node(_name(sc), node), Fraction(0))

    # ---------------------------------------------------------------- claims

    async def sync_claim(self, key: str) -> None:
        claim = self.pvc_informer.indexer.get_by_key(key)
        if claim is None:
            return
        md = claim.get("metadata") or {}
        spec = claim.get("spec") or {}
        if spec.get("volumeName") or md.get("deletionTimestamp"):
            return
        cls = claim_class(claim)
        sc = self.class_informer.indexer.get_by_key(cls) if cls else None
        if sc is None or sc.get("provisioner") != self.provisioner_name:
            return
        anns = annotations_of(claim)
        if self.provisioner_name not in (anns.get(ANN_STORAGE_PROVISIONER), anns.get(ANN_BETA_STORAGE_PROVISIONER)):
            return  # the PV controller has not handed the claim to us (yet)
        pv_name = f"pvc-{md.get('uid', '')}"
        if self.pv_informer.indexer.get_by_key(pv_name) is not None or pv_name in self._inflight:
            return
        request = claim_request(claim)
        if request <= 0:
            self.recorder.event(claim, "Warning", "ProvisioningFailed",
                                      "claim has no storage request; cannot provision a volume")
            return
        limit = self.capacity_limit(sc)
        allowed = sc.get("allowedTopologies")
        host: str | None
        if sc.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER:
            node_name = anns.get(ANN_SELECTED_NODE)
            if not node_name:
                return  # waits for the scheduler
            node = self.node_informer.indexer.get_by_key(node_name)
            if node is None:
                await self._failed(claim, f'node "{node_name}" not found')
                self._wait(cls, key)
                return
            if not topology_matches(allowed, _labels(node)):
                await self._failed(claim, f'selected node "{node_name}" does not match the allowedTopologies '
                                          f'of storage class "{cls}"')
                await self._reschedule(claim)
                return
            host = hostname_of(node)
            if limit is not None:
                remaining = max(limit - self.used_on_node(cls, host), Fraction(0))
                if request > remaining:
                    await self._failed(claim, self._exhausted_message(node_name, cls, request, remaining, limit))
                    self._wait(cls, key)
                    if self.reschedule_on_exhausted:
                        await self._reschedule(claim)
                    return
        elif allowed or limit is not None:
            host = self._choose_node(sc, request)
            if host is None:
                what = "with enough free capacity " if limit is not None else ""
                await self._failed(claim, f'no node {what}matches storage class "{cls}" '
                                          f"(requested {format_quantity(request, 'BinarySI')})")
                self._wait(cls, key)
                return
        else:
            host = None
        await self._create_volume(claim, sc, pv_name, host, request)

    @staticmethod
    def _exhausted_message(node: str, cls: str, request: Fraction, remaining: Fraction, limit: Fraction) -> str:
        return (f'insufficient capacity on node "{node}" for storage class "{cls}": requested '
                f"{format_quantity(request, 'BinarySI')}, remaining {format_quantity(remaining, 'BinarySI')} "
                f"of {PARAM_CAPACITY_PER_NODE} {format_quantity(limit, 'BinarySI')}; waiting for capacity to be freed")

    def _choose_node(self, sc: Obj, request: Fraction) -> str | None:
        """Hostname of the matching node with the most remaining capacity
        (least used), ties by name."""
        cls = _name(sc)
        limit = self.capacity_limit(sc)
        best: tuple[Fraction, str] | None = None
        for node in sorted(self.node_informer.indexer.list(), key=_name):
            if not topology_matches(sc.get("allowedTopologies"), _labels(node)):
                continue
            used = self.used_on_node(cls, hostname_of(node))
            if limit is not None and limit - used < request:
                continue
            if best is None or used < best[0]:
                best = (used, hostname_of(node))
        return best[1] if best else None

    async def _failed(self, claim: Obj, message: str) -> None:
        self.recorder.event(claim, "Warning", "ProvisioningFailed", message)

    async def _reschedule(self, claim: Obj) -> None:
        """Drop selected-node so the scheduler chooses again."""
        if ANN_SELECTED_NODE not in annotations_of(claim):
            return
        new = copy.deepcopy(claim)
        new["metadata"]["annotations"].pop(ANN_SELECTED_NODE, None)
        await self.client.update(PVCS, new)

    async def _create_volume(self, claim: Obj, sc: Obj, pv_name: str, node: str | None, request: Fraction) -> None:
        md = claim.get("metadata") or {}
        spec = claim.get("spec") or {}
        requested = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
        pv_spec: Obj = {
            "capacity": {"storage": requested},
            "accessModes": list(spec.get("accessModes") or []),
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "storageClassName": _name(sc),
            "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy") or "Delete",
            "claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": md.get("namespace", ""), "name": md.get("name", ""),
                "uid": md.get("uid", ""), "resourceVersion": md.get("resourceVersion", ""),
            },
            "csi": {"driver": self.provisioner_name, "volumeHandle": pv_name,
                    "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": self.provisioner_name}},
        }
        if sc.get("mountOptions"):
            pv_spec["mountOptions"] = list(sc["mountOptions"])
        if node is not None:
            pv_spec["nodeAffinity"] = hostname_affinity(node)
        pv = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "annotations": {ANN_PROVISIONED_BY: self.provisioner_name}},
            "spec": pv_spec,
        }
        # Account for the volume before the first await, so that concurrent
        # workers see the capacity as taken.
        self._inflight[pv_name] = (_name(sc), node, request)
        self.recorder.event(claim, "Normal", "Provisioning",
                                  f'External provisioner is provisioning volume for claim "{claim_key(claim)}"')
        try:
            await self.client.create(PVS, pv)
        except StatusError as err:
            if err.code != 409:
                self._inflight.pop(pv_name, None)
                raise
        where = f' on node "{node}"' if node else ""
        self.recorder.event(claim, "Normal", "ProvisioningSucceeded",
                                  f"Successfully provisioned volume {pv_name}{where}")
        for waiting in self._waiting.values():
            waiting.discard(claim_key(claim))
        self.capacity.add(_name(sc))

    # --------------------------------------------------------------- volumes

    async def sync_volume(self, key: str) -> None:
        pv = self.pv_informer.indexer.get_by_key(key)
        if pv is None or not self._is_ours(pv):
            return
        md = pv.get("metadata") or {}
        policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy")
        if (pv.get("status") or {}).get("phase") != "Released" or policy != "Delete" or md.get("deletionTimestamp"):
            return
        try:
            await self.client.delete(PVS, key, preconditions={"uid": md.get("uid", "")})
        except StatusError as err:
            if err.code != 404:
                raise

    # ------------------------------------------------------- CSIStorageCapacity

    async def sync_capacity(self, cls: str) -> None:
        """Make this class's CSIStorageCapacity objects match the remaining capacity."""
        if not self.publish_capacity:
            return
        sc = self.class_informer.indexer.get_by_key(cls)
        desired: dict[str, Fraction] = {}
        if sc is not None and sc.get("provisioner") == self.provisioner_name:
            limit = self.capacity_limit(sc)
            if limit is not None:
                for node in self.node_informer.indexer.list():
                    if topology_matches(sc.get("allowedTopologies"), _labels(node)):
                        host = hostname_of(node)
                        desired[host] = max(limit - self.used_on_node(cls, host), Fraction(0))
        existing: dict[str, Obj] = {}
        for obj in self.capacity_informer.indexer.list():
            if obj.get("storageClassName") != cls or _labels(obj).get(LABEL_DRIVER) != driver_label_value(self.provisioner_name):
                continue
            node = ((obj.get("nodeTopology") or {}).get("matchLabels") or {}).get(HOSTNAME_LABEL)
            if node is None or node not in desired:
                await self._delete_capacity(obj)
            else:
                existing[node] = obj
        for node, remaining in desired.items():
            text = format_quantity(remaining, "BinarySI")
            cur = existing.get(node)
            if cur is None:
                await self._create_capacity(cls, node, text)
            elif cur.get("capacity") != text or cur.get("maximumVolumeSize") != text:
                new = copy.deepcopy(cur)
                new["capacity"] = text
                new["maximumVolumeSize"] = text
                await self.client.update(CAPACITIES, new)

    async def _create_capacity(self, cls: str, node: str, text: str) -> None:
        obj = {
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {
                "name": capacity_object_name(cls, node), "namespace": self.capacity_namespace,
                "labels": {LABEL_DRIVER: driver_label_value(self.provisioner_name), LABEL_MANAGED_BY: MANAGED_BY},
            },
            "storageClassName": cls,
            "nodeTopology": {"matchLabels": {HOSTNAME_LABEL: node}},
            "capacity": text,
            "maximumVolumeSize": text,
        }
        # AlreadyExists (informer lagging) raises: the sync is retried with backoff.
        await self.client.create(CAPACITIES, obj, self.capacity_namespace)

    async def _delete_capacity(self, obj: Obj) -> None:
        md = obj.get("metadata") or {}
        try:
            await self.client.delete(CAPACITIES, md.get("name", ""), md.get("namespace"))
        except StatusError as err:
            if err.code != 404:
                raise
