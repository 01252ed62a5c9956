"""Object validation with upstream's field paths, reasons and messages, one module per API group.

:func:`validate_object` returns a list of :class:`~kubeplane.api.errors.Cause`
(empty when the object is valid); the registry turns a non-empty list into a
422 with :func:`~kubeplane.api.errors.invalid`. Each resource has one entry in
:data:`VALIDATORS`; other modules can add checks (for example CEL compilation
of DRA selectors) with :func:`register_extra_validator`.

The modules: :mod:`.meta` (ObjectMeta, label selectors), :mod:`.core` (v1:
pods, nodes, services, namespaces, ConfigMaps, Secrets, Events, PVs, PVCs),
:mod:`.apps`, :mod:`.batch`, :mod:`.policy`, :mod:`.coordination`,
:mod:`.scheduling`, :mod:`.storage` (storage.k8s.io), :mod:`.resource`
(resource.k8s.io) and :mod:`.common` (their shared helpers). The string checks
(``is_dns1123_label`` and friends) live in :mod:`kubeplane.api.strings`; field
errors are built by :mod:`kubeplane.api.errors`. Both are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from kubeplane.api.errors import Cause, go_repr
from kubeplane.api.meta import same_json
from kubeplane.api.strings import (
    NameFn,
    is_config_map_key,
    is_dns1035_label,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
    is_valid_port_name,
    is_valid_port_num,
    name_is_dns1035_label,
    name_is_dns_label,
    name_is_dns_subdomain,
)
from kubeplane.api.validation.admissionregistration import validate_webhook_configuration
from kubeplane.api.validation.apiextensions import validate_crd, validate_crd_update
from kubeplane.api.validation.apps import (
    _selector_immutable,
    _validate_controller_revision,
    _validate_controller_revision_update,
    _validate_daemonset,
    _validate_daemonset_update,
    _validate_deployment,
    _validate_replicaset,
    _validate_statefulset,
    _validate_statefulset_update,
)
from kubeplane.api.validation.batch import _validate_job, _validate_job_update, validate_cronjob
from kubeplane.api.validation.certificates import csr_name, validate_csr_create, validate_csr_update
from kubeplane.api.validation.common import _d
from kubeplane.api.validation.coordination import _validate_lease
from kubeplane.api.validation.core import (
    _validate_config_map,
    _validate_config_map_update,
    _validate_endpoints,
    _validate_event,
    _validate_namespace,
    _validate_node,
    _validate_pod,
    _validate_pod_template_object,
    _validate_pod_update,
    _validate_pv,
    _validate_pv_update,
    _validate_pvc,
    _validate_pvc_update,
    _validate_replication_controller,
    _validate_secret,
    _validate_secret_update,
    _validate_service,
    _validate_service_update,
    validate_node_selector,
    validate_pod_spec,
    validate_pod_template,
    validate_pvc_spec,
)
from kubeplane.api.validation.discovery import _validate_endpoint_slice, _validate_endpoint_slice_update
from kubeplane.api.validation.networking import (
    _validate_ingress,
    _validate_ingress_class,
    _validate_ingress_class_update,
    _validate_network_policy,
)
from kubeplane.api.validation.meta import (
    validate_annotations,
    validate_label_selector,
    validate_labels,
    validate_object_meta,
    validate_object_meta_update,
)
from kubeplane.api.validation.policy import _validate_pdb, _validate_pdb_update
from kubeplane.api.validation.quota import (
    _validate_limit_range,
    _validate_resource_quota,
    _validate_resource_quota_update,
)
from kubeplane.api.validation.rbac import (
    _role_ref_immutable,
    _validate_cluster_role,
    _validate_cluster_role_binding,
    _validate_role,
    _validate_role_binding,
    name_is_path_segment,
)
from kubeplane.api.validation.resource import (
    _spec_immutable,
    _validate_device_class,
    _validate_resource_claim,
    _validate_resource_claim_template,
    _validate_resource_slice,
    _validate_resource_slice_update,
    validate_device_claim_spec,
)
from kubeplane.api.validation.scheduling import _validate_priority_class, _validate_priority_class_update
from kubeplane.api.validation.storage import (
    _validate_csi_node,
    _validate_csi_storage_capacity,
    _validate_storage_class,
    _validate_storage_class_update,
)

if TYPE_CHECKING:
    from kubeplane.api.resources import ResourceInfo


Check = Callable[[dict[str, Any]], list[Cause]]
UpdateCheck = Callable[[dict[str, Any], dict[str, Any]], list[Cause]]
ExtraValidator = Callable[["ResourceInfo", dict[str, Any], "dict[str, Any] | None"], list[Cause]]


# Keyed by ResourceInfo.qualified (``pods``, ``deployments.apps``, ...):
# (name rule, checks on every write, extra checks on update).
VALIDATORS: dict[str, tuple[NameFn, Check | None, UpdateCheck | None]] = {
    "namespaces": (name_is_dns_label, _validate_namespace, None),
    "nodes": (name_is_dns_subdomain, _validate_node, None),
    "pods": (name_is_dns_subdomain, _validate_pod, _validate_pod_update),
    "persistentvolumes": (name_is_dns_subdomain, _validate_pv, _validate_pv_update),
    "persistentvolumeclaims": (name_is_dns_subdomain, _validate_pvc, _validate_pvc_update),
    "events": (name_is_dns_subdomain, _validate_event, None),
    "configmaps": (name_is_dns_subdomain, _validate_config_map, _validate_config_map_update),
    "secrets": (name_is_dns_subdomain, _validate_secret, _validate_secret_update),
    "services": (name_is_dns1035_label, _validate_service, _validate_service_update),
    "storageclasses.storage.k8s.io": (name_is_dns_subdomain, _validate_storage_class, _validate_storage_class_update),
    "csinodes.storage.k8s.io": (name_is_dns_subdomain, _validate_csi_node, None),
    "csistoragecapacities.storage.k8s.io": (name_is_dns_subdomain, _validate_csi_storage_capacity, None),
    "leases.coordination.k8s.io": (name_is_dns_subdomain, _validate_lease, None),
    "mutatingwebhookconfigurations.admissionregistration.k8s.io": (name_is_dns_subdomain, None, None),
    "validatingwebhookconfigurations.admissionregistration.k8s.io": (name_is_dns_subdomain, None, None),
    "deployments.apps": (name_is_dns_subdomain, _validate_deployment, _selector_immutable),
    "replicasets.apps": (name_is_dns_subdomain, _validate_replicaset, _selector_immutable),
    "jobs.batch": (name_is_dns_subdomain, _validate_job, _validate_job_update),
    "customresourcedefinitions.apiextensions.k8s.io": (name_is_dns_subdomain, validate_crd, validate_crd_update),
    "poddisruptionbudgets.policy": (name_is_dns_subdomain, _validate_pdb, _validate_pdb_update),
    "certificatesigningrequests.certificates.k8s.io": (csr_name, validate_csr_create, validate_csr_update),
    "priorityclasses.scheduling.k8s.io": (name_is_dns_subdomain, _validate_priority_class, _validate_priority_class_update),
    "deviceclasses.resource.k8s.io": (name_is_dns_subdomain, _validate_device_class, None),
    "resourceslices.resource.k8s.io": (name_is_dns_subdomain, _validate_resource_slice, _validate_resource_slice_update),
    "resourceclaims.resource.k8s.io": (name_is_dns_subdomain, _validate_resource_claim, _spec_immutable),
    "resourceclaimtemplates.resource.k8s.io": (name_is_dns_subdomain, _validate_resource_claim_template, _spec_immutable),
    "roles.rbac.authorization.k8s.io": (name_is_path_segment, _validate_role, None),
    "clusterroles.rbac.authorization.k8s.io": (name_is_path_segment, _validate_cluster_role, None),
    "rolebindings.rbac.authorization.k8s.io": (name_is_path_segment, _validate_role_binding, _role_ref_immutable),
    "clusterrolebindings.rbac.authorization.k8s.io": (name_is_path_segment, _validate_cluster_role_binding,
                                                      _role_ref_immutable),
    # -- job --

    # -- cronjob --
    # (CronJob checks differ between create and update: see extra_validators)
    "cronjobs.batch": (name_is_dns_subdomain, None, None),
    "replicationcontrollers": (name_is_dns_subdomain, _validate_replication_controller, None),
    "podtemplates": (name_is_dns_subdomain, _validate_pod_template_object, None),

    # -- statefulset --
    "controllerrevisions.apps": (name_is_dns_subdomain, _validate_controller_revision, _validate_controller_revision_update),
    "statefulsets.apps": (name_is_dns_subdomain, _validate_statefulset, _validate_statefulset_update),

    # -- daemonset --
    "daemonsets.apps": (name_is_dns_subdomain, _validate_daemonset, _validate_daemonset_update),

    # -- endpoints --
    "endpoints": (name_is_dns_subdomain, _validate_endpoints, None),
    "endpointslices.discovery.k8s.io": (name_is_dns_subdomain, _validate_endpoint_slice,
                                        _validate_endpoint_slice_update),
    "ingresses.networking.k8s.io": (name_is_dns_subdomain, _validate_ingress, None),
    "ingressclasses.networking.k8s.io": (name_is_dns_subdomain, _validate_ingress_class,
                                         _validate_ingress_class_update),
    "networkpolicies.networking.k8s.io": (name_is_dns_subdomain, _validate_network_policy, None),

    # -- hpa --
    "horizontalpodautoscalers.autoscaling": (
        name_is_dns_subdomain, __import__("kubeplane.api.validation.autoscaling", fromlist=["_"]).validate_hpa, None),

    # -- maintenance --

    # -- quota --
    "resourcequotas": (name_is_dns_subdomain, _validate_resource_quota, _validate_resource_quota_update),
    "limitranges": (name_is_dns_subdomain, _validate_limit_range, None),

}


# Kinds whose every-write check reads nothing but ``spec``: an update that
# leaves the spec as stored (a status or metadata update) passes it as the
# stored object did.
SPEC_ONLY_CHECKS = frozenset({
    "pods", "nodes", "persistentvolumes", "persistentvolumeclaims", "resourceclaims.resource.k8s.io",
})


# Hook for checks owned elsewhere (e.g. CEL compilation of DRA selectors):
# qualified resource name → callables run after the built-in checks.
extra_validators: dict[str, list[ExtraValidator]] = {
    # webhook configurations: an update relaxes rules the stored object broke
    "mutatingwebhookconfigurations.admissionregistration.k8s.io": [validate_webhook_configuration],
    "validatingwebhookconfigurations.admissionregistration.k8s.io": [validate_webhook_configuration],
    "cronjobs.batch": [validate_cronjob],
}


def register_extra_validator(qualified: str, fn: ExtraValidator) -> None:
    """Add ``fn(res, obj, old)`` to the checks of resource ``qualified`` (e.g. ``deviceclasses.resource.k8s.io``).

    Its causes follow the built-in ones; a cause with the reason and field of
    one the built-in checks reported is dropped (the same rule checked twice)."""
    extra_validators.setdefault(qualified, []).append(fn)


def validate_object(res: "ResourceInfo", obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    """All validation errors of ``obj`` (a create when ``old`` is None, else an update)."""
    name_fn, check, update_check = VALIDATORS.get(res.qualified, (name_is_dns_subdomain, None, None))
    meta = obj.get("metadata")
    old_meta = None if old is None else _d(old.get("metadata"))
    out = validate_object_meta(meta, res.namespaced, name_fn, old=old_meta)
    if old is not None:
        out += validate_object_meta_update(meta, old_meta)
    builtin_from = len(out)
    if check is not None and not (old is not None and res.qualified in SPEC_ONLY_CHECKS
                                  and same_json(obj.get("spec"), old.get("spec"))):
        out += check(obj)
    if old is not None and update_check is not None:
        out += update_check(obj, old)
    extras = extra_validators.get(res.qualified)
    if extras:
        reported: set[tuple[str, str]] | None = None
        for fn in extras:
            causes = fn(res, obj, old)
            if causes:
                if reported is None:
                    reported = {(c.reason, c.field) for c in out[builtin_from:]}
                out += [c for c in causes if (c.reason, c.field) not in reported]
    return out


__all__ = [
    "ExtraValidator",
    "VALIDATORS",
    "extra_validators",
    "go_repr",
    "is_config_map_key",
    "is_dns1035_label",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_qualified_name",
    "is_valid_label_value",
    "is_valid_port_name",
    "is_valid_port_num",
    "name_is_dns1035_label",
    "name_is_dns_label",
    "name_is_dns_subdomain",
    "register_extra_validator",
    "validate_annotations",
    "validate_device_claim_spec",
    "validate_label_selector",
    "validate_labels",
    "validate_node_selector",
    "validate_object",
    "validate_object_meta",
    "validate_object_meta_update",
    "validate_pod_spec",
    "validate_pod_template",
    "validate_pvc_spec",
]
