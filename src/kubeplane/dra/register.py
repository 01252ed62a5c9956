"""Hook the resource.k8s.io checks of :mod:`kubeplane.dra.validation` into API validation.

``install()`` registers :func:`validate_resource` as an extra validator of
DeviceClass, ResourceClaim, ResourceClaimTemplate and ResourceSlice; CEL
selectors are then compiled at create/update time and a bad expression is
rejected with a 422 naming the field. Causes the built-in checks already
report are not repeated. Calling it again is harmless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubeplane.api.validation import VALIDATORS, extra_validators, register_extra_validator
from kubeplane.dra.validation import validate_dra

if TYPE_CHECKING:
    from kubeplane.api.errors import Cause
    from kubeplane.api.resources import ResourceInfo

#: resources (``ResourceInfo.qualified``) validated by :func:`validate_resource`
DRA_RESOURCES = (
    "deviceclasses.resource.k8s.io",
    "resourceclaims.resource.k8s.io",
    "resourceclaimtemplates.resource.k8s.io",
    "resourceslices.resource.k8s.io",
)

__all__ = ["DRA_RESOURCES", "install", "installed", "validate_resource"]


def validate_resource(res: "ResourceInfo", obj: dict[str, Any], old: dict[str, Any] | None = None) -> list["Cause"]:
    """The DRA field errors of ``obj`` (``old`` set on update) that the built-in
    checks of the resource do not already report (no duplicate causes)."""
    causes = validate_dra(res.kind, obj, old)
    if not causes:
        return causes
    _, check, update_check = VALIDATORS.get(res.qualified, (None, None, None))
    seen: set[tuple[str, str]] = set()
    for fn, args in ((check, (obj,)), (update_check if old is not None else None, (obj, old))):
        if fn is not None:
            seen.update((c.reason, c.field) for c in fn(*args))
    return [c for c in causes if (c.reason, c.field) not in seen]


def installed() -> bool:
    """Whether :func:`validate_resource` is registered for every DRA resource."""
    return all(validate_resource in extra_validators.get(q, ()) for q in DRA_RESOURCES)


def install() -> None:
    """Register :func:`validate_resource` for the DRA resources (idempotent)."""
    for qualified in DRA_RESOURCES:
        if validate_resource not in extra_validators.get(qualified, ()):
            register_extra_validator(qualified, validate_resource)
