"""The catalogue of resources kubeplane serves.

One declarative entry per resource. Everything that needs to know a
resource's URL shape, kind, scope or short names (API server routes,
discovery, OpenAPI, the HTTP client, kubectl short names) reads it from here.
Behaviour (defaults, validation, printing) is attached by the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "status", "scale", "binding", "eviction", "log", "finalize", "token"
    verbs: tuple[str, ...] = (
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch",
    )
    #: for a custom resource, what its CustomResourceDefinition says of this
    #: version (kubeplane.registry.customresource.CustomResourceVersion); None
    #: for built-in kinds
    custom: Any = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return self.custom.list_kind if self.custom is not None else self.kind + "List"

    @property
    def qualified(self) -> str:
        """``pods`` or ``deployments.apps``: the name used in error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> tuple[str, str]:
        """(group, plural): resources are unique by this pair across versions."""
        return (self.group, self.plural)

    def collection_path(self, namespace: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def item_path(self, name: str, namespace: str | None = None, subresource: str | None = None) -> str:
        path = f"{self.collection_path(namespace)}/{name}"
        return f"{path}/{subresource}" if subresource else path

    def storage_prefix(self, namespace: str | None = None) -> str:
        """Keys are ``/registry/<group>/<plural>/<ns>/<name>`` (cluster-scoped: no ns)."""
        base = f"/registry/{self.group or 'core'}/{self.plural}/"
        if self.namespaced and namespace:
            return f"{base}{namespace}/"
        return base

    def storage_key(self, name: str, namespace: str | None = None) -> str:
        return f"{self.storage_prefix(namespace)}{name}"


def _r(group: str, version: str, kind: str, plural: str, namespaced: bool, **kw) -> ResourceInfo:
    return ResourceInfo(group, version, kind, plural, kind.lower(), namespaced, **kw)


RESOURCES: tuple[ResourceInfo, ...] = (
    # core/v1
    # upstream serves no deletecollection on namespaces
    _r("", "v1", "Namespace", "namespaces", False, short_names=("ns",), subresources=("status", "finalize"),
       verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    _r("", "v1", "Node", "nodes", False, short_names=("no",), subresources=("status",)),
    _r("", "v1", "Pod", "pods", True, short_names=("po",), categories=("all",),
       subresources=("status", "binding", "eviction", "log", "exec", "attach", "portforward")),
    _r("", "v1", "PersistentVolume", "persistentvolumes", False, short_names=("pv",),
       subresources=("status",)),
    _r("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, short_names=("pvc",),
       subresources=("status",)),
    _r("", "v1", "Event", "events", True, short_names=("ev",)),
    _r("", "v1", "ConfigMap", "configmaps", True, short_names=("cm",)),
    _r("", "v1", "Secret", "secrets", True),
    _r("", "v1", "ServiceAccount", "serviceaccounts", True, short_names=("sa",), subresources=("token",)),
    _r("", "v1", "Service", "services", True, short_names=("svc",), categories=("all",),
       subresources=("status",)),
    # authentication.k8s.io/v1
    _r("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", False, verbs=("create",)),
    _r("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews", False, verbs=("create",)),
    # storage.k8s.io/v1
    _r("storage.k8s.io", "v1", "StorageClass", "storageclasses", False, short_names=("sc",)),
    _r("storage.k8s.io", "v1", "CSINode", "csinodes", False),
    _r("storage.k8s.io", "v1", "CSIStorageCapacity", "csistoragecapacities", True),
    # rbac.authorization.k8s.io/v1
    _r("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    _r("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    _r("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    _r("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    # authorization.k8s.io/v1 (reviews: answered by the authorizer, never stored)
    _r("authorization.k8s.io", "v1", "LocalSubjectAccessReview", "localsubjectaccessreviews", True, verbs=("create",)),
    _r("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews", False, verbs=("create",)),
    _r("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews", False, verbs=("create",)),
    _r("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", False, verbs=("create",)),
    # coordination.k8s.io/v1
    _r("coordination.k8s.io", "v1", "Lease", "leases", True),
    # admissionregistration.k8s.io/v1
    _r("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations", False,
       categories=("api-extensions",)),
    _r("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", "validatingwebhookconfigurations",
       False, categories=("api-extensions",)),
    # apps/v1
    _r("apps", "v1", "Deployment", "deployments", True, short_names=("deploy",), categories=("all",),
       subresources=("status", "scale")),
    _r("apps", "v1", "ReplicaSet", "replicasets", True, short_names=("rs",), categories=("all",),
       subresources=("status", "scale")),
    # admissionregistration.k8s.io/v1 (ValidatingAdmissionPolicy)
    _r("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies", False,
       categories=("api-extensions",), subresources=("status",)),
    _r("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings",
       False, categories=("api-extensions",)),
    # batch/v1 (kubectl create job)
    _r("batch", "v1", "Job", "jobs", True, categories=("all",), subresources=("status",)),
    # apiextensions.k8s.io/v1
    _r("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False,
       short_names=("crd", "crds"), categories=("api-extensions",), subresources=("status",)),
    # policy/v1 (PodDisruptionBudgets, respected by preemption)
    _r("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, short_names=("pdb",),
       subresources=("status",)),
    # certificates.k8s.io/v1
    _r("certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests", False,
       short_names=("csr",), subresources=("status", "approval")),
    # scheduling.k8s.io/v1
    _r("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False, short_names=("pc",)),
    # resource.k8s.io/v1
    _r("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", False),
    _r("resource.k8s.io", "v1", "ResourceSlice", "resourceslices", False),
    _r("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", True, subresources=("status",)),
    _r("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates", True),
    # -- job --

    # -- cronjob --
    _r("batch", "v1", "CronJob", "cronjobs", True, short_names=("cj",), categories=("all",), subresources=("status",)),
    _r("", "v1", "ReplicationController", "replicationcontrollers", True, short_names=("rc",), categories=("all",),
       subresources=("status", "scale")),
    _r("", "v1", "PodTemplate", "podtemplates", True),

    # -- statefulset --
    _r("apps", "v1", "ControllerRevision", "controllerrevisions", True),
    _r("apps", "v1", "StatefulSet", "statefulsets", True, short_names=("sts",), categories=("all",),
       subresources=("status", "scale")),

    # -- daemonset --
    _r("apps", "v1", "DaemonSet", "daemonsets", True, short_names=("ds",), categories=("all",),
       subresources=("status",)),

    # -- endpoints --
    # core/v1 Endpoints (the endpoints controller's), discovery.k8s.io/v1 EndpointSlice
    _r("", "v1", "Endpoints", "endpoints", True, short_names=("ep",)),
    _r("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True),
    # networking.k8s.io/v1
    _r("networking.k8s.io", "v1", "Ingress", "ingresses", True, short_names=("ing",), subresources=("status",)),
    _r("networking.k8s.io", "v1", "IngressClass", "ingressclasses", False),
    _r("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, short_names=("netpol",)),

    # -- hpa --
    # autoscaling/v2 (the storage version) and v1
    _r("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True, short_names=("hpa",),
       categories=("all",), subresources=("status",)),
    _r("autoscaling", "v1", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True, short_names=("hpa",),
       categories=("all",), subresources=("status",)),
    # metrics.k8s.io/v1beta1: read-only, computed from the usage nodes report
    _r("metrics.k8s.io", "v1beta1", "NodeMetrics", "nodes", False, verbs=("get", "list")),
    _r("metrics.k8s.io", "v1beta1", "PodMetrics", "pods", True, verbs=("get", "list")),

    # -- maintenance --

    # -- quota --
    _r("", "v1", "ResourceQuota", "resourcequotas", True, short_names=("quota",), subresources=("status",)),
    _r("", "v1", "LimitRange", "limitranges", True, short_names=("limits",)),

)


class Catalogue:
    """Lookups over the served resources by every name a client may use.

    The built-in kinds are fixed; custom resources come and go at run time
    (:meth:`set_custom`, one call per CustomResourceDefinition). Readers
    always see a consistent snapshot, and subscribers hear of every change
    (discovery and OpenAPI caches, the controllers that iterate resources).
    """

    def __init__(self, resources: tuple[ResourceInfo, ...] = RESOURCES) -> None:
        self.builtin = tuple(resources)
        #: CRD name -> the resources (one per served version) it defines
        self._custom: dict[str, tuple[ResourceInfo, ...]] = {}
        self._subscribers: list[Callable[[], None]] = []
        #: bumped on every change: caches keyed by it stay valid until the next one
        self.generation = 0
        self._index()

    def _index(self) -> None:
        resources = self.builtin + tuple(r for rs in self._custom.values() for r in rs)
        self.resources = resources
        self._by_gvr = {(r.group, r.version, r.plural): r for r in resources}
        self._by_gvk = {(r.group, r.version, r.kind): r for r in resources}
        self._by_kind: dict[str, ResourceInfo] = {}
        for r in resources:
            self._by_kind.setdefault(r.kind, r)
        gvs: dict[tuple[str, str], list[ResourceInfo]] = {}
        for r in resources:
            gvs.setdefault((r.group, r.version), []).append(r)
        self._gvs = gvs

    # -- custom resources -------------------------------------------------

    def set_custom(self, crd_name: str, resources: tuple[ResourceInfo, ...] | list[ResourceInfo]) -> None:
        """Serve ``resources`` for the CRD ``crd_name`` (replacing what it had);
        an empty sequence stops serving them."""
        resources = tuple(resources)
        if self._custom.get(crd_name, ()) == resources and all(
                a.custom is b.custom for a, b in zip(self._custom.get(crd_name, ()), resources)):
            return
        if resources:
            self._custom[crd_name] = resources
        else:
            if crd_name not in self._custom:
                return
            del self._custom[crd_name]
        self._index()
        self.generation += 1
        for fn in list(self._subscribers):
            fn()

    def remove_custom(self, crd_name: str) -> None:
        self.set_custom(crd_name, ())

    def custom(self, crd_name: str) -> tuple[ResourceInfo, ...]:
        return self._custom.get(crd_name, ())

    def subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` after every change; returns the function that unsubscribes."""
        self._subscribers.append(fn)

        def unsubscribe() -> None:
            if fn in self._subscribers:
                self._subscribers.remove(fn)

        return unsubscribe

    # -- lookups ------------------------------------------------------------

    def by_gvr(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        return self._by_gvr.get((group, version, plural))

    def by_gvk(self, group: str, version: str, kind: str) -> ResourceInfo | None:
        return self._by_gvk.get((group, version, kind))

    def by_api_version_kind(self, api_version: str, kind: str) -> ResourceInfo | None:
        group, _, version = api_version.rpartition("/")
        return self._by_gvk.get((group, version, kind))

    def by_kind(self, kind: str) -> ResourceInfo | None:
        return self._by_kind.get(kind)

    def group_versions(self) -> list[tuple[str, str]]:
        return list(self._gvs)

    def in_group_version(self, group: str, version: str) -> list[ResourceInfo]:
        return list(self._gvs.get((group, version), ()))

    def copy(self) -> "Catalogue":
        """A catalogue of the same built-in kinds and no custom resources."""
        return Catalogue(self.builtin)


CATALOGUE = Catalogue()


def resource(kind_or_plural: str, group: str | None = None) -> ResourceInfo:
    """Convenience lookup used by controllers and tests: ``resource("pods")``, ``resource("Pod")``."""
    for r in RESOURCES:
        if group is not None and r.group != group:
            continue
        if kind_or_plural in (r.plural, r.kind, r.singular) or kind_or_plural in r.short_names:
            return r
    raise KeyError(kind_or_plural)
