"""The Node authorizer (upstream's plugin/pkg/auth/authorizer/node).

A kubelet authenticates as ``system:node:<name>`` in group ``system:nodes``.
This authorizer decides its requests and has no opinion on anyone else's:

* secrets and configmaps: get, list and watch of one object (a list or watch
  names it with ``fieldSelector=metadata.name=``) that a pod bound to the node
  uses (volumes, projected sources, env and envFrom, imagePullSecrets);
* persistentvolumeclaims (and their status updates), persistentvolumes,
  resourceclaims: get of one a pod bound to the node uses (a PV through its
  bound claim);
* serviceaccounts: create of the ``token`` subresource (TokenRequest) of the
  ServiceAccount of a pod bound to the node (get of the account too, as
  upstream's kubelet credential providers need);
* its own Node (get, and list/watch with ``metadata.name=<node>``; create,
  update and patch, which NodeRestriction limits to its own);
* pods: get of one bound to it; list and watch with
  ``fieldSelector=spec.nodeName=<node>``; create and delete (mirror pods),
  status updates and evictions, which NodeRestriction holds to its own pods;
* its Lease in ``kube-node-lease``, its CSINode, ResourceSlices of its own;
* everything else: the static rules of the ``system:node`` ClusterRole.

The relationships come from a :class:`NodeGraph`: pods (with ``spec.nodeName``),
claims, volumes and ResourceSlices read once from the store and kept current
by a watch, as upstream's graph populator follows informers. Denials are "no
opinion" with upstream's reason, so the next authorizer (RBAC) may still allow.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterable

from kubeplane.api.errors import StatusError
from kubeplane.api.selectors import parse_field_selector
from kubeplane.auth.authorizer import Attributes, Decision
from kubeplane.auth.user import NODE_PREFIX, NODES_GROUP, UserInfo

log = logging.getLogger("kubeplane.auth.node")

Obj = dict[str, Any]
NODE_LEASE_NAMESPACE = "kube-node-lease"

SECRET = "secret"
CONFIGMAP = "configmap"
PVC = "pvc"
PV = "pv"
SERVICE_ACCOUNT = "serviceAccount"
RESOURCE_CLAIM = "resourceclaim"
POD = "pod"
SLICE = "resourceslice"

#: the node authorizer graph's relists back off from this to at most the max (seconds)
RELIST_BACKOFF_INITIAL = 0.5
RELIST_BACKOFF_MAX = 30.0


class _WatchEnded(Exception):
    """A graph watch ended without an error of its own."""


#: store prefixes the graph follows, and what each holds
_PREFIXES = {
    "/registry/core/pods/": POD,
    "/registry/core/persistentvolumeclaims/": PVC,
    "/registry/core/persistentvolumes/": PV,
    "/registry/resource.k8s.io/resourceslices/": SLICE,
}


def node_identity(user: UserInfo) -> tuple[str, bool]:
    """Upstream's NodeIdentifier: (node name, is a node). A node is a user in
    ``system:nodes`` named ``system:node:<name>``; the name may be empty (an
    unidentifiable node)."""
    if NODES_GROUP not in user.groups or not user.name.startswith(NODE_PREFIX):
        return "", False
    return user.name[len(NODE_PREFIX):], True


def _dicts(value: Any) -> list[Obj]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _name(value: Any, key: str = "name") -> str:
    if isinstance(value, dict):
        v = value.get(key)
        if isinstance(v, str):
            return v
    return ""


#: volume sources naming a secret (upstream's VisitPodSecretNames): field, key of the name
_SECRET_VOLUME_REFS = (("azureFile", "secretName"), ("cephfs", "secretRef"), ("cinder", "secretRef"),
                       ("flexVolume", "secretRef"), ("iscsi", "secretRef"), ("rbd", "secretRef"),
                       ("scaleIO", "secretRef"), ("storageos", "secretRef"), ("csi", "nodePublishSecretRef"))


def pod_references(pod: Obj) -> set[tuple[str, str]]:
    """What a pod uses, as (vertex type, name) in the pod's namespace: the
    secrets, configmaps, claims and ServiceAccount the kubelet reads for it."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    out: set[tuple[str, str]] = set()
    pod_name = _name(pod.get("metadata"))
    for ref in _dicts(spec.get("imagePullSecrets")):
        if _name(ref):
            out.add((SECRET, _name(ref)))
    containers = (_dicts(spec.get("containers")) + _dicts(spec.get("initContainers"))
                  + _dicts(spec.get("ephemeralContainers")))
    for c in containers:
        for env in _dicts(c.get("envFrom")):
            if _name(env.get("secretRef")):
                out.add((SECRET, _name(env.get("secretRef"))))
            if _name(env.get("configMapRef")):
                out.add((CONFIGMAP, _name(env.get("configMapRef"))))
        for env in _dicts(c.get("env")):
            vf = env.get("valueFrom") if isinstance(env.get("valueFrom"), dict) else {}
            if _name(vf.get("secretKeyRef")):
                out.add((SECRET, _name(vf.get("secretKeyRef"))))
            if _name(vf.get("configMapKeyRef")):
                out.add((CONFIGMAP, _name(vf.get("configMapKeyRef"))))
    for vol in _dicts(spec.get("volumes")):
        if _name(vol.get("secret"), "secretName"):
            out.add((SECRET, _name(vol.get("secret"), "secretName")))
        if _name(vol.get("configMap")):
            out.add((CONFIGMAP, _name(vol.get("configMap"))))
        projected = vol.get("projected") if isinstance(vol.get("projected"), dict) else {}
        for src in _dicts(projected.get("sources")):
            if _name(src.get("secret")):
                out.add((SECRET, _name(src.get("secret"))))
            if _name(src.get("configMap")):
                out.add((CONFIGMAP, _name(src.get("configMap"))))
        for field, key in _SECRET_VOLUME_REFS:
            source = vol.get(field)
            if isinstance(source, dict):
                ref = source.get(key)
                name = ref if isinstance(ref, str) else _name(ref)
                if name:
                    out.add((SECRET, name))
        if _name(vol.get("persistentVolumeClaim"), "claimName"):
            out.add((PVC, _name(vol.get("persistentVolumeClaim"), "claimName")))
        if isinstance(vol.get("ephemeral"), dict) and pod_name and _name(vol):
            out.add((PVC, f"{pod_name}-{_name(vol)}"))  # the claim the ephemeral volume controller makes
    sa = spec.get("serviceAccountName")
    if isinstance(sa, str) and sa:
        out.add((SERVICE_ACCOUNT, sa))
    for claim in _dicts(spec.get("resourceClaims")):
        if _name(claim, "resourceClaimName"):
            out.add((RESOURCE_CLAIM, _name(claim, "resourceClaimName")))
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    for claim in _dicts(status.get("resourceClaimStatuses")):
        if _name(claim, "resourceClaimName"):
            out.add((RESOURCE_CLAIM, _name(claim, "resourceClaimName")))
    return out


def _pv_secrets(pv: Obj) -> set[tuple[str, str]]:
    """The secrets (namespace, name) a PersistentVolume's source names."""
    spec = pv.get("spec") if isinstance(pv.get("spec"), dict) else {}
    out: set[tuple[str, str]] = set()
    claim_ns = _name(spec.get("claimRef"), "namespace")
    for field, keys in (("csi", ("nodePublishSecretRef", "nodeStageSecretRef", "controllerPublishSecretRef",
                                 "controllerExpandSecretRef", "nodeExpandSecretRef")),
                        ("azureFile", ("secretName",)), ("cephfs", ("secretRef",)), ("cinder", ("secretRef",)),
                        ("flexVolume", ("secretRef",)), ("iscsi", ("secretRef",)), ("rbd", ("secretRef",)),
                        ("scaleIO", ("secretRef",)), ("storageos", ("secretRef",))):
        source = spec.get(field)
        if not isinstance(source, dict):
            continue
        for key in keys:
            ref = source.get(key)
            if isinstance(ref, str) and ref:
                ns = source.get("secretNamespace") if isinstance(source.get("secretNamespace"), str) else claim_ns
                out.add((ns or claim_ns, ref))
            elif isinstance(ref, dict) and _name(ref):
                out.add((_name(ref, "namespace") or claim_ns, _name(ref)))
    return {(ns, n) for ns, n in out if ns}


class NodeGraph:
    """Which node uses which object (upstream's node authorizer graph),
    kept from a watch of the store's pods, claims, volumes and slices."""

    def __init__(self, store: Any) -> None:
        self.store = store
        #: pod (namespace, name) -> (node, the (type, name) it uses)
        self._pods: dict[tuple[str, str], tuple[str, frozenset[tuple[str, str]]]] = {}
        #: (type, namespace, name) -> node -> how many pods of the node use it
        self._uses: dict[tuple[str, str, str], dict[str, int]] = {}
        #: claim (namespace, name) -> the PV it is bound to
        self._claim_volume: dict[tuple[str, str], str] = {}
        #: PV -> the claims bound to it
        self._volume_claims: dict[str, set[tuple[str, str]]] = {}
        #: PV -> the secrets it names; secret (namespace, name) -> PVs naming it
        self._volume_secrets: dict[str, set[tuple[str, str]]] = {}
        self._secret_volumes: dict[tuple[str, str], set[str]] = {}
        #: ResourceSlice name -> node
        self._slices: dict[str, str] = {}
        self.revision = 0
        self._watches: list[Any] = []
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            return
        for prefix in _PREFIXES:
            await self._relist(prefix)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(i, prefix)) for i, prefix in enumerate(_PREFIXES)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for w in self._watches:
            if w is not None:
                w.close()
        self._watches = []

    async def _list_and_watch(self, prefix: str) -> tuple[Any, Any]:
        from kubeplane.storage.interface import CompactedError

        while True:
            result = await self.store.list(prefix)
            try:
                return result, self.store.watch(prefix, result.revision)
            except CompactedError:
                continue

    async def _relist(self, prefix: str) -> None:
        result, watch = await self._list_and_watch(prefix)
        index = list(_PREFIXES).index(prefix)
        while len(self._watches) <= index:
            self._watches.append(None)
        if self._watches[index] is not None:
            self._watches[index].close()
        self._watches[index] = watch
        kind = _PREFIXES[prefix]
        present = set()
        for kv in result.items:
            present.add(self._key(prefix, kv.key))
            self._apply(kind, self._key(prefix, kv.key), kv.value)
        for key in self._known(kind) - present:
            self._apply(kind, key, None)
        self.revision = max(self.revision, result.revision)

    def _known(self, kind: str) -> set[tuple[str, str]]:
        if kind == POD:
            return set(self._pods)
        if kind == PVC:
            return set(self._claim_volume)
        if kind == PV:
            return {("", n) for n in set(self._volume_secrets) | set(self._volume_claims)}
        return {("", n) for n in self._slices}

    @staticmethod
    def _key(prefix: str, key: str) -> tuple[str, str]:
        rest = key[len(prefix):].split("/")
        return (rest[0], rest[1]) if len(rest) == 2 else ("", rest[0])

    async def _run(self, index: int, prefix: str) -> None:
        """Apply the watch's events; when the watch ends (closed under the
        graph, fell behind, any error) list and watch again, backing off while
        watches end before delivering anything: the graph must never stop
        following the store."""
        kind = _PREFIXES[prefix]
        delay = 0.0
        while True:
            try:
                events = await self._watches[index].next_batch()
                if events is None:
                    raise _WatchEnded("the watch was closed")
                for ev in events:
                    self._apply(kind, self._key(prefix, ev.key), None if ev.type == "DELETED" else ev.value)
                if events:
                    self.revision = max(self.revision, events[-1].revision)
                    delay = 0.0
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the graph alive
                log.info("node authorizer graph watch of %s ended (%s): relisting%s", prefix, exc,
                         f" in {delay:g}s" if delay else "")
            if delay:
                await asyncio.sleep(delay)
            delay = min(max(delay * 2, RELIST_BACKOFF_INITIAL), RELIST_BACKOFF_MAX)
            await self._relist_retrying(prefix)

    async def _relist_retrying(self, prefix: str) -> None:
        delay = RELIST_BACKOFF_INITIAL
        while True:
            try:
                await self._relist(prefix)
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - keep the graph alive
                log.warning("relisting %s for the node authorizer failed (retrying in %gs): %s",
                            prefix, delay, err)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RELIST_BACKOFF_MAX)

    # -- contents ------------------------------------------------------------

    def _apply(self, kind: str, key: tuple[str, str], obj: Obj | None) -> None:
        if kind == POD:
            self._set_pod(key, obj)
        elif kind == PVC:
            self._set_claim(key, obj)
        elif kind == PV:
            self._set_volume(key[1], obj)
        else:
            node = _name(obj.get("spec"), "nodeName") if obj is not None else ""
            if node:
                self._slices[key[1]] = node
            else:
                self._slices.pop(key[1], None)

    def _set_pod(self, key: tuple[str, str], pod: Obj | None) -> None:
        node = _name(pod.get("spec"), "nodeName") if pod is not None else ""
        new = (node, frozenset(pod_references(pod)) if node and pod is not None else frozenset())
        old = self._pods.get(key)
        if old == new or (old is None and not node):
            return
        ns = key[0]
        if old is not None:
            self._count(old[0], ns, old[1] | {(POD, key[1])}, -1)
            del self._pods[key]
        if node:
            self._pods[key] = new
            self._count(node, ns, new[1] | {(POD, key[1])}, +1)

    def _count(self, node: str, ns: str, refs: Iterable[tuple[str, str]], delta: int) -> None:
        for vtype, name in refs:
            k = (vtype, ns, name)
            by_node = self._uses.setdefault(k, {})
            n = by_node.get(node, 0) + delta
            if n > 0:
                by_node[node] = n
            else:
                by_node.pop(node, None)
                if not by_node:
                    del self._uses[k]

    def _set_claim(self, key: tuple[str, str], claim: Obj | None) -> None:
        volume = _name(claim.get("spec"), "volumeName") if claim is not None else ""
        old = self._claim_volume.pop(key, None)
        if old:
            claims = self._volume_claims.get(old)
            if claims is not None:
                claims.discard(key)
                if not claims:
                    del self._volume_claims[old]
        if claim is not None:
            self._claim_volume[key] = volume
            if volume:
                self._volume_claims.setdefault(volume, set()).add(key)

    def _set_volume(self, name: str, pv: Obj | None) -> None:
        for secret in self._volume_secrets.pop(name, set()):
            pvs = self._secret_volumes.get(secret)
            if pvs is not None:
                pvs.discard(name)
                if not pvs:
                    del self._secret_volumes[secret]
        if pv is None:
            return
        secrets = _pv_secrets(pv)
        self._volume_secrets[name] = secrets
        for secret in secrets:
            self._secret_volumes.setdefault(secret, set()).add(name)

    # -- queries ---------------------------------------------------------------

    def uses(self, node: str, vtype: str, namespace: str, name: str) -> bool:
        """Whether a pod bound to ``node`` uses the object (upstream's hasPathFrom)."""
        if vtype == SLICE:
            return self._slices.get(name) == node
        if vtype == PV:
            return any(self.uses(node, PVC, ns, claim) for ns, claim in self._volume_claims.get(name, ()))
        if node in self._uses.get((vtype, namespace, name), ()):
            return True
        if vtype == SECRET:
            return any(self.uses(node, PV, "", pv) for pv in self._secret_volumes.get((namespace, name), ()))
        return False


def selects(selector: str, field: str, value: str) -> bool:
    """Whether ``selector`` has a term requiring ``field`` to equal ``value`` (upstream reads the
    selector before the resource checks its fields; one that does not parse selects nothing)."""
    try:
        parsed = parse_field_selector(selector, "", check_fields=False)
    except StatusError:
        return False
    return any(r.field == field and r.operator != "!=" and r.value == value for r in parsed.requirements)


class NodeAuthorizer:
    """``kubeplane.auth.authorizer.Authorizer`` for nodes; no opinion on others."""

    def __init__(self, graph: NodeGraph, rules: Iterable[Obj] = ()) -> None:
        from kubeplane.auth.rbac import Rule

        self.graph = graph
        self.rules = tuple(Rule(r) for r in rules)

    def authorize(self, attrs: Attributes) -> tuple[Decision, str]:
        node, is_node = node_identity(attrs.user)
        if not is_node:
            return Decision.NO_OPINION, ""
        if not node:
            return Decision.NO_OPINION, f'unknown node for user "{attrs.user.name}"'
        if attrs.resource_request:
            key = (attrs.api_group, attrs.resource)
            handler = _HANDLERS.get(key)
            if handler is not None:
                return handler(self, node, attrs)
        if any(r.allows(attrs) for r in self.rules):
            return Decision.ALLOW, ""
        return Decision.NO_OPINION, ""

    # -- the kinds subdivided --------------------------------------------------

    def _related(self, node: str, vtype: str, attrs: Attributes) -> tuple[Decision, str]:
        if not attrs.name:
            return Decision.NO_OPINION, "No Object name found"
        if self.graph.uses(node, vtype, attrs.namespace, attrs.name):
            return Decision.ALLOW, ""
        return Decision.NO_OPINION, f"no relationship found between node '{node}' and this object"

    def _read_namespaced(self, node: str, vtype: str, attrs: Attributes) -> tuple[Decision, str]:
        if attrs.verb not in ("get", "list", "watch"):
            return Decision.NO_OPINION, "can only read resources of this type"
        if attrs.subresource:
            return Decision.NO_OPINION, "cannot read subresource"
        if not attrs.namespace:
            return Decision.NO_OPINION, "can only read namespaced object of this type"
        return self._related(node, vtype, attrs)

    def _get(self, node: str, vtype: str, attrs: Attributes) -> tuple[Decision, str]:
        if attrs.verb != "get":
            return Decision.NO_OPINION, "can only get individual resources of this type"
        if attrs.subresource:
            return Decision.NO_OPINION, "cannot get subresource"
        return self._related(node, vtype, attrs)

    def _secret(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        return self._read_namespaced(node, SECRET, attrs)

    def _configmap(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        return self._read_namespaced(node, CONFIGMAP, attrs)

    def _pvc(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        if attrs.subresource == "status":
            if attrs.verb not in ("update", "patch"):
                return Decision.NO_OPINION, "can only get/update/patch this type"
            return self._related(node, PVC, attrs)
        return self._get(node, PVC, attrs)

    def _pv(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        return self._get(node, PV, attrs)

    def _resource_claim(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        return self._get(node, RESOURCE_CLAIM, attrs)

    def _service_account(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        if attrs.verb == "get" and not attrs.subresource:
            return self._read_namespaced(node, SERVICE_ACCOUNT, attrs)
        if attrs.verb != "create" or not attrs.name:
            return Decision.NO_OPINION, "can only create tokens for individual service accounts"
        if attrs.subresource != "token":
            return Decision.NO_OPINION, "can only create token subresource of serviceaccount"
        return self._related(node, SERVICE_ACCOUNT, attrs)

    def _lease(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        if attrs.verb not in ("get", "create", "update", "patch", "delete"):
            return Decision.NO_OPINION, "can only get, create, update, patch, or delete a node lease"
        if attrs.namespace != NODE_LEASE_NAMESPACE:
            return Decision.NO_OPINION, f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace'
        if attrs.verb != "create" and attrs.name != node:
            return Decision.NO_OPINION, "can only access node lease with the same name as the requesting node"
        return Decision.ALLOW, ""

    def _csinode(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        if attrs.verb not in ("get", "create", "update", "patch", "delete"):
            return Decision.NO_OPINION, "can only get, create, update, patch, or delete a CSINode"
        if attrs.subresource:
            return Decision.NO_OPINION, "cannot authorize CSINode subresources"
        if attrs.verb != "create" and attrs.name != node:
            return Decision.NO_OPINION, "can only access CSINode with the same name as the requesting node"
        return Decision.ALLOW, ""

    def _slice(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        if attrs.subresource:
            return Decision.NO_OPINION, "cannot authorize ResourceSlice subresources"
        if attrs.verb == "create":
            return Decision.ALLOW, ""  # NodeRestriction checks spec.nodeName
        if attrs.verb in ("get", "update", "patch", "delete"):
            return self._related(node, SLICE, attrs)
        if attrs.verb in ("watch", "list", "deletecollection"):
            if selects(attrs.field_selector, "spec.nodeName", node):
                return Decision.ALLOW, ""
            return Decision.NO_OPINION, ("can only list/watch/deletecollection resourceslices with nodeName "
                                         "field selector")
        return Decision.NO_OPINION, ("only the following verbs are allowed for a ResourceSlice: get, watch, list, "
                                     "create, update, patch, delete, deletecollection")

    def _node(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        if not attrs.subresource:
            if attrs.verb in ("create", "update", "patch"):
                return Decision.ALLOW, ""  # NodeRestriction: its own only
            if attrs.verb in ("get", "list", "watch"):
                if attrs.name == node:
                    return Decision.ALLOW, ""
                if not attrs.name:
                    return Decision.NO_OPINION, f"node '{node}' cannot read all nodes, only its own Node object"
                return Decision.NO_OPINION, f"node '{node}' cannot read '{attrs.name}', only its own Node object"
        elif attrs.subresource == "status" and attrs.verb in ("update", "patch"):
            return Decision.ALLOW, ""
        return Decision.NO_OPINION, ""

    def _pod(self, node: str, attrs: Attributes) -> tuple[Decision, str]:
        sub, verb = attrs.subresource, attrs.verb
        if not sub:
            if verb == "get":
                return self._get(node, POD, attrs)
            if verb in ("list", "watch"):
                if selects(attrs.field_selector, "spec.nodeName", node):
                    return Decision.ALLOW, ""
                if attrs.name:
                    return self._related(node, POD, attrs)
                return Decision.NO_OPINION, "can only list/watch pods with spec.nodeName field selector"
            if verb in ("create", "delete"):
                return Decision.ALLOW, ""  # mirror pods; NodeRestriction: bound to itself
        elif sub == "status" and verb in ("update", "patch"):
            return Decision.ALLOW, ""
        elif sub == "eviction" and verb == "create":
            return Decision.ALLOW, ""
        return Decision.NO_OPINION, ""


_HANDLERS = {
    ("", "secrets"): NodeAuthorizer._secret,
    ("", "configmaps"): NodeAuthorizer._configmap,
    ("", "persistentvolumeclaims"): NodeAuthorizer._pvc,
    ("", "persistentvolumes"): NodeAuthorizer._pv,
    ("resource.k8s.io", "resourceclaims"): NodeAuthorizer._resource_claim,
    ("", "serviceaccounts"): NodeAuthorizer._service_account,
    ("coordination.k8s.io", "leases"): NodeAuthorizer._lease,
    ("storage.k8s.io", "csinodes"): NodeAuthorizer._csinode,
    ("resource.k8s.io", "resourceslices"): NodeAuthorizer._slice,
    ("", "nodes"): NodeAuthorizer._node,
    ("", "pods"): NodeAuthorizer._pod,
}


class UnionAuthorizer:
    """Upstream's authorizer union (``--authorization-mode=Node,RBAC``): the
    first authorizer with an opinion decides; the reasons of those without
    one are joined. The last one is the RBAC authorizer, whose rules and
    policy cache the reviews and escalation checks read."""

    def __init__(self, node: NodeAuthorizer, rbac: Any) -> None:
        self.node = node
        self.rbac = rbac
        self.cache = getattr(rbac, "cache", None)

    def authorize(self, attrs: Attributes) -> tuple[Decision, str]:
        decision, node_reason = self.node.authorize(attrs)
        if decision is not Decision.NO_OPINION:
            return decision, node_reason
        decision, reason = self.rbac.authorize(attrs)
        if decision is not Decision.NO_OPINION:
            return decision, reason
        return decision, ", ".join(r for r in (node_reason, reason) if r)

    def decide(self, user: UserInfo, info: Any) -> tuple[Decision, str]:
        """For the HTTP front end: nodes are decided afresh (the graph moves), anyone
        else by the RBAC authorizer's cached decisions."""
        if node_identity(user)[1]:
            from kubeplane.auth.requestinfo import to_attributes

            return self.authorize(to_attributes(user, info))
        decide = getattr(self.rbac, "decide", None)
        if decide is not None:
            return decide(user, info)
        from kubeplane.auth.requestinfo import to_attributes

        return self.rbac.authorize(to_attributes(user, info))

    def rules_for(self, user: UserInfo, namespace: str) -> tuple[list[Obj], list[str]]:
        rules, errs = self.rbac.rules_for(user, namespace)
        if node_identity(user)[1]:
            errs = [*errs, "node authorizer does not support user rule resolution"]
        return rules, errs


__all__ = ["NodeAuthorizer", "NodeGraph", "UnionAuthorizer", "node_identity", "pod_references", "selects"]
