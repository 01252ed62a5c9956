"""The NodeRestriction admission plugin (upstream's plugin/pkg/admission/noderestriction).

The Node authorizer lets a kubelet write kinds whose target it cannot know
from the URL alone (a create names no object; a pod's node is in its body);
this plugin, with the objects in hand, holds a node (``system:node:<name>``
in ``system:nodes``) to its own:

* pods: create only mirror pods bound to itself and owned by its Node;
  delete, evict and update the status only of pods bound to it (labels and
  resource claim statuses untouched);
* its own Node only, with no labels outside the kubelet's set (no
  ``node-restriction.kubernetes.io/`` labels, no other ``kubernetes.io`` /
  ``k8s.io`` labels), and no change to its taints, ownerReferences or
  configSource;
* PVC status: only ``status.allocatedResources``-free changes of conditions
  and capacity (upstream: the fields a volume expansion reports);
* TokenRequests only bound to a pod (with uid) that runs on it;
* its own Lease in ``kube-node-lease``, its own CSINode, ResourceSlices of
  its own, and kubelet CSRs only for ``CN=system:node:<itself>``.

Refusals are 403 Forbidden worded as upstream's.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.auth.node import NODE_LEASE_NAMESPACE, node_identity
from kubeplane.registry.admission import CREATE, DELETE, UPDATE, AdmissionPlugin, Attributes
from kubeplane.storage.interface import Store

Obj = dict[str, Any]

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
NODE_RESTRICTION_LABEL_NAMESPACE = "node-restriction.kubernetes.io"
#: the labels a kubelet may set on its Node (upstream's kubeletapis.IsKubeletLabel)
KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "kubernetes.io/os",
    "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch",
})
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
#: labels upstream lets a kubelet set at registration only (OpenShift's)
_OPENSHIFT_CREATE_LABELS = frozenset({"node-role.kubernetes.io/master", "node-role.kubernetes.io/worker"})

_KEYS = {
    ("", "pods"), ("", "nodes"), ("", "persistentvolumeclaims"), ("", "serviceaccounts"),
    ("coordination.k8s.io", "leases"), ("storage.k8s.io", "csinodes"), ("resource.k8s.io", "resourceslices"),
    ("certificates.k8s.io", "certificatesigningrequests"),
}
_KUBELET_SIGNERS = ("kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet")


def _label_namespace(key: str) -> str:
    prefix, sep, _ = key.partition("/")
    return prefix if sep else ""


def _is_kubernetes_label(key: str) -> bool:
    ns = _label_namespace(key)
    return ns in ("kubernetes.io", "k8s.io") or ns.endswith(".kubernetes.io") or ns.endswith(".k8s.io")


def is_kubelet_label(key: str) -> bool:
    if key in KUBELET_LABELS:
        return True
    ns = _label_namespace(key)
    return any(ns == allowed or ns.endswith("." + allowed) for allowed in KUBELET_LABEL_NAMESPACES)


def forbidden_labels(modified: set[str], operation: str) -> list[str]:
    out = set()
    for label in modified:
        ns = _label_namespace(label)
        if ns == NODE_RESTRICTION_LABEL_NAMESPACE or ns.endswith("." + NODE_RESTRICTION_LABEL_NAMESPACE):
            out.add(label)
        if _is_kubernetes_label(label) and not is_kubelet_label(label):
            if operation == CREATE and label in _OPENSHIFT_CREATE_LABELS:
                continue
            out.add(label)
    return sorted(out)


def _labels(obj: Obj | None) -> dict:
    md = (obj or {}).get("metadata")
    labels = md.get("labels") if isinstance(md, dict) else None
    return labels if isinstance(labels, dict) else {}


def _modified_labels(new: dict, old: dict) -> set[str]:
    return {k for k in set(new) | set(old) if k not in new or k not in old or new[k] != old[k]}


def _spec(obj: Obj | None) -> Obj:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def _meta(obj: Obj | None) -> Obj:
    md = (obj or {}).get("metadata")
    return md if isinstance(md, dict) else {}


def pod_api_reference(pod: Obj) -> str | None:
    """The first API object a (mirror) pod refers to, as upstream's
    HasAPIObjectReference names it; None when it refers to none."""
    spec = _spec(pod)
    if spec.get("serviceAccountName"):
        return "serviceaccounts"
    for vol in spec.get("volumes") or []:
        if not isinstance(vol, dict):
            continue
        for field, what in (("secret", "secrets"), ("configMap", "configmaps"),
                            ("persistentVolumeClaim", "persistentvolumeclaims"), ("ephemeral", "ephemeral"),
                            ("csi", "csidrivers"), ("glusterfs", "endpoints")):
            if field in vol:
                return what
        for src in (vol.get("projected") or {}).get("sources") or [] if isinstance(vol.get("projected"), dict) else []:
            if isinstance(src, dict):
                for field, what in (("secret", "secrets"), ("configMap", "configmaps"),
                                    ("serviceAccountToken", "serviceaccounts"),
                                    ("clusterTrustBundle", "clustertrustbundles"),
                                    ("podCertificate", "podcertificates")):
                    if field in src:
                        return what
    if spec.get("imagePullSecrets"):
        return "secrets"
    if spec.get("resourceClaims"):
        return "resourceclaims"
    for group in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(group) or []:
            if not isinstance(c, dict):
                continue
            for env in c.get("envFrom") or []:
                if isinstance(env, dict):
                    if "secretRef" in env:
                        return "secrets"
                    if "configMapRef" in env:
                        return "configmaps"
            for env in c.get("env") or []:
                vf = env.get("valueFrom") if isinstance(env, dict) else None
                if isinstance(vf, dict):
                    if "secretKeyRef" in vf:
                        return "secrets"
                    if "configMapKeyRef" in vf:
                        return "configmaps"
    return None


class NodeRestriction(AdmissionPlugin):
    name = "NodeRestriction"

    def __init__(self, store: Store) -> None:
        self.store = store

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return res.key in _KEYS

    @staticmethod
    def _forbidden(attrs: Attributes, message: str) -> errors.StatusError:
        """Upstream's admission.NewForbidden: names the object (or "Unknown")."""
        name = attrs.name or _meta(attrs.obj).get("name") or _meta(attrs.obj).get("generateName") or "Unknown"
        res = attrs.resource
        return errors.StatusError(403, "Forbidden", f'{res.qualified} "{name}" is forbidden: {message}',
                                  name=name, group=res.group, kind=res.plural)

    async def _stored(self, plural: str, name: str, namespace: str | None) -> Obj | None:
        res = resource(plural)
        kv = await self.store.get(res.storage_key(name, namespace) if res.namespaced else res.storage_key(name))
        return kv.value if kv is not None else None

    async def admit(self, attrs: Attributes) -> None:
        node, is_node = node_identity(attrs.user)
        if not is_node:
            return
        if not node:
            raise self._forbidden(attrs, f'could not determine node from user "{attrs.user.name}"')
        plural = attrs.resource.plural
        if plural == "pods":
            await self._pod(node, attrs)
        elif plural == "nodes":
            self._node(node, attrs)
        elif plural == "persistentvolumeclaims":
            self._pvc(node, attrs)
        elif plural == "serviceaccounts":
            await self._service_account(node, attrs)
        elif plural == "leases":
            self._lease(node, attrs)
        elif plural == "csinodes":
            self._csinode(node, attrs)
        elif plural == "resourceslices":
            self._slice(node, attrs)
        elif plural == "certificatesigningrequests":
            self._csr(node, attrs)

    # -- pods ------------------------------------------------------------------

    async def _pod(self, node: str, attrs: Attributes) -> None:
        sub, op = attrs.subresource, attrs.operation
        if sub == "":
            if op == CREATE:
                self._mirror_pod(node, attrs)
            elif op == DELETE:
                name = attrs.name or _meta(attrs.old_obj).get("name") or ""
                pod = attrs.old_obj or await self._stored("pods", name, attrs.namespace)
                if pod is None:
                    raise errors.not_found("pods", name)
                if _spec(pod).get("nodeName") != node:
                    raise self._forbidden(attrs, f'node "{node}" can only delete pods with spec.nodeName set to '
                                                 'itself')
            else:
                raise self._forbidden(attrs, f'unexpected operation "{op}", node "{node}" can only create and '
                                             'delete mirror pods')
        elif sub == "status":
            if op != UPDATE:
                raise self._forbidden(attrs, f'unexpected operation "{op}"')
            old = attrs.old_obj or {}
            if _spec(old).get("nodeName") != node:
                raise self._forbidden(attrs, f'node "{node}" can only update pod status for pods with '
                                             'spec.nodeName set to itself')
            if _labels(old) != _labels(attrs.obj):
                raise self._forbidden(attrs, f'node "{node}" cannot update labels through pod status')
            old_claims = (old.get("status") or {}).get("resourceClaimStatuses")
            new_claims = ((attrs.obj or {}).get("status") or {}).get("resourceClaimStatuses")
            if (old_claims or None) != (new_claims or None):
                raise self._forbidden(attrs, f'node "{node}" cannot update resource claim statues')
        elif sub == "eviction":
            if op != CREATE:
                raise self._forbidden(attrs, f"unexpected operation {op}")
            name = attrs.name or _meta(attrs.obj).get("name")
            if not name:
                raise self._forbidden(attrs, "could not determine pod from request data")
            pod = await self._stored("pods", name, attrs.namespace)
            if pod is None:
                raise errors.not_found("pods", name)
            if _spec(pod).get("nodeName") != node:
                raise self._forbidden(attrs, f"node {node} can only evict pods with spec.nodeName set to itself")
        else:
            raise self._forbidden(attrs, f'unexpected pod subresource "{sub}", only \'status\' and \'eviction\' '
                                         'are allowed')

    def _mirror_pod(self, node: str, attrs: Attributes) -> None:
        pod = attrs.obj or {}
        md = _meta(pod)
        if MIRROR_POD_ANNOTATION not in (md.get("annotations") or {}):
            raise self._forbidden(attrs, f'pod does not have "{MIRROR_POD_ANNOTATION}" annotation, node "{node}" '
                                         'can only create mirror pods')
        if _spec(pod).get("nodeName") != node:
            raise self._forbidden(attrs, f'node "{node}" can only create pods with spec.nodeName set to itself')
        owners = md.get("ownerReferences") or []
        if len(owners) > 1:
            raise self._forbidden(attrs, f'node "{node}" can only create pods with a single owner reference set '
                                         'to itself')
        if not owners:
            raise self._forbidden(attrs, f'node "{node}" can only create pods with an owner reference set to '
                                         'itself')
        owner = owners[0] if isinstance(owners[0], dict) else {}
        if owner.get("apiVersion") != "v1" or owner.get("kind") != "Node" or owner.get("name") != node:
            raise self._forbidden(attrs, f'node "{node}" can only create pods with an owner reference set to '
                                         'itself')
        if owner.get("controller") is not True:
            raise self._forbidden(attrs, f'node "{node}" can only create pods with a controller owner reference '
                                         'set to itself')
        if owner.get("blockOwnerDeletion") is True:
            raise self._forbidden(attrs, f'node "{node}" must not set blockOwnerDeletion on an owner reference')
        ref = pod_api_reference(pod)
        if ref is not None:
            raise self._forbidden(attrs, f'node "{node}" can not create pods that reference {ref}')

    # -- nodes -----------------------------------------------------------------

    def _node(self, node: str, attrs: Attributes) -> None:
        name = attrs.name or _meta(attrs.obj).get("name") or ""
        if name != node:
            raise self._forbidden(attrs, f'node "{node}" is not allowed to modify node "{name}"')
        if attrs.operation == CREATE:
            if _spec(attrs.obj).get("configSource") is not None:
                raise self._forbidden(attrs, f'node "{node}" is not allowed to create pods with a non-nil '
                                             'configSource')
            bad = forbidden_labels(set(_labels(attrs.obj)), CREATE)
            if bad:
                raise self._forbidden(attrs, f'node "{node}" is not allowed to set the following labels: '
                                             + ", ".join(bad))
        elif attrs.operation == UPDATE:
            new, old = attrs.obj or {}, attrs.old_obj or {}
            source = _spec(new).get("configSource")
            if source is not None and source != _spec(old).get("configSource"):
                raise self._forbidden(attrs, f'node "{node}" is not allowed to update configSource to a new '
                                             'non-nil configSource')
            if (_spec(new).get("taints") or None) != (_spec(old).get("taints") or None):
                raise self._forbidden(attrs, f'node "{node}" is not allowed to modify taints')
            if (_meta(new).get("ownerReferences") or None) != (_meta(old).get("ownerReferences") or None):
                raise self._forbidden(attrs, f'node "{node}" is not allowed to modify ownerReferences')
            bad = forbidden_labels(_modified_labels(_labels(new), _labels(old)), UPDATE)
            if bad:
                raise self._forbidden(attrs, "is not allowed to modify labels: " + ", ".join(bad))

    # -- the rest ----------------------------------------------------------------

    def _pvc(self, node: str, attrs: Attributes) -> None:
        if attrs.subresource != "status":
            raise self._forbidden(attrs, "may only update PVC status")
        if attrs.operation != UPDATE:
            raise self._forbidden(attrs, f'unexpected operation "{attrs.operation}"')
        old, new = attrs.old_obj or {}, attrs.obj or {}

        def comparable(pvc: Obj) -> Obj:
            status = dict(pvc.get("status") or {})
            status.pop("capacity", None)
            status.pop("conditions", None)
            md = {k: v for k, v in _meta(pvc).items() if k not in ("resourceVersion", "managedFields")}
            return {"metadata": md, "spec": pvc.get("spec"), "status": status}

        if comparable(old) != comparable(new):
            raise self._forbidden(attrs, f'node "{node}" is not allowed to update fields other than '
                                         'status.quantity and status.conditions')

    async def _service_account(self, node: str, attrs: Attributes) -> None:
        if attrs.operation != CREATE or attrs.subresource != "token":
            return
        ref = _spec(attrs.obj).get("boundObjectRef")
        if (not isinstance(ref, dict) or (ref.get("apiVersion") or "v1") != "v1" or ref.get("kind") != "Pod"
                or not ref.get("name")):
            raise self._forbidden(attrs, "node requested token not bound to a pod")
        if not ref.get("uid"):
            raise self._forbidden(attrs, "node requested token with a pod binding without a uid")
        pod = await self._stored("pods", ref["name"], attrs.namespace)
        if pod is None:
            raise errors.not_found("pods", ref["name"])
        if _meta(pod).get("uid") != ref["uid"]:
            raise self._forbidden(attrs, f"the UID in the bound object reference ({ref['uid']}) does not match the "
                                         "UID in record. The object might have been deleted and then recreated")
        if _spec(pod).get("nodeName") != node:
            raise self._forbidden(attrs, "node requested token bound to a pod scheduled on a different node")

    def _lease(self, node: str, attrs: Attributes) -> None:
        if attrs.namespace != NODE_LEASE_NAMESPACE:
            raise self._forbidden(attrs, f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace')
        name = _meta(attrs.obj).get("name") if attrs.operation == CREATE else attrs.name
        if name != node:
            raise self._forbidden(attrs, "can only access node lease with the same name as the requesting node")

    def _csinode(self, node: str, attrs: Attributes) -> None:
        name = _meta(attrs.obj).get("name") if attrs.operation == CREATE else attrs.name
        if name != node:
            raise self._forbidden(attrs, "can only access CSINode with the same name as the requesting node")

    def _slice(self, node: str, attrs: Attributes) -> None:
        if attrs.operation == CREATE and _spec(attrs.obj).get("nodeName") != node:
            raise self._forbidden(attrs, "can only create ResourceSlice with the same NodeName as the requesting node")
        if attrs.operation == DELETE and _spec(attrs.old_obj).get("nodeName") != node:
            raise self._forbidden(attrs, "can only delete ResourceSlice with the same NodeName as the requesting node")

    def _csr(self, node: str, attrs: Attributes) -> None:
        if attrs.operation != CREATE:
            return
        spec = _spec(attrs.obj)
        if spec.get("signerName") not in _KUBELET_SIGNERS:
            return
        from cryptography.x509.oid import NameOID

        from kubeplane.api.validation.certificates import decode_bytes, parse_csr

        try:
            req = parse_csr(decode_bytes(spec.get("request")) or b"")
        except ValueError as err:
            raise self._forbidden(attrs, f"unable to parse csr: {err}") from None
        cns = req.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if (str(cns[0].value) if cns else "") != f"system:node:{node}":
            raise self._forbidden(attrs, f"can only create a node CSR with CN=system:node:{node}")


__all__ = ["NodeRestriction", "forbidden_labels", "is_kubelet_label", "pod_api_reference"]
