"""The PersistentVolume controller (binder), after upstream's
``pkg/controller/volume/persistentvolume``.

Two queues: claims (``namespace/name``) and volumes (``name``). Every write
carries the resourceVersion read from the informer, so a stale read ends in
a 409 Conflict and a requeue with backoff, never in a wrong binding.

* Claims: Immediate claims bind to the best matching PV (smallest that fits,
  pre-bound PVs first); WaitForFirstConsumer claims wait until the scheduler
  pre-binds a PV (``PV.spec.claimRef``) or selects a node (then dynamic
  provisioning is handed to the external provisioner through the
  ``storage-provisioner`` annotations); user-chosen ``spec.volumeName`` is
  validated and bound.
* Volumes: phases Available / Bound / Released / Failed; when a claim goes
  away the volume is Released and reclaimed: Retain keeps it, Delete deletes
  it (dynamically provisioned ones are left to their provisioner).

Like upstream's controller caches, objects returned by the controller's own
writes are remembered until the informer delivers them (or anything else):
a sync that reads the informer version the write replaced uses the written
one instead, so a sync right after a write neither repeats it nor fails
with a Conflict. resourceVersions are only compared for equality.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.volume.matching import (
    ANN_BETA_STORAGE_PROVISIONER,
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_PROVISIONED_BY,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    annotations_of,
    check_volume_satisfies_claim,
    claim_class,
    find_best_match_for_claim,
    is_volume_bound_to_claim,
    volume_class,
)

log = logging.getLogger(__name__)

PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
STORAGE_CLASSES = resource("storageclasses")

#: PV informer index: ``namespace/name`` of the claim in ``spec.claimRef``.
CLAIM_REF_INDEX = "pv-claimref"
#: PVC informer index: storage class of the claims whose phase is not Bound.
UNBOUND_CLAIM_CLASS_INDEX = "pvc-unbound-class"
#: PVC informer index: spec.volumeName of the claims whose phase is not Bound.
UNBOUND_CLAIM_VOLUME_INDEX = "pvc-unbound-volume"

WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"

MSG_WAIT_FIRST_CONSUMER = "waiting for first consumer to be created before binding"
MSG_NO_CLASS = "no persistent volumes available for this claim and no storage class is set"
MSG_EXTERNAL_PROVISIONING = (
    "Waiting for a volume to be created either by the external provisioner '{}' or manually by the "
    "system administrator. If volume creation is delayed, please verify that the provisioner is "
    "running and correctly registered."
)


def _md(obj: Obj) -> dict[str, Any]:
    return obj.setdefault("metadata", {})


def _name(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _uid(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("uid", "")


def _phase(obj: Obj) -> str:
    return (obj.get("status") or {}).get("phase", "")


def claim_key(claim: Obj) -> str:
    md = claim.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def claim_ref_index(pv: Obj) -> list[str]:
    ref = (pv.get("spec") or {}).get("claimRef")
    if not ref:
        return []
    return [f"{ref.get('namespace', '')}/{ref.get('name', '')}"]


def unbound_claim_class_index(claim: Obj) -> list[str]:
    """Index value of a claim not in phase Bound: its storage class."""
    return [] if _phase(claim) == "Bound" else [claim_class(claim)]


def unbound_claim_volume_index(claim: Obj) -> list[str]:
    """Index value of a claim not in phase Bound that names a volume: the volume's name."""
    volume = (claim.get("spec") or {}).get("volumeName")
    return [volume] if volume and isinstance(volume, str) and _phase(claim) != "Bound" else []


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def claim_reference(claim: Obj) -> Obj:
    """``spec.claimRef`` pointing at ``claim`` (with uid and resourceVersion)."""
    md = claim.get("metadata") or {}
    return {
        "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": md.get("namespace", ""), "name": md.get("name", ""),
        "uid": md.get("uid", ""), "resourceVersion": md.get("resourceVersion", ""),
    }


class PersistentVolumeController(Controller):
    """Binds claims to volumes and reclaims released volumes.

    ``delete_unprovisioned_volumes``: a Released PV with policy Delete that no
    provisioner created is deleted by this controller (kubeplane's simulated
    storage has no backend to clean up). When False it is marked Failed with
    a ``VolumeFailedDelete`` event, as upstream does without a deleter plugin.
    """

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 4,
        resync_period: float = 15.0,
        delete_unprovisioned_volumes: bool = True,
        name: str = "persistentvolume-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.resync_period = resync_period
        self.delete_unprovisioned_volumes = delete_unprovisioned_volumes
        self.pv_informer = self.factory.informer_for(PVS)
        self.pvc_informer = self.factory.informer_for(PVCS)
        self.class_informer = self.factory.informer_for(STORAGE_CLASSES)
        for informer, name, fn in ((self.pv_informer, CLAIM_REF_INDEX, claim_ref_index),
                                   (self.pvc_informer, UNBOUND_CLAIM_CLASS_INDEX, unbound_claim_class_index),
                                   (self.pvc_informer, UNBOUND_CLAIM_VOLUME_INDEX, unbound_claim_volume_index)):
            try:
                informer.add_indexers({name: fn})
            except ValueError:
                pass
        # (resource, key) -> (informer resourceVersions our writes replaced, last object written)
        self._written: dict[tuple[str, str], tuple[set[str], Obj]] = {}
        self.claims = self.add_queue("claims", self.sync_claim)
        self.volumes = self.add_queue("volumes", self.sync_volume)
        self.pvc_informer.add_event_handler(self._claim_added, self._claim_updated, self._claim_deleted)
        self.pv_informer.add_event_handler(self._volume_added, self._volume_updated, self._volume_deleted)
        self.class_informer.add_event_handler(self._class_changed, lambda old, new: self._class_changed(new))
        self._resync_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        await super().start(sync_timeout)
        if self.resync_period > 0 and self._resync_task is None:
            self._resync_task = asyncio.get_running_loop().create_task(self._resync_loop())

    async def stop(self, timeout: float = 5.0) -> None:
        task, self._resync_task = self._resync_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await super().stop(timeout)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync_period)
            for key in self.pvc_informer.indexer.list_keys():
                self.claims.add(key)
            for key in self.pv_informer.indexer.list_keys():
                self.volumes.add(key)

    # ------------------------------------------------------- own writes

    def _fresh(self, res: str, key: str, obj: Obj | None) -> Obj | None:
        """``obj`` (the informer's), or what we wrote over it while the informer lags."""
        if obj is None:
            return None
        entry = self._written.get((res, key))
        if entry is None:
            return obj
        if _rv(obj) in entry[0]:
            return entry[1]
        del self._written[(res, key)]
        return obj

    def _claim(self, key: str) -> Obj | None:
        return self._fresh("pvc", key, self.pvc_informer.indexer.get_by_key(key))

    def _volume(self, name: str) -> Obj | None:
        return self._fresh("pv", name, self.pv_informer.indexer.get_by_key(name))

    def _forget_stale(self, res: str, key: str, obj: Obj | None) -> None:
        """Drop the write record once the informer holds something else (bounded memory)."""
        entry = self._written.get((res, key))
        if entry is not None and (obj is None or _rv(obj) not in entry[0]):
            del self._written[(res, key)]

    async def _update(self, res: str, base: Obj, new: Obj, subresource: str | None = None) -> Obj:
        """Write ``new`` (a modified copy of ``base``) and remember the result."""
        out = await self.client.update(PVS if res == "pv" else PVCS, new, subresource=subresource)
        key = _name(out) if res == "pv" else claim_key(out)
        entry = self._written.get((res, key))
        base_rv = _rv(base)
        stale = {base_rv}
        if entry is not None and _rv(entry[1]) == base_rv:
            stale |= entry[0]
        self._written[(res, key)] = (stale, out)
        return out

    # ------------------------------------------------------------- handlers

    def _claim_added(self, claim: Obj) -> None:
        self._forget_stale("pvc", claim_key(claim), claim)
        self.claims.add(claim_key(claim))

    def _claim_updated(self, old: Obj, new: Obj) -> None:
        self._forget_stale("pvc", claim_key(new), new)
        self.claims.add(claim_key(new))

    def _claim_deleted(self, claim: Obj) -> None:
        claim = unwrap_deleted(claim)
        key = claim_key(claim)
        self._written.pop(("pvc", key), None)
        vol = (claim.get("spec") or {}).get("volumeName")
        if vol:
            self.volumes.add(vol)
        for pv_key in self.pv_informer.indexer.index_keys(CLAIM_REF_INDEX, key):
            self.volumes.add(pv_key)

    def _volume_added(self, pv: Obj) -> None:
        self._forget_stale("pv", _name(pv), pv)
        self.volumes.add(_name(pv))
        self._wake_claims_for(pv)

    def _volume_updated(self, old: Obj, new: Obj) -> None:
        self._forget_stale("pv", _name(new), new)
        self.volumes.add(_name(new))
        self._wake_claims_for(new)

    def _volume_deleted(self, pv: Obj) -> None:
        pv = unwrap_deleted(pv)
        self._written.pop(("pv", _name(pv)), None)
        ref = (pv.get("spec") or {}).get("claimRef")
        if ref:
            self.claims.add(f"{ref.get('namespace', '')}/{ref.get('name', '')}")

    def _wake_claims_for(self, pv: Obj) -> None:
        """An unclaimed or pre-bound PV may satisfy waiting claims now.

        Claims of a WaitForFirstConsumer class only bind to PVs whose claimRef
        names them (the branch above) or that they name in ``spec.volumeName``;
        other unbound claims of the PV's class are woken to look for a match."""
        ref = (pv.get("spec") or {}).get("claimRef")
        if ref:
            self.claims.add(f"{ref.get('namespace', '')}/{ref.get('name', '')}")
            return
        if _phase(pv) not in ("Available", "Pending", ""):
            return
        cls = volume_class(pv)
        indexer = self.pvc_informer.indexer
        sc = self._storage_class(cls)
        if sc is not None and sc.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER:
            # looked up by name: many claims of the class may be waiting
            for key in indexer.index_keys(UNBOUND_CLAIM_VOLUME_INDEX, _name(pv)):
                claim = indexer.get_by_key(key)
                if claim is not None and claim_class(claim) == cls:
                    self.claims.add(key)
            return
        for key in indexer.index_keys(UNBOUND_CLAIM_CLASS_INDEX, cls):
            self.claims.add(key)

    def _class_changed(self, sc: Obj) -> None:
        cls = _name(sc)
        for claim in self.pvc_informer.indexer.list():
            if _phase(claim) != "Bound" and claim_class(claim) == cls:
                self.claims.add(claim_key(claim))

    # ---------------------------------------------------------------- claims

    async def sync_claim(self, key: str) -> None:
        claim = self._claim(key)
        if claim is None:
            return
        if ANN_BIND_COMPLETED not in annotations_of(claim):
            await self._sync_unbound_claim(claim)
        else:
            await self._sync_bound_claim(claim)

    def _storage_class(self, name: str) -> Obj | None:
        return self.class_informer.indexer.get_by_key(name) if name else None

    def is_delay_binding_mode(self, claim: Obj) -> bool:
        sc = self._storage_class(claim_class(claim))
        return sc is not None and sc.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER

    async def _sync_unbound_claim(self, claim: Obj) -> None:
        volume_name = (claim.get("spec") or {}).get("volumeName") or ""
        if not volume_name:
            delay = self.is_delay_binding_mode(claim)
            pv = find_best_match_for_claim(claim, self._candidate_volumes(claim, delay), delay)
            if pv is not None:
                await self._bind(pv, claim)
                return
            if delay and ANN_SELECTED_NODE not in annotations_of(claim):
                self.recorder.event(claim, "Normal", "WaitForFirstConsumer", MSG_WAIT_FIRST_CONSUMER)
            elif claim_class(claim):
                await self._provision_claim(claim)
                return
            else:
                self.recorder.event(claim, "Normal", "FailedBinding", MSG_NO_CLASS)
            await self._set_claim_phase(claim, "Pending")
            return
        pv = self._volume(volume_name)
        if pv is None:
            await self._set_claim_phase(claim, "Pending")
            return
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref:
            reason = check_volume_satisfies_claim(pv, claim)
            if reason is not None:
                self.recorder.event(
                    claim, "Warning", "VolumeMismatch",
                    f"Cannot bind to requested volume {volume_name!r}: {reason}")
                await self._set_claim_phase(claim, "Pending")
                return
            await self._bind(pv, claim)
        elif is_volume_bound_to_claim(pv, claim):
            await self._bind(pv, claim)
        elif ANN_BOUND_BY_CONTROLLER in annotations_of(claim):
            raise RuntimeError(
                f"invalid binding of claim {claim_key(claim)!r} to volume {volume_name!r}: "
                f"volume already claimed by {ref.get('namespace')}/{ref.get('name')}")
        else:
            # The user asked for a volume claimed by someone else: wait.
            await self._set_claim_phase(claim, "Pending")

    def _candidate_volumes(self, claim: Obj, delay: bool) -> list[Obj]:
        """The PVs ``find_best_match_for_claim`` needs to see, in informer order.

        A delayed claim only matches PVs whose claimRef names it (the claimRef
        index); when more than one does, the full list keeps their order."""
        if delay:
            names = self.pv_informer.indexer.index_keys(CLAIM_REF_INDEX, claim_key(claim))
            if len(names) <= 1:
                out = []
                for name in names:
                    pv = self._volume(name)
                    if pv is not None:
                        out.append(pv)
                return out
        return [self._fresh("pv", _name(pv), pv) or pv for pv in self.pv_informer.indexer.list()]

    async def _sync_bound_claim(self, claim: Obj) -> None:
        volume_name = (claim.get("spec") or {}).get("volumeName") or ""
        if not volume_name:
            await self._claim_lost(claim, "ClaimLost",
                                   "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
            return
        pv = self._volume(volume_name)
        if pv is None:
            await self._claim_lost(claim, "ClaimLost",
                                   "Bound claim has lost its PersistentVolume. Data on the volume is lost!")
            return
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref or ref.get("uid") == _uid(claim):
            await self._bind(pv, claim)
            return
        await self._claim_lost(claim, "ClaimMisbound",
                               "Two claims are bound to the same volume, this one is bound incorrectly")

    async def _claim_lost(self, claim: Obj, reason: str, message: str) -> None:
        if _phase(claim) != "Lost":
            self.recorder.event(claim, "Warning", reason, message)
            await self._set_claim_phase(claim, "Lost")

    async def _provision_claim(self, claim: Obj) -> None:
        cls = claim_class(claim)
        sc = self._storage_class(cls)
        if sc is None:
            self.recorder.event(claim, "Warning", "ProvisioningFailed",
                                      f'storageclass.storage.k8s.io "{cls}" not found')
            await self._set_claim_phase(claim, "Pending")
            return
        provisioner = sc.get("provisioner", "")
        ann = annotations_of(claim)
        if ann.get(ANN_STORAGE_PROVISIONER) != provisioner or ann.get(ANN_BETA_STORAGE_PROVISIONER) != provisioner:
            new = deep_copy(claim)
            anns = _md(new).setdefault("annotations", {})
            anns[ANN_STORAGE_PROVISIONER] = provisioner
            anns[ANN_BETA_STORAGE_PROVISIONER] = provisioner
            claim = await self._update("pvc", claim, new)
        self.recorder.event(claim, "Normal", "ExternalProvisioning",
                                  MSG_EXTERNAL_PROVISIONING.format(provisioner))

    # ----------------------------------------------------------------- bind

    async def _bind(self, pv: Obj, claim: Obj) -> None:
        """PV claimRef, PV phase Bound, PVC volumeName + annotations, PVC phase Bound.
        Stops at the first error; the next sync resumes where it left off."""
        pv = await self._bind_volume_to_claim(pv, claim)
        pv = await self._set_volume_phase(pv, "Bound")
        claim = await self._bind_claim_to_volume(claim, pv)
        await self._set_claim_bound_status(claim, pv)

    async def _bind_volume_to_claim(self, pv: Obj, claim: Obj) -> Obj:
        set_by_controller = not is_volume_bound_to_claim(pv, claim)
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        md = claim.get("metadata") or {}
        new = None
        if (ref.get("name") != md.get("name") or ref.get("namespace") != md.get("namespace")
                or ref.get("uid") != md.get("uid")):
            new = deep_copy(pv)
            new.setdefault("spec", {})["claimRef"] = claim_reference(claim)
        if set_by_controller and ANN_BOUND_BY_CONTROLLER not in annotations_of(pv):
            new = new or deep_copy(pv)
            _md(new).setdefault("annotations", {})[ANN_BOUND_BY_CONTROLLER] = "yes"
        if new is None:
            return pv
        return await self._update("pv", pv, new)

    async def _set_volume_phase(self, pv: Obj, phase: str, message: str | None = None) -> Obj:
        status = pv.get("status") or {}
        if status.get("phase") == phase and (message is None or status.get("message") == message):
            return pv
        new = deep_copy(pv)
        st = new.setdefault("status", {})
        st["phase"] = phase
        if message is None:
            st.pop("message", None)
        else:
            st["message"] = message
        return await self._update("pv", pv, new, subresource="status")

    async def _bind_claim_to_volume(self, claim: Obj, pv: Obj) -> Obj:
        new = deep_copy(claim)
        changed = False
        spec = new.setdefault("spec", {})
        anns = _md(new).setdefault("annotations", {})
        if spec.get("volumeName") != _name(pv):
            spec["volumeName"] = _name(pv)
            changed = True
            if ANN_BOUND_BY_CONTROLLER not in anns:
                anns[ANN_BOUND_BY_CONTROLLER] = "yes"
        if ANN_BIND_COMPLETED not in anns:
            anns[ANN_BIND_COMPLETED] = "yes"
            changed = True
        if not changed:
            return claim
        return await self._update("pvc", claim, new)

    async def _set_claim_bound_status(self, claim: Obj, pv: Obj) -> Obj:
        pv_spec = pv.get("spec") or {}
        status = claim.get("status") or {}
        want_modes = list(pv_spec.get("accessModes") or [])
        want_cap = dict(pv_spec.get("capacity") or {})
        if (status.get("phase") == "Bound" and status.get("accessModes") == want_modes
                and status.get("capacity") == want_cap):
            return claim
        new = deep_copy(claim)
        st = new.setdefault("status", {})
        st.update({"phase": "Bound", "accessModes": want_modes, "capacity": want_cap})
        return await self._update("pvc", claim, new, subresource="status")

    async def _set_claim_phase(self, claim: Obj, phase: str) -> Obj:
        if _phase(claim) == phase:
            return claim
        new = deep_copy(claim)
        new.setdefault("status", {})["phase"] = phase
        return await self._update("pvc", claim, new, subresource="status")

    # --------------------------------------------------------------- volumes

    async def sync_volume(self, key: str) -> None:
        pv = self._volume(key)
        if pv is None:
            return
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref or not ref.get("uid"):
            # Unclaimed, or pre-bound by a user to a claim that will bind it.
            await self._set_volume_phase(pv, "Available")
            return
        ckey = f"{ref.get('namespace', '')}/{ref.get('name', '')}"
        claim = await self._find_claim(ckey, ref.get("uid", ""))
        if claim is None:
            if _phase(pv) not in ("Released", "Failed"):
                pv = await self._set_volume_phase(pv, "Released")
            await self._reclaim(pv)
            return
        volume_name = (claim.get("spec") or {}).get("volumeName") or ""
        if not volume_name:
            # Pre-bound by the scheduler, a user or a provisioner: the claim sync completes it.
            self.claims.add(ckey)
            return
        if volume_name == _name(pv):
            await self._set_volume_phase(pv, "Bound")
            if ANN_BIND_COMPLETED not in annotations_of(claim):
                self.claims.add(ckey)
            return
        # The claim is bound to another volume.
        anns = annotations_of(pv)
        policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or "Retain"
        if ANN_PROVISIONED_BY in anns and policy == "Delete":
            if _phase(pv) not in ("Released", "Failed"):
                pv = await self._set_volume_phase(pv, "Released")
            await self._reclaim(pv)
        elif ANN_BOUND_BY_CONTROLLER in anns:
            await self._unbind_volume(pv, clear_ref=True)
        else:
            await self._unbind_volume(pv, clear_ref=False)

    async def _find_claim(self, key: str, uid: str) -> Obj | None:
        """The claim with this uid from the informer, double-checked with the API."""
        claim = self._claim(key)
        if claim is not None and _uid(claim) == uid:
            return claim
        ns, _, name = key.partition("/")
        try:
            claim = await self.client.get(PVCS, name, ns)
        except StatusError as err:
            if err.code == 404:
                return None
            raise
        return claim if _uid(claim) == uid else None

    async def _unbind_volume(self, pv: Obj, clear_ref: bool) -> None:
        new = deep_copy(pv)
        spec = new.setdefault("spec", {})
        if clear_ref:
            spec.pop("claimRef", None)
            (_md(new).get("annotations") or {}).pop(ANN_BOUND_BY_CONTROLLER, None)
        else:
            spec["claimRef"] = {k: v for k, v in (spec.get("claimRef") or {}).items() if k != "uid"}
        pv = await self._update("pv", pv, new)
        await self._set_volume_phase(pv, "Available")

    async def _reclaim(self, pv: Obj) -> None:
        policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or "Retain"
        if policy == "Retain":
            return
        if policy == "Delete":
            if (pv.get("metadata") or {}).get("deletionTimestamp"):
                return
            if ANN_PROVISIONED_BY in annotations_of(pv):
                return  # its provisioner deletes it
            if not self.delete_unprovisioned_volumes:
                if _phase(pv) != "Failed":
                    self.recorder.event(pv, "Warning", "VolumeFailedDelete",
                                              "error getting deleter volume plugin for volume: no deletable volume plugin matched")
                    await self._set_volume_phase(pv, "Failed", "no deletable volume plugin matched")
                return
            try:
                await self.client.delete(PVS, _name(pv), preconditions={"uid": _uid(pv)})
            except StatusError as err:
                if err.code != 404:
                    raise
            return
        if policy == "Recycle":
            if _phase(pv) != "Failed":
                self.recorder.event(pv, "Warning", "VolumeFailedRecycle",
                                          "no volume plugin matched to recycle the volume")
                await self._set_volume_phase(pv, "Failed", "no volume plugin matched to recycle the volume")
            return
        if _phase(pv) != "Failed":
            self.recorder.event(pv, "Warning", "VolumeUnknownReclaimPolicy",
                                      "Volume has unrecognized PersistentVolumeReclaimPolicy")
            await self._set_volume_phase(pv, "Failed", "Volume has unrecognized PersistentVolumeReclaimPolicy")
