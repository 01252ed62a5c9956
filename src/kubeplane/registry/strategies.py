"""Per-resource behaviour: defaults, create/update preparation, status handling.

Upstream keeps one ``strategy`` per resource type (pkg/registry/*/strategy.go);
here a strategy is a small object looked up by ``(group, plural)``. Anything a
strategy does not override behaves like upstream's generic registry: status is
owned by the ``status`` subresource when the resource has one, and
``metadata.generation`` moves when anything outside metadata and status changes.
"""

from __future__ import annotations

import copy

from typing import Any, Callable

from kubeplane.api.qos import pod_qos_class
from kubeplane.api.resources import ResourceInfo

Obj = dict[str, Any]

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


class Strategy:
    """Generic behaviour; subclasses override the hooks they need."""

    #: resources whose spec changes bump metadata.generation
    tracks_generation = True
    #: the propagation of a delete that names none (upstream's
    #: DefaultGarbageCollectionPolicy): None is Background
    default_gc_policy: str | None = None

    def __init__(self, res: ResourceInfo) -> None:
        self.res = res

    @property
    def has_status(self) -> bool:
        return "status" in self.res.subresources

    def default(self, obj: Obj) -> None:
        """Fill defaults in place (upstream: defaulting functions + admission)."""

    def prepare_for_create(self, obj: Obj) -> None:
        """Reset what a client may not set on create (e.g. status)."""
        if self.has_status:
            obj.pop("status", None)
            initial = self.initial_status(obj)
            if initial is not None:
                obj["status"] = initial

    def initial_status(self, obj: Obj) -> Obj | None:
        return None

    # The parts taken from the stored object are shared, not copied: stored
    # objects are never modified in place, and nothing modifies these parts of
    # the new version between here and the store.

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        """Main endpoint: status is owned by the status subresource."""
        if self.has_status:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)

    def prepare_for_status_update(self, new: Obj, old: Obj) -> None:
        """Status endpoint: everything but status (and metadata) comes from old."""
        for k in list(new):
            if k not in ("status", "metadata", "apiVersion", "kind"):
                del new[k]
        for k, v in old.items():
            if k not in ("status", "metadata", "apiVersion", "kind"):
                new[k] = v

    def prepare_for_approval_update(self, new: Obj, old: Obj) -> None:
        """The approval endpoint (CertificateSigningRequests only)."""
        self.prepare_for_status_update(new, old)

    def subresource_causes(self, new: Obj, old: Obj, subresource: str | None) -> list:
        """Validation errors that depend on the endpoint an update came through."""
        return []

    # Writes that reserve something outside the object (a Service's ClusterIP
    # and node ports): called once the object is valid, they return a
    # transaction (``commit()``, ``revert()``) or None.

    async def begin_create(self, registry: Any, obj: Obj) -> Any:
        return None

    async def begin_update(self, registry: Any, new: Obj, old: Obj) -> Any:
        return None

    def after_delete(self, registry: Any, obj: Obj) -> None:
        """The object is gone from storage."""

    def spec_changed(self, new: Obj, old: Obj) -> bool:
        for k in set(new) | set(old):
            if k in ("metadata", "status", "apiVersion", "kind"):
                continue
            if new.get(k) != old.get(k):
                return True
        return False


def image_pull_policy(image: str) -> str:
    """``Always`` for an image whose tag is ``latest`` (also when it names no tag
    and no digest), ``IfNotPresent`` otherwise (upstream's ParseImageName rules)."""
    if not image:
        return "IfNotPresent"
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    if not tag and not digest:
        tag = "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _default_field_ref(holder: Any) -> None:
    """``fieldRef.apiVersion`` defaults to ``v1`` (ObjectFieldSelector)."""
    if isinstance(holder, dict):
        ref = holder.get("fieldRef")
        if isinstance(ref, dict) and not ref.get("apiVersion"):
            ref["apiVersion"] = "v1"


def _default_http_get(handler: Any) -> None:
    """HTTPGetAction: path ``/``, scheme ``HTTP``; GRPCAction: service ``""``."""
    if not isinstance(handler, dict):
        return
    get = handler.get("httpGet")
    if isinstance(get, dict):
        if not get.get("path"):
            get["path"] = "/"
        if not get.get("scheme"):
            get["scheme"] = "HTTP"
    grpc = handler.get("grpc")
    if isinstance(grpc, dict) and grpc.get("service") is None:
        grpc["service"] = ""


def _default_probe(probe: Any) -> None:
    if not isinstance(probe, dict):
        return
    for name, value in (("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1),
                        ("failureThreshold", 3)):
        if not probe.get(name):
            probe[name] = value
    _default_http_get(probe)


def _default_container(c: Obj) -> None:
    """SetDefaults_Container and the defaults of what a container holds."""
    if not c.get("imagePullPolicy"):
        image = c.get("image")
        c["imagePullPolicy"] = image_pull_policy(image if isinstance(image, str) else "")
    if not c.get("terminationMessagePath"):
        c["terminationMessagePath"] = "/dev/termination-log"
    if not c.get("terminationMessagePolicy"):
        c["terminationMessagePolicy"] = "File"
    c.setdefault("resources", {})
    for p in c.get("ports") or []:
        if isinstance(p, dict) and not p.get("protocol"):
            p["protocol"] = "TCP"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _default_probe(c.get(probe))
    lifecycle = c.get("lifecycle")
    if isinstance(lifecycle, dict):
        _default_http_get(lifecycle.get("postStart"))
        _default_http_get(lifecycle.get("preStop"))
    for env in c.get("env") or []:
        if isinstance(env, dict):
            _default_field_ref(env.get("valueFrom"))


_VOLUME_MODE_DEFAULT = 0o644  # secret, configMap, downwardAPI and projected volumes

# Declarative (+default) values of volume sources, shared by pod volumes and
# persistent volume sources of the same name.
_SOURCE_DEFAULTS: dict[str, tuple[tuple[str, Any], ...]] = {
    "hostPath": (("type", ""),),
    "iscsi": (("iscsiInterface", "default"),),
    "rbd": (("pool", "rbd"), ("user", "admin"), ("keyring", "/etc/ceph/keyring")),
    "scaleIO": (("storageMode", "ThinProvisioned"), ("fsType", "xfs")),
    "azureDisk": (("cachingMode", "ReadWrite"), ("fsType", "ext4"), ("readOnly", False), ("kind", "Shared")),
}


def default_volume_sources(holder: Obj) -> None:
    """Defaults inside the volume sources of a pod volume or a PV spec."""
    for name, defaults in _SOURCE_DEFAULTS.items():
        src = holder.get(name)
        if isinstance(src, dict):
            for key, value in defaults:
                if src.get(key) is None or (isinstance(value, str) and value and src.get(key) == ""):
                    src[key] = value
    for name in ("secret", "configMap", "downwardAPI", "projected"):
        src = holder.get(name)
        if isinstance(src, dict) and src.get("defaultMode") is None:
            src["defaultMode"] = _VOLUME_MODE_DEFAULT
    downward = holder.get("downwardAPI")
    if isinstance(downward, dict):
        for item in downward.get("items") or []:
            _default_field_ref(item)
    projected = holder.get("projected")
    if isinstance(projected, dict):
        for source in projected.get("sources") or []:
            if not isinstance(source, dict):
                continue
            token = source.get("serviceAccountToken")
            if isinstance(token, dict) and token.get("expirationSeconds") is None:
                token["expirationSeconds"] = 3600
            downward = source.get("downwardAPI")
            if isinstance(downward, dict):
                for item in downward.get("items") or []:
                    _default_field_ref(item)
    ephemeral = holder.get("ephemeral")
    if isinstance(ephemeral, dict):
        template = ephemeral.get("volumeClaimTemplate")
        if isinstance(template, dict) and isinstance(template.get("spec"), dict):
            template["spec"].setdefault("volumeMode", "Filesystem")


def default_pod_spec(spec: Obj) -> None:
    """SetDefaults_PodSpec and what it holds: applies to pods and pod templates."""
    if not isinstance(spec, dict):
        return
    if not spec.get("restartPolicy"):
        spec["restartPolicy"] = "Always"
    if spec.get("terminationGracePeriodSeconds") is None:
        spec["terminationGracePeriodSeconds"] = 30
    if not spec.get("dnsPolicy"):
        spec["dnsPolicy"] = "ClusterFirst"
    if spec.get("securityContext") is None:
        spec["securityContext"] = {}
    if not spec.get("schedulerName"):
        spec["schedulerName"] = "default-scheduler"
    for field in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            if isinstance(c, dict):
                _default_container(c)
    for v in spec.get("volumes") or []:
        if not isinstance(v, dict):
            continue
        if all(k == "name" or v[k] is None for k in v):
            v["emptyDir"] = {}
        default_volume_sources(v)


def _default_pod_only(spec: Obj) -> None:
    """SetDefaults_Pod: what only a Pod gets, not a pod template."""
    for field in ("containers", "initContainers"):
        for c in spec.get(field) or []:
            res = c.get("resources") if isinstance(c, dict) else None
            # Requests default to the limits given.
            if isinstance(res, dict) and isinstance(res.get("limits"), dict):
                req = res.get("requests")
                if req is None:
                    req = res["requests"] = {}
                if isinstance(req, dict):
                    for k, v in res["limits"].items():
                        req.setdefault(k, v)
    if spec.get("enableServiceLinks") is None:
        spec["enableServiceLinks"] = True
    if spec.get("hostNetwork") is True:
        # With host networking every container port is a host port.
        for field in ("containers", "initContainers"):
            for c in spec.get(field) or []:
                for p in (c.get("ports") or []) if isinstance(c, dict) else []:
                    if isinstance(p, dict) and not p.get("hostPort") and "containerPort" in p:
                        p["hostPort"] = p["containerPort"]


class PodStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        default_pod_spec(spec)
        _default_pod_only(spec)
        # spec.priority and spec.preemptionPolicy come from the Priority
        # admission plugin (registry/policyadmission.py), the default
        # not-ready/unreachable tolerations from DefaultTolerationSeconds.

    def initial_status(self, obj: Obj) -> Obj:
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        # classed as defaulted (upstream defaults before PrepareForCreate): a
        # container's requests default to its limits
        spec = copy.deepcopy(spec)
        _default_pod_only(spec)
        return {"phase": "Pending", "qosClass": pod_qos_class(spec)}

    def prepare_for_status_update(self, new: Obj, old: Obj) -> None:
        super().prepare_for_status_update(new, old)


#: the finalizer of the namespace controller in a namespace's spec.finalizers
NAMESPACE_FINALIZER = "kubernetes"


class NamespaceStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        md = obj.setdefault("metadata", {})
        name = md.get("name")
        if name:
            labels = md.get("labels")
            if labels is None:
                labels = md["labels"] = {}
            if isinstance(labels, dict):
                labels["kubernetes.io/metadata.name"] = name
        obj.setdefault("spec", {})

    def prepare_for_create(self, obj: Obj) -> None:
        super().prepare_for_create(obj)
        # On create the namespace controller's finalizer is required (as
        # upstream's strategy): it may be removed later, through finalize only.
        spec = obj.get("spec")
        if spec is None:
            spec = obj["spec"] = {}
        if isinstance(spec, dict):
            finalizers = spec.get("finalizers")
            if finalizers is None:
                spec["finalizers"] = [NAMESPACE_FINALIZER]
            elif isinstance(finalizers, list) and NAMESPACE_FINALIZER not in finalizers:
                spec["finalizers"] = [*finalizers, NAMESPACE_FINALIZER]

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Active"}

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        """spec.finalizers is written through the finalize subresource only."""
        super().prepare_for_update(new, old)
        old_spec = old.get("spec") if isinstance(old.get("spec"), dict) else {}
        spec = new.get("spec")
        if not isinstance(spec, dict):
            spec = new["spec"] = {}
        if "finalizers" in old_spec:
            spec["finalizers"] = old_spec["finalizers"]
        else:
            spec.pop("finalizers", None)

    def prepare_for_finalize_update(self, new: Obj, old: Obj) -> None:
        """``namespaces/finalize``: everything but the status comes from the request."""
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)


_NODE_INFO_KEYS = ("architecture", "bootID", "containerRuntimeVersion", "kernelVersion", "kubeProxyVersion",
                   "kubeletVersion", "machineID", "operatingSystem", "osImage", "systemUUID")


class NodeStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        # The value structs a Node always has upstream (a registered node that
        # never reported still shows them, empty).
        if obj.get("spec") is None:
            obj["spec"] = {}
        status = obj.get("status")
        if status is None:
            status = obj["status"] = {}
        if not isinstance(status, dict):
            return
        endpoints = status.get("daemonEndpoints")
        if endpoints is None:
            endpoints = status["daemonEndpoints"] = {}
        if isinstance(endpoints, dict) and endpoints.get("kubeletEndpoint") is None:
            endpoints["kubeletEndpoint"] = {"Port": 0}
        info = status.get("nodeInfo")
        if info is None:
            info = status["nodeInfo"] = {}
        if isinstance(info, dict):
            for key in _NODE_INFO_KEYS:
                info.setdefault(key, "")
        # SetDefaults_NodeStatus: allocatable is the capacity unless given.
        if status.get("allocatable") is None and isinstance(status.get("capacity"), dict):
            status["allocatable"] = dict(status["capacity"])

    def prepare_for_create(self, obj: Obj) -> None:
        """Kubelets register a Node with its status in one request: keep it."""


class DeploymentStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        spec.setdefault("replicas", 1)
        strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
        if isinstance(strategy, dict):
            strategy.setdefault("type", "RollingUpdate")
            if strategy["type"] == "RollingUpdate":
                ru = strategy.setdefault("rollingUpdate", {})
                if isinstance(ru, dict):
                    ru.setdefault("maxUnavailable", "25%")
                    ru.setdefault("maxSurge", "25%")
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        _default_template(spec)


def _default_template(spec: Obj) -> None:
    tmpl = spec.get("template")
    if isinstance(tmpl, dict):
        tmpl.setdefault("metadata", {})
        default_pod_spec(tmpl.get("spec"))


class ReplicaSetStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        spec.setdefault("replicas", 1)
        _default_template(spec)

    def initial_status(self, obj: Obj) -> Obj:
        return {"replicas": 0}


class StatefulSetStrategy(Strategy):
    """Upstream's ``SetDefaults_StatefulSet`` (with MaxUnavailableStatefulSet on:
    the issue asks for ``maxUnavailable``, so it is kept and defaulted to 1),
    the volumeClaimTemplates defaulted as PersistentVolumeClaims are, status
    validated on the status endpoint."""

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        if not spec.get("podManagementPolicy"):
            spec["podManagementPolicy"] = "OrderedReady"
        strategy = spec.get("updateStrategy")
        if strategy is None:
            strategy = spec["updateStrategy"] = {}
        if isinstance(strategy, dict):
            if not strategy.get("type"):
                strategy["type"] = "RollingUpdate"
                if strategy.get("rollingUpdate") is None:
                    strategy["rollingUpdate"] = {}
            ru = strategy.get("rollingUpdate")
            if strategy["type"] == "RollingUpdate" and isinstance(ru, dict):
                if ru.get("partition") is None:
                    ru["partition"] = 0
                if ru.get("maxUnavailable") is None:
                    ru["maxUnavailable"] = 1
        policy = spec.get("persistentVolumeClaimRetentionPolicy")
        if policy is None:
            policy = spec["persistentVolumeClaimRetentionPolicy"] = {}
        if isinstance(policy, dict):
            for key in ("whenDeleted", "whenScaled"):
                if not policy.get(key):
                    policy[key] = "Retain"
        if spec.get("replicas") is None:
            spec["replicas"] = 1
        if spec.get("revisionHistoryLimit") is None:
            spec["revisionHistoryLimit"] = 10
        _default_template(spec)
        claims = spec.get("volumeClaimTemplates")
        for claim in claims if isinstance(claims, list) else []:
            if not isinstance(claim, dict):
                continue
            cspec = claim.get("spec")
            if isinstance(cspec, dict) and cspec.get("volumeMode") is None:
                cspec["volumeMode"] = "Filesystem"
            status = claim.get("status")
            if status is None:
                claim["status"] = {"phase": "Pending"}
            elif isinstance(status, dict) and not status.get("phase"):
                status["phase"] = "Pending"

    def initial_status(self, obj: Obj) -> Obj:
        return {"replicas": 0, "availableReplicas": 0}

    def subresource_causes(self, new: Obj, old: Obj, subresource: str | None) -> list:
        if subresource != "status":
            return []
        from kubeplane.api.validation.apps import _validate_statefulset_status
        from kubeplane.api.errors import invalid_value

        out = _validate_statefulset_status(new)
        new_cc = (new.get("status") or {}).get("collisionCount")
        old_cc = (old.get("status") or {}).get("collisionCount")
        if isinstance(old_cc, int) and (new_cc is None or (isinstance(new_cc, int) and new_cc < old_cc)):
            out.append(invalid_value("status.collisionCount", new_cc or 0, "cannot be decremented"))
        return out


JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
CONTROLLER_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")


class JobStrategy(Strategy):
    #: batch/v1 Jobs orphan their pods unless told otherwise (kept for old clients, as upstream)
    default_gc_policy = "Orphan"

    def prepare_for_create(self, obj: Obj) -> None:
        super().prepare_for_create(obj)
        spec = obj.get("spec")
        if isinstance(spec, dict) and spec.get("manualSelector") is not True:
            self._generate_selector(obj, spec)

    @staticmethod
    def _generate_selector(obj: Obj, spec: Obj) -> None:
        """Upstream's generateSelector: the pods carry the job's name and uid
        as labels and the selector picks the uid (labels the user set are
        kept; a mismatch is for validation to find)."""
        md = obj.get("metadata") or {}
        template = spec.get("template")
        if not isinstance(template, dict):
            return
        tmd = template.get("metadata")
        if tmd is None:
            tmd = template["metadata"] = {}
        if not isinstance(tmd, dict):
            return
        labels = tmd.get("labels")
        if labels is None:
            labels = tmd["labels"] = {}
        if not isinstance(labels, dict):
            return
        for key in JOB_NAME_LABELS:
            labels.setdefault(key, md.get("name", ""))
        for key in CONTROLLER_UID_LABELS:
            labels.setdefault(key, md.get("uid", ""))
        selector = spec.get("selector")
        if selector is None:
            selector = spec["selector"] = {}
        if isinstance(selector, dict):
            match = selector.get("matchLabels")
            if match is None:
                match = selector["matchLabels"] = {}
            if isinstance(match, dict):
                match.setdefault("batch.kubernetes.io/controller-uid", md.get("uid", ""))

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        # Both unset: a non-parallel job of one completion.
        if spec.get("completions") is None and spec.get("parallelism") is None:
            spec["completions"] = 1
        if spec.get("parallelism") is None:
            spec["parallelism"] = 1
        if spec.get("backoffLimit") is None:
            spec["backoffLimit"] = 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6
        template = spec.get("template")
        labels = ((template.get("metadata") or {}) if isinstance(template, dict) else {}).get("labels")
        md = obj.get("metadata")
        if isinstance(labels, dict) and isinstance(md, dict) and not md.get("labels"):
            md["labels"] = dict(labels)
        if spec.get("completionMode") is None:
            spec["completionMode"] = "NonIndexed"
        if spec.get("suspend") is None:
            spec["suspend"] = False
        policy = spec.get("podFailurePolicy")
        if isinstance(policy, dict):
            for rule in policy.get("rules") or []:
                for pattern in (rule.get("onPodConditions") or []) if isinstance(rule, dict) else []:
                    if isinstance(pattern, dict) and not pattern.get("status"):
                        pattern["status"] = "True"
        if spec.get("podReplacementPolicy") is None:
            spec["podReplacementPolicy"] = "Failed" if policy is not None else "TerminatingOrFailed"
        _default_template(spec)


class ServiceStrategy(Strategy):
    """Defaults; the ClusterIP and node ports come from the registry's
    allocators (registry/servicealloc.py) once the Service is valid."""

    tracks_generation = False

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        # SetDefaults_Service
        if not spec.get("sessionAffinity"):
            spec["sessionAffinity"] = "None"
        if spec["sessionAffinity"] == "None":
            spec.pop("sessionAffinityConfig", None)
        elif spec["sessionAffinity"] == "ClientIP":
            config = spec.get("sessionAffinityConfig")
            client_ip = config.get("clientIP") if isinstance(config, dict) else None
            if not isinstance(client_ip, dict) or client_ip.get("timeoutSeconds") is None:
                spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 10800}}
        if not spec.get("type"):
            spec["type"] = "ClusterIP"
        kind = spec["type"]
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                if not p.get("protocol"):
                    p["protocol"] = "TCP"
                if p.get("targetPort") in (None, 0, "") and "port" in p:
                    p["targetPort"] = p["port"]
        externally_accessible = kind in ("LoadBalancer", "NodePort") or (
            kind == "ClusterIP" and bool(spec.get("externalIPs")))
        if externally_accessible and not spec.get("externalTrafficPolicy"):
            spec["externalTrafficPolicy"] = "Cluster"
        if spec.get("internalTrafficPolicy") is None and kind in ("ClusterIP", "NodePort", "LoadBalancer"):
            spec["internalTrafficPolicy"] = "Cluster"
        if kind == "LoadBalancer" and spec.get("allocateLoadBalancerNodePorts") is None:
            spec["allocateLoadBalancerNodePorts"] = True
        if spec["type"] != "ExternalName":
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")

    def prepare_for_create(self, obj: Obj) -> None:
        super().prepare_for_create(obj)
        from kubeplane.registry.servicealloc import normalize_cluster_ips

        normalize_cluster_ips(obj, None)
        obj["status"] = {"loadBalancer": {}}

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        super().prepare_for_update(new, old)
        from kubeplane.registry.servicealloc import prepare_service_update

        prepare_service_update(new, old)

    async def begin_create(self, registry: Any, obj: Obj) -> Any:
        return await registry.service_allocators.allocate_create(obj)

    async def begin_update(self, registry: Any, new: Obj, old: Obj) -> Any:
        return await registry.service_allocators.allocate_update(new, old)

    def after_delete(self, registry: Any, obj: Obj) -> None:
        registry.service_allocators.release(obj)


class PVCStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict) and spec.get("volumeMode") is None:
            spec["volumeMode"] = "Filesystem"

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}


class PVStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            if not spec.get("persistentVolumeReclaimPolicy"):
                spec["persistentVolumeReclaimPolicy"] = "Retain"
            if spec.get("volumeMode") is None:
                spec["volumeMode"] = "Filesystem"
            default_volume_sources(spec)

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}


class StorageClassStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        obj.setdefault("reclaimPolicy", "Delete")
        obj.setdefault("volumeBindingMode", "Immediate")


class SecretStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        obj.setdefault("type", "Opaque")
        # stringData is write-only: merged into data, base64-encoded.
        sd = obj.pop("stringData", None)
        if isinstance(sd, dict):
            import base64

            data = obj.setdefault("data", {})
            if isinstance(data, dict):
                for k, v in sd.items():
                    data[k] = base64.b64encode(str(v).encode()).decode()


class PriorityClassStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")


class ResourceQuotaStrategy(Strategy):
    """No generation; status (hard and used) belongs to the quota controller
    and the ResourceQuota admission, through the status subresource."""

    tracks_generation = False


class LimitRangeStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        """upstream's SetDefaults_LimitRangeItem: a Container item's default
        limit is its max, its default request the default limit, else the min."""
        limits = (obj.get("spec") or {}).get("limits") if isinstance(obj.get("spec"), dict) else None
        for item in limits if isinstance(limits, list) else []:
            if not isinstance(item, dict) or item.get("type") != "Container":
                continue
            default = dict(item["default"]) if isinstance(item.get("default"), dict) else {}
            request = dict(item["defaultRequest"]) if isinstance(item.get("defaultRequest"), dict) else {}
            for k, v in (item.get("max") or {}).items() if isinstance(item.get("max"), dict) else ():
                default.setdefault(k, v)
            for k, v in default.items():
                request.setdefault(k, v)
            for k, v in (item.get("min") or {}).items() if isinstance(item.get("min"), dict) else ():
                request.setdefault(k, v)
            if default:
                item["default"] = default
            if request:
                item["defaultRequest"] = request


class ResourceClaimStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            default_claim_spec(spec)


def default_claim_spec(spec: Obj) -> None:
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return
    for req in devices.get("requests") or []:
        if not isinstance(req, dict):
            continue
        exactly = req.get("exactly")
        if isinstance(exactly, dict):
            _default_device_request(exactly)
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, dict):
                _default_device_request(sub)


def _default_device_request(r: Obj) -> None:
    """SetDefaults_ExactDeviceRequest / _DeviceSubRequest, and the +default of
    each toleration's operator."""
    if not r.get("allocationMode"):
        r["allocationMode"] = "ExactCount"
    if r["allocationMode"] == "ExactCount" and not r.get("count"):
        r["count"] = 1
    for tol in r.get("tolerations") or []:
        if isinstance(tol, dict) and not tol.get("operator"):
            tol["operator"] = "Equal"


class ResourceSliceStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        # SetDefaults_DeviceTaint: a taint is added now unless it says when.
        spec = obj.get("spec")
        devices = spec.get("devices") if isinstance(spec, dict) else None
        stamp = None
        for device in devices if isinstance(devices, list) else []:
            for taint in (device.get("taints") or []) if isinstance(device, dict) else []:
                if isinstance(taint, dict) and taint.get("timeAdded") is None:
                    if stamp is None:
                        from kubeplane.api.meta import format_time, utcnow

                        stamp = format_time(utcnow())
                    taint["timeAdded"] = stamp


class ResourceClaimTemplateStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("spec"), dict):
            default_claim_spec(spec["spec"])


class ValidatingAdmissionPolicyStrategy(Strategy):
    """v1 defaults; the status (type checking) is written by the API server itself."""

    def default(self, obj: Obj) -> None:
        from kubeplane.admission.policy_api import default_policy

        default_policy(obj)

    def initial_status(self, obj: Obj) -> Obj | None:
        return {}


class ValidatingAdmissionPolicyBindingStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        from kubeplane.admission.policy_api import default_binding

        default_binding(obj)


class WebhookConfigurationStrategy(Strategy):
    """admissionregistration.k8s.io/v1 Mutating/ValidatingWebhookConfiguration:
    upstream's v1 defaults (sideEffects and admissionReviewVersions have none in
    v1). Generation moves when the webhooks change."""

    def default(self, obj: Obj) -> None:
        mutating = self.res.kind == "MutatingWebhookConfiguration"
        for hook in obj.get("webhooks") or []:
            if not isinstance(hook, dict):
                continue
            hook.setdefault("failurePolicy", "Fail")
            hook.setdefault("matchPolicy", "Equivalent")
            if hook.get("namespaceSelector") is None:
                hook["namespaceSelector"] = {}
            if hook.get("objectSelector") is None:
                hook["objectSelector"] = {}
            if hook.get("timeoutSeconds") is None:
                hook["timeoutSeconds"] = 10
            if mutating and hook.get("reinvocationPolicy") is None:
                hook["reinvocationPolicy"] = "Never"
            for rule in hook.get("rules") or []:
                if isinstance(rule, dict) and rule.get("scope") is None:
                    rule["scope"] = "*"
            cc = hook.get("clientConfig")
            svc = cc.get("service") if isinstance(cc, dict) else None
            if isinstance(svc, dict) and svc.get("port") is None:
                svc["port"] = 443


class NoGenerationStrategy(Strategy):
    tracks_generation = False


class RBACBindingStrategy(NoGenerationStrategy):
    """RoleBindings and ClusterRoleBindings: the v1 defaults of roleRef and subjects."""

    def default(self, obj: Obj) -> None:
        ref = obj.get("roleRef")
        if isinstance(ref, dict) and not ref.get("apiGroup"):
            ref["apiGroup"] = "rbac.authorization.k8s.io"
        subjects = obj.get("subjects")
        for subject in subjects if isinstance(subjects, list) else ():
            if isinstance(subject, dict) and not subject.get("apiGroup") and subject.get("kind") in ("User", "Group"):
                subject["apiGroup"] = "rbac.authorization.k8s.io"


class CSRStrategy(Strategy):
    """certificates.k8s.io CertificateSigningRequests: the requester comes
    from the request's user, the spec never changes, the approval endpoint
    writes the Approved/Denied conditions and the status endpoint the rest."""

    tracks_generation = False

    def prepare_for_create(self, obj: Obj) -> None:
        from kubeplane.auth.user import current_user

        spec = obj.get("spec")
        if isinstance(spec, dict):
            for k in ("username", "uid", "groups", "extra"):
                spec.pop(k, None)
            user = current_user()
            spec["username"] = user.name
            if user.uid:
                spec["uid"] = user.uid
            if user.groups:
                spec["groups"] = list(user.groups)
            if user.extra:
                spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        # no pre-approved requests
        obj["status"] = {}

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        for k in ("spec", "status"):
            if k in old:
                new[k] = old[k]
            else:
                new.pop(k, None)

    def prepare_for_status_update(self, new: Obj, old: Obj) -> None:
        super().prepare_for_status_update(new, old)
        status = new.get("status")
        if not isinstance(status, dict):
            return
        new["status"] = status = dict(status)
        conds = status.get("conditions")
        if isinstance(conds, list):
            conds = status["conditions"] = list(conds)
            old_conds = _csr_conditions(old)
            # Approved/Denied stay as they were; a different count of them is refused by validation
            for ctype in ("Approved", "Denied"):
                new_at = [i for i, c in enumerate(conds) if isinstance(c, dict) and c.get("type") == ctype]
                old_of = [c for c in old_conds if c.get("type") == ctype]
                if len(new_at) == len(old_of):
                    for i, c in zip(new_at, old_of):
                        conds[i] = c
            _stamp_conditions(conds, old_conds)

    def prepare_for_approval_update(self, new: Obj, old: Obj) -> None:
        status = new.get("status")
        conds = status.get("conditions") if isinstance(status, dict) else None
        if isinstance(conds, list):
            conds = list(conds)
            _stamp_conditions(conds, _csr_conditions(old))
        for k in list(new):
            if k not in ("status", "metadata", "apiVersion", "kind"):
                del new[k]
        for k, v in old.items():
            if k not in ("status", "metadata", "apiVersion", "kind"):
                new[k] = v
        merged = dict(old.get("status") or {})
        if conds is None:
            merged.pop("conditions", None)
        else:
            merged["conditions"] = conds
        new["status"] = merged

    def subresource_causes(self, new: Obj, old: Obj, subresource: str | None) -> list:
        from kubeplane.api.validation.certificates import subresource_update_causes

        return subresource_update_causes(new, old, subresource)


def _csr_conditions(obj: Obj) -> list[Obj]:
    status = obj.get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conds if isinstance(c, dict)] if isinstance(conds, list) else []


def _stamp_conditions(conds: list, old_conds: list[Obj]) -> None:
    """upstream's populateConditionTimestamps: lastUpdateTime now when unset;
    lastTransitionTime kept from a stored condition of the same type and
    status, else now. Changed conditions are copies."""
    from kubeplane.api.meta import now_text

    now = now_text()
    for i, c in enumerate(conds):
        if not isinstance(c, dict):
            continue
        if c.get("lastUpdateTime") and c.get("lastTransitionTime"):
            continue
        c = conds[i] = dict(c)
        if not c.get("lastUpdateTime"):
            c["lastUpdateTime"] = now
        if not c.get("lastTransitionTime"):
            c["lastTransitionTime"] = next(
                (o["lastTransitionTime"] for o in old_conds if o.get("type") == c.get("type")
                 and o.get("status") == c.get("status") and o.get("lastTransitionTime")), now)


# builds on the classes above; its classes are looked up when a strategy is made
from kubeplane.registry import strategies_cronjob as _cronjob  # noqa: E402
from kubeplane.registry import strategies_endpoints as _endpoints  # noqa: E402


class PodDisruptionBudgetStrategy(Strategy):
    """upstream's PDB strategy: a new budget starts with the zero status (the
    four counts are always serialised), which the disruption controller fills."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}


_STRATEGIES: dict[tuple[str, str], Callable[[ResourceInfo], Strategy]] = {
    ("", "pods"): PodStrategy,
    ("", "namespaces"): NamespaceStrategy,
    ("", "nodes"): NodeStrategy,
    ("", "services"): ServiceStrategy,
    ("", "persistentvolumeclaims"): PVCStrategy,
    ("", "persistentvolumes"): PVStrategy,
    ("", "secrets"): SecretStrategy,
    ("", "configmaps"): NoGenerationStrategy,
    ("", "events"): NoGenerationStrategy,
    ("", "serviceaccounts"): NoGenerationStrategy,
    ("certificates.k8s.io", "certificatesigningrequests"): CSRStrategy,
    ("coordination.k8s.io", "leases"): NoGenerationStrategy,
    ("storage.k8s.io", "storageclasses"): StorageClassStrategy,
    ("storage.k8s.io", "csinodes"): NoGenerationStrategy,
    ("storage.k8s.io", "csistoragecapacities"): NoGenerationStrategy,
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): WebhookConfigurationStrategy,
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): WebhookConfigurationStrategy,
    ("apps", "deployments"): DeploymentStrategy,
    ("apps", "replicasets"): ReplicaSetStrategy,
    ("batch", "jobs"): JobStrategy,
    ("scheduling.k8s.io", "priorityclasses"): PriorityClassStrategy,
    ("resource.k8s.io", "resourceclaims"): ResourceClaimStrategy,
    ("resource.k8s.io", "resourceslices"): ResourceSliceStrategy,
    ("resource.k8s.io", "resourceclaimtemplates"): ResourceClaimTemplateStrategy,
    ("admissionregistration.k8s.io", "validatingadmissionpolicies"): ValidatingAdmissionPolicyStrategy,
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): ValidatingAdmissionPolicyBindingStrategy,
    ("rbac.authorization.k8s.io", "roles"): NoGenerationStrategy,
    ("rbac.authorization.k8s.io", "clusterroles"): NoGenerationStrategy,
    ("rbac.authorization.k8s.io", "rolebindings"): RBACBindingStrategy,
    ("rbac.authorization.k8s.io", "clusterrolebindings"): RBACBindingStrategy,
    # -- job --

    # -- cronjob --
    ("batch", "cronjobs"): lambda res: _cronjob.CronJobStrategy(res),
    ("", "replicationcontrollers"): lambda res: _cronjob.ReplicationControllerStrategy(res),
    ("", "podtemplates"): lambda res: _cronjob.PodTemplateStrategy(res),

    # -- statefulset --
    ("apps", "controllerrevisions"): NoGenerationStrategy,
    ("apps", "statefulsets"): StatefulSetStrategy,

    # -- daemonset --
    ("apps", "daemonsets"): lambda res: __import__(
        "kubeplane.registry.strategies_daemonset", fromlist=["DaemonSetStrategy"]).DaemonSetStrategy(res),

    # -- endpoints --
    ("", "endpoints"): lambda res: _endpoints.EndpointsStrategy(res),
    ("discovery.k8s.io", "endpointslices"): lambda res: _endpoints.EndpointSliceStrategy(res),
    ("networking.k8s.io", "ingresses"): lambda res: _endpoints.IngressStrategy(res),
    ("networking.k8s.io", "ingressclasses"): lambda res: _endpoints.IngressClassStrategy(res),
    ("networking.k8s.io", "networkpolicies"): lambda res: _endpoints.NetworkPolicyStrategy(res),

    # -- hpa --
    ("autoscaling", "horizontalpodautoscalers"): lambda res: __import__(
        "kubeplane.registry.strategies_hpa", fromlist=["_"]).HorizontalPodAutoscalerStrategy(res),

    # -- maintenance --
    ("policy", "poddisruptionbudgets"): PodDisruptionBudgetStrategy,

    # -- quota --
    ("", "resourcequotas"): ResourceQuotaStrategy,
    ("", "limitranges"): LimitRangeStrategy,

}


def strategy_for(res: ResourceInfo) -> Strategy:
    factory = _STRATEGIES.get(res.key, Strategy)
    return factory(res)
