"""The ResourceClaim controller, after upstream ``pkg/controller/resourceclaim``.

Two queues, ``pods`` and ``claims`` (keys ``namespace/name``):

* Pods: a claim is created from each ``resourceClaimTemplateName`` the pod
  references (generateName ``<pod>-<pod claim>-``, controller owner reference
  to the pod, annotation ``resource.kubernetes.io/pod-claim-name``) and the
  generated names are recorded in ``pod.status.resourceClaimStatuses``. A pod
  that bypassed the scheduler (``spec.nodeName`` set) is added to
  ``reservedFor`` of its allocated claims.
* Claims: reservations of deleted or finished pods are dropped; a claim with
  the scheduler's finalizer and no reservation left is deallocated and the
  finalizer removed; a claim generated for a pod that is gone or finished is
  deleted once unreserved.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

PODS = resource("pods")
CLAIMS = resource("resourceclaims")
TEMPLATES = resource("resourceclaimtemplates")

#: finalizer set by the scheduler while a claim is allocated
FINALIZER = "resource.kubernetes.io/delete-protection"
#: annotation on generated claims: the pod claim's name
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
#: pod informer index: ``namespace/claim name`` of every claim a pod uses
POD_CLAIM_INDEX = "pod-resource-claim"
#: claim informer index: UID of the controlling pod
CLAIM_OWNER_INDEX = "claim-controller-uid"
#: generated names are cut to this length before the random suffix
MAX_GENERATE_BASE = 57

__all__ = [
    "ResourceClaimController", "FINALIZER", "POD_CLAIM_NAME_ANNOTATION", "generate_claim_name_prefix",
    "pod_is_done", "resolved_claim_names",
]


def _md(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _key(obj: Obj) -> str:
    md = _md(obj)
    return f"{md.get('namespace') or 'default'}/{md.get('name') or ''}"


def pod_is_done(pod: Obj) -> bool:
    """Terminal, or deleted before it was scheduled: its claims are not needed any more."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return True
    return bool(_md(pod).get("deletionTimestamp")) and not (pod.get("spec") or {}).get("nodeName")


def resolved_claim_names(pod: Obj) -> list[str]:
    """Names of the claims a pod uses now (direct names, recorded generated names)."""
    out: list[str] = []
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
    for pc in (pod.get("spec") or {}).get("resourceClaims") or ():
        if pc.get("resourceClaimName"):
            out.append(pc["resourceClaimName"])
        elif pc.get("resourceClaimTemplateName"):
            name = (statuses.get(pc.get("name")) or {}).get("resourceClaimName")
            if name:
                out.append(name)
    return out


def generate_claim_name_prefix(pod_name: str, claim_name: str) -> str:
    """``<pod>-<claim>-``, both parts shortened proportionally when too long."""
    base = f"{pod_name}-{claim_name}"
    if len(base) > MAX_GENERATE_BASE:
        total = len(base)
        base = (pod_name[: len(pod_name) * MAX_GENERATE_BASE // total] + "-"
                + claim_name[: len(claim_name) * MAX_GENERATE_BASE // total])
    return base + "-"


def _pod_claim_index(pod: Obj) -> list[str]:
    ns = _md(pod).get("namespace") or "default"
    return [f"{ns}/{n}" for n in resolved_claim_names(pod)]


def _claim_owner_index(claim: Obj) -> list[str]:
    return [ref["uid"] for ref in _md(claim).get("ownerReferences") or ()
            if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("uid")]


def _controller_pod(claim: Obj) -> dict[str, Any] | None:
    for ref in _md(claim).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("apiVersion", "v1") == "v1":
            return ref
    return None


class ResourceClaimController(Controller):
    """Creates claims from templates, releases and cleans up claims of finished pods."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 4,
        deleted_pods_cache_size: int = 4096,
        name: str = "resource-claim-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.pod_informer = self.factory.informer_for(PODS)
        self.claim_informer = self.factory.informer_for(CLAIMS)
        self.template_informer = self.factory.informer_for(TEMPLATES)
        for inf, idx in ((self.pod_informer, {POD_CLAIM_INDEX: _pod_claim_index}),
                         (self.claim_informer, {CLAIM_OWNER_INDEX: _claim_owner_index})):
            try:
                inf.add_indexers(idx)
            except ValueError:
                pass  # another controller sharing the factory registered it
        self.pods = self.add_queue("pods", self.sync_pod)
        self.claims = self.add_queue("claims", self.sync_claim)
        self._deleted_uids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._deleted_max = deleted_pods_cache_size
        # Claims created but maybe not yet in the informer: pod uid -> {(ns, pod claim): name}.
        self._created: dict[str, dict[tuple[str, str], str]] = {}
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        self.claim_informer.add_event_handler(self._claim_changed, lambda old, new: self._claim_changed(new),
                                              self._claim_deleted)

    # ------------------------------------------------------------------ events

    def _pod_added(self, pod: Obj) -> None:
        self._enqueue_pod(pod, deleted=False)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        self._enqueue_pod(new, deleted=False)

    def _pod_deleted(self, obj: Any) -> None:
        pod = unwrap_deleted(obj)
        uid = _md(pod).get("uid")
        if uid:
            self._deleted_uids[uid] = None
            self._deleted_uids.move_to_end(uid)
            while len(self._deleted_uids) > self._deleted_max:
                self._deleted_uids.popitem(last=False)
            self._created.pop(uid, None)
        self._enqueue_pod(pod, deleted=True)

    def _enqueue_pod(self, pod: Obj, *, deleted: bool) -> None:
        claims = (pod.get("spec") or {}).get("resourceClaims")
        if not claims:
            return
        ns = _md(pod).get("namespace") or "default"
        if deleted or pod_is_done(pod):
            for name in resolved_claim_names(pod):
                self.claims.add(f"{ns}/{name}")
            # Generated claims whose name was never recorded.
            for c in self.claim_informer.indexer.by_index(CLAIM_OWNER_INDEX, _md(pod).get("uid") or ""):
                self.claims.add(_key(c))
            return
        if _md(pod).get("deletionTimestamp"):
            return
        if self._pod_needs_work(pod):
            self.pods.add(_key(pod))

    def _pod_needs_work(self, pod: Obj) -> bool:
        statuses = {s.get("name") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
        for pc in (pod.get("spec") or {}).get("resourceClaims") or ():
            if pc.get("resourceClaimTemplateName") and pc.get("name") not in statuses:
                return True
        if (pod.get("spec") or {}).get("nodeName"):
            ns = _md(pod).get("namespace") or "default"
            uid = _md(pod).get("uid")
            for name in resolved_claim_names(pod):
                claim = self.claim_informer.indexer.get_by_key(f"{ns}/{name}")
                if claim is None:
                    continue
                st = claim.get("status") or {}
                if st.get("allocation") and not any(r.get("uid") == uid for r in st.get("reservedFor") or ()):
                    return True
        return False

    def _claim_changed(self, claim: Obj) -> None:
        key = _key(claim)
        if not _md(claim).get("deletionTimestamp") or _md(claim).get("finalizers"):
            self.claims.add(key)
        for pod in self.pod_informer.indexer.by_index(POD_CLAIM_INDEX, key):
            if self._pod_needs_work(pod):
                self.pods.add(_key(pod))

    def _claim_deleted(self, obj: Any) -> None:
        claim = unwrap_deleted(obj)
        for pod in self.pod_informer.indexer.by_index(POD_CLAIM_INDEX, _key(claim)):
            self.pods.add(_key(pod))

    # ------------------------------------------------------------------ pods

    async def sync_pod(self, key: str) -> None:
        """Create missing template claims, record them, reserve claims for bound pods."""
        pod = self.pod_informer.indexer.get_by_key(key)
        if pod is None or _md(pod).get("deletionTimestamp") or pod_is_done(pod):
            return
        ns = _md(pod).get("namespace") or "default"
        uid = _md(pod).get("uid") or ""
        recorded = {s.get("name") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
        new_statuses: list[Obj] = []
        for pc in (pod.get("spec") or {}).get("resourceClaims") or ():
            pc_name = pc.get("name") or ""
            template = pc.get("resourceClaimTemplateName")
            if not template or pc_name in recorded:
                continue
            name = self._find_generated(ns, uid, pc_name)
            if name is None:
                name = await self._create_claim(pod, pc_name, template)
            new_statuses.append({"name": pc_name, "resourceClaimName": name})
        if new_statuses:
            existing = list((pod.get("status") or {}).get("resourceClaimStatuses") or ())
            pod = await self.client.patch(PODS, _md(pod).get("name") or "", {
                "metadata": {"uid": uid},
                "status": {"resourceClaimStatuses": existing + new_statuses},
            }, ns, patch_type="merge", subresource="status")
        if (pod.get("spec") or {}).get("nodeName"):
            await self._reserve_for_bound_pod(pod)

    def _find_generated(self, ns: str, pod_uid: str, pod_claim: str) -> str | None:
        """An existing claim generated for this pod claim (e.g. after a crash before the pod patch)."""
        for claim in self.claim_informer.indexer.by_index(CLAIM_OWNER_INDEX, pod_uid):
            if (_md(claim).get("namespace") == ns
                    and (_md(claim).get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) == pod_claim):
                return _md(claim).get("name")
        return self._created.get(pod_uid, {}).get((ns, pod_claim))

    async def _create_claim(self, pod: Obj, pod_claim: str, template_name: str) -> str:
        ns = _md(pod).get("namespace") or "default"
        template = self.template_informer.indexer.get_by_key(f"{ns}/{template_name}")
        if template is None:
            try:
                template = await self.client.get(TEMPLATES, template_name, ns)
            except StatusError as err:
                if err.code == 404:
                    raise RuntimeError(f"pod {ns}/{_md(pod).get('name')}: resource claim template "
                                       f"{template_name!r} not found") from None
                raise
        tspec = template.get("spec") or {}
        tmeta = tspec.get("metadata") or {}
        annotations = dict(tmeta.get("annotations") or {})
        annotations[POD_CLAIM_NAME_ANNOTATION] = pod_claim
        meta: Obj = {
            "generateName": generate_claim_name_prefix(_md(pod).get("name") or "", pod_claim),
            "namespace": ns,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": _md(pod).get("name") or "",
                                 "uid": _md(pod).get("uid") or "", "controller": True,
                                 "blockOwnerDeletion": True}],
        }
        if tmeta.get("labels"):
            meta["labels"] = dict(tmeta["labels"])
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
                 "spec": deep_copy(tspec.get("spec") or {})}
        created = await self.client.create(CLAIMS, claim, ns)
        name = _md(created).get("name") or ""
        self._created.setdefault(_md(pod).get("uid") or "", {})[(ns, pod_claim)] = name
        return name

    async def _reserve_for_bound_pod(self, pod: Obj) -> None:
        ns = _md(pod).get("namespace") or "default"
        uid = _md(pod).get("uid") or ""
        for name in resolved_claim_names(pod):
            claim = self.claim_informer.indexer.get_by_key(f"{ns}/{name}")
            if claim is None:
                continue
            st = claim.get("status") or {}
            if not st.get("allocation") or any(r.get("uid") == uid for r in st.get("reservedFor") or ()):
                continue
            # Shallow copies of the changed parts (the informer's object stays untouched).
            reserved = [*(st.get("reservedFor") or ()),
                        {"resource": "pods", "name": _md(pod).get("name") or "", "uid": uid}]
            await self.client.update(CLAIMS, {**claim, "status": {**st, "reservedFor": reserved}},
                                     subresource="status")

    # ------------------------------------------------------------------ claims

    async def _pod_gone_or_done(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the pod a reservation or owner reference names no longer needs the claim."""
        if uid in self._deleted_uids:
            return True
        pod = self.pod_informer.indexer.get_by_key(f"{namespace}/{name}")
        if pod is None:
            try:
                pod = await self.client.get(PODS, name, namespace)
            except StatusError as err:
                if err.code == 404:
                    return True
                raise
        if _md(pod).get("uid") != uid:
            return True
        return pod_is_done(pod)

    async def sync_claim(self, key: str) -> None:
        """Drop stale reservations, deallocate unused claims, delete claims of finished pods."""
        claim = self.claim_informer.indexer.get_by_key(key)
        if claim is None:
            return
        ns = _md(claim).get("namespace") or "default"
        reserved = list((claim.get("status") or {}).get("reservedFor") or ())
        valid: list[Obj] = []
        for r in reserved:
            if r.get("resource") == "pods" and not r.get("apiGroup"):
                if await self._pod_gone_or_done(ns, r.get("name") or "", r.get("uid") or ""):
                    continue
            else:
                log.warning("claim %s: reservation for unsupported resource %s/%s kept",
                            key, r.get("apiGroup"), r.get("resource"))
            valid.append(r)
        has_finalizer = FINALIZER in (_md(claim).get("finalizers") or ())
        if len(valid) != len(reserved):
            st = dict(claim.get("status") or {})
            new = {**claim, "status": st}
            if valid:
                st["reservedFor"] = valid
            else:
                st.pop("reservedFor", None)
                if has_finalizer:
                    st.pop("allocation", None)
            # Update (not patch): a concurrent change makes this fail and retry.
            claim = await self.client.update(CLAIMS, new, subresource="status")
            if has_finalizer and not (claim.get("status") or {}).get("allocation"):
                claim = await self._remove_finalizer(claim)
        elif has_finalizer and _md(claim).get("deletionTimestamp") and not valid:
            if (claim.get("status") or {}).get("allocation"):
                st = {k: v for k, v in claim["status"].items() if k != "allocation"}
                claim = await self.client.update(CLAIMS, {**claim, "status": st}, subresource="status")
            claim = await self._remove_finalizer(claim)
        if valid or _md(claim).get("deletionTimestamp"):
            return
        owner = _controller_pod(claim)
        if owner is None:
            return
        pod = self.pod_informer.indexer.get_by_key(f"{ns}/{owner.get('name')}")
        gone = owner.get("uid") in self._deleted_uids
        if pod is not None:
            gone = gone or _md(pod).get("uid") != owner.get("uid") or pod_is_done(pod)
        if not gone:
            return
        try:
            await self.client.delete(CLAIMS, _md(claim).get("name") or "", ns,
                                     preconditions={"uid": _md(claim).get("uid") or ""})
        except StatusError as err:
            if err.code not in (404, 409):
                raise

    async def _remove_finalizer(self, claim: Obj) -> Obj:
        fins = [f for f in _md(claim).get("finalizers") or () if f != FINALIZER]
        return await self.client.update(CLAIMS, {**claim, "metadata": {**_md(claim), "finalizers": fins}})
