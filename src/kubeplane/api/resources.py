"""The catalogue of resources kubeplane serves.

One declarative entry per resource. Everything that needs to know a
resource's URL shape, kind, scope or short names (API server routes,
discovery, OpenAPI, the HTTP client, kubectl short names) reads it from here.
Behaviour (defaults, validation, printing) is attached by the registry.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    subresources: tuple[str, ...] = ()  # "status", "scale", "binding", "log", "finalize", "token"
    verbs: tuple[str, ...] = (
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch",
    )

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

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
       subresources=("status", "binding", "log")),
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
    # apps/v1
    _r("apps", "v1", "Deployment", "deployments", True, short_names=("deploy",), categories=("all",),
       subresources=("status", "scale")),
    _r("apps", "v1", "ReplicaSet", "replicasets", True, short_names=("rs",), categories=("all",),
       subresources=("status", "scale")),
    # batch/v1 (kubectl create job)
    _r("batch", "v1", "Job", "jobs", True, categories=("all",), subresources=("status",)),
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
)


class Catalogue:
    """Lookups over :data:`RESOURCES` by every name a client may use."""

    def __init__(self, resources: tuple[ResourceInfo, ...] = RESOURCES) -> None:
        self.resources = resources
        self._by_gvr = {(r.group, r.version, r.plural): r for r in resources}
        self._by_gvk = {(r.group, r.version, r.kind): r for r in resources}
        self._by_kind = {}
        for r in resources:
            self._by_kind.setdefault(r.kind, r)

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
        seen: list[tuple[str, str]] = []
        for r in self.resources:
            if (r.group, r.version) not in seen:
                seen.append((r.group, r.version))
        return seen

    def in_group_version(self, group: str, version: str) -> list[ResourceInfo]:
        return [r for r in self.resources if r.group == group and r.version == version]


CATALOGUE = Catalogue()


def resource(kind_or_plural: str, group: str | None = None) -> ResourceInfo:
    """Convenience lookup used by controllers and tests: ``resource("pods")``, ``resource("Pod")``."""
    for r in RESOURCES:
        if group is not None and r.group != group:
            continue
        if kind_or_plural in (r.plural, r.kind, r.singular) or kind_or_plural in r.short_names:
            return r
    raise KeyError(kind_or_plural)
