"""The CSR approving controller (upstream's pkg/controller/certificates/approver).

It approves kubelet client certificate requests automatically, as
kube-controller-manager's ``csrapproving`` does, when their requester may:

* ``selfnodeclient``: a node renewing its own certificate (the requester is
  the certificate's ``CN``), allowed ``create`` of
  ``certificatesigningrequests/selfnodeclient``;
* ``nodeclient``: anyone allowed ``create`` of
  ``certificatesigningrequests/nodeclient`` (bootstrap tokens, through the
  bootstrap policy's ``kubeplane:node-autoapprove-bootstrap`` binding).

A request qualifies when it is for ``kubernetes.io/kube-apiserver-client-kubelet``
with a kubelet client subject (``O=system:nodes``, ``CN=system:node:<name>``,
no SANs, the client usages). The permission is asked of the API server with a
SubjectAccessReview for the requester (the CSR's username, groups, uid and
extra); on yes the Approved condition (reason ``AutoApproved``) is set
through the approval subresource and the signer does the rest. Nothing is
ever denied: a request it cannot approve is left for a person.
"""

from __future__ import annotations

import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import now_text
from kubeplane.api.resources import resource
from kubeplane.api.validation.certificates import APPROVED, DENIED, decode_bytes, parse_csr
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.csrsigning import (KUBE_APISERVER_CLIENT_KUBELET, SignerRefused, check_kubelet_client,
                                              has_true_condition)

log = logging.getLogger(__name__)

CSRS = resource("certificatesigningrequests")
SUBJECT_ACCESS_REVIEWS = resource("subjectaccessreviews")

#: (subresource asked for, message), in upstream's order: the self renewal first
RECOGNIZERS = (
    ("selfnodeclient", "Auto approving self kubelet client certificate after SubjectAccessReview."),
    ("nodeclient", "Auto approving kubelet client certificate after SubjectAccessReview."),
)


def is_node_client(csr: Obj, req: Any) -> bool:
    spec = csr.get("spec") or {}
    if spec.get("signerName") != KUBE_APISERVER_CLIENT_KUBELET:
        return False
    try:
        check_kubelet_client(req, [u for u in spec.get("usages") or [] if isinstance(u, str)])
    except SignerRefused:
        return False
    return True


def is_self_node_client(csr: Obj, req: Any) -> bool:
    from cryptography.x509.oid import NameOID

    cns = req.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if (csr.get("spec") or {}).get("username") != (cns[0].value if cns else ""):
        return False
    return is_node_client(csr, req)


class CSRApprovingController(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None,
                 name: str = "csrapproving-controller") -> None:
        super().__init__(name, client, factory)
        self.csrs = self.factory.informer_for(CSRS)
        self.work = self.add_queue("csr", self.sync)
        self.csrs.add_event_handler(self._enqueue, lambda _old, new: self._enqueue(new), None)

    def _enqueue(self, csr: Obj) -> None:
        if self._pending(csr):
            self.work.add((csr.get("metadata") or {}).get("name", ""))

    @staticmethod
    def _pending(csr: Obj) -> bool:
        status = csr.get("status") or {}
        return (not status.get("certificate") and not has_true_condition(csr, APPROVED) and not has_true_condition(csr, DENIED)
                and (csr.get("spec") or {}).get("signerName") == KUBE_APISERVER_CLIENT_KUBELET)

    async def sync(self, name: str) -> None:
        csr = self.csrs.indexer.get_by_key(name)
        if csr is None or not self._pending(csr):
            return
        spec = csr.get("spec") or {}
        try:
            req = parse_csr(decode_bytes(spec.get("request")) or b"")
        except ValueError as err:
            log.info('unable to parse csr "%s": %s', name, err)
            return  # nothing to retry: the request never changes
        tried = []
        for subresource, message in RECOGNIZERS:
            recognized = is_self_node_client(csr, req) if subresource == "selfnodeclient" else \
                is_node_client(csr, req)
            if not recognized:
                continue
            tried.append(subresource)
            if await self._allowed(spec, subresource):
                await self._approve(csr, message)
                log.info("approved CertificateSigningRequest %s (%s)", name, subresource)
                return
        if tried:
            log.info('recognized csr "%s" as %s but subject access review was not approved', name,
                     "[" + " ".join(tried) + "]")

    async def _allowed(self, spec: Obj, subresource: str) -> bool:
        review: Obj = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": spec.get("username") or "", "groups": list(spec.get("groups") or []),
                     "resourceAttributes": {"group": "certificates.k8s.io", "resource": "certificatesigningrequests",
                                            "verb": "create", "subresource": subresource, "version": "*"}}}
        if spec.get("uid"):
            review["spec"]["uid"] = spec["uid"]
        if spec.get("extra"):
            review["spec"]["extra"] = spec["extra"]
        out = await self.client.create(SUBJECT_ACCESS_REVIEWS, review)
        return bool((out.get("status") or {}).get("allowed"))

    async def _approve(self, csr: Obj, message: str) -> None:
        now = now_text()
        status = dict(csr.get("status") or {})
        status["conditions"] = [*(status.get("conditions") or []), {
            "type": APPROVED, "status": "True", "reason": "AutoApproved", "message": message,
            "lastUpdateTime": now, "lastTransitionTime": now}]
        try:
            await self.client.update(CSRS, {**csr, "status": status}, subresource="approval")
        except StatusError as err:
            if err.code != 404:
                raise  # a conflict: retried with the newer object
