"""Errors as values: every failure a user can cause is a Kubernetes ``Status``.

The API server turns a :class:`StatusError` into the HTTP reply as is; the
in-process client raises the same exception, so callers handle one type
whichever transport they use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Cause:
    """One field-level problem, as in ``details.causes`` of a Status."""

    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueForbidden, ...
    message: str
    field: str

    def to_dict(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.reason:  # omitempty upstream (admission denials carry a message only)
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        if self.field:  # upstream omits an empty field
            out["field"] = self.field
        return out


class StatusError(Exception):
    """An API error carrying everything needed to build a ``Status`` object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        name: str | None = None,
        group: str | None = None,
        kind: str | None = None,
        uid: str | None = None,
        causes: list[Cause] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.name = name
        self.group = group
        self.kind = kind
        self.uid = uid
        self.causes = causes or []
        self.retry_after = retry_after

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
        }
        # metav1.Status's message, reason and code are omitempty: an empty
        # one is left out rather than written as "" or 0.
        if self.message:
            status["message"] = self.message
        if self.reason:
            status["reason"] = self.reason
        if self.code:
            status["code"] = self.code
        # Upstream's StatusDetails has only omitempty fields: an empty group
        # (the core group) is left out, and an error that names no object
        # still carries ``details: {}``, which clients dereference (kubectl
        # debug reads details.name of a 404 and crashes without it).
        details: dict[str, Any] = {}
        for key, value in (("name", self.name), ("group", self.group), ("kind", self.kind), ("uid", self.uid)):
            if value:
                details[key] = value
        if self.causes:
            details["causes"] = [c.to_dict() for c in self.causes]
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        has_details = details or any(v is not None for v in (self.name, self.group, self.kind, self.uid))
        if has_details:
            status["details"] = details
        return status

    @classmethod
    def from_status(cls, status: dict[str, Any], http_code: int | None = None) -> "StatusError":
        """Rebuild the error from a Status received over the wire."""
        details = status.get("details") or {}
        causes = [
            Cause(c.get("reason", ""), c.get("message", ""), c.get("field", ""))
            for c in details.get("causes") or []
        ]
        return cls(
            int(status.get("code") or http_code or 500),
            status.get("reason") or "",
            status.get("message") or "",
            name=details.get("name"),
            group=details.get("group"),
            kind=details.get("kind"),
            uid=details.get("uid"),
            causes=causes,
            retry_after=details.get("retryAfterSeconds"),
        )

    def __repr__(self) -> str:
        return f"StatusError({self.code}, {self.reason!r}, {self.message!r})"


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        404, "NotFound", f'{_qualified(resource, group)} "{name}" not found',
        name=name, group=group, kind=resource,
    )


def route_not_found() -> StatusError:
    """The 404 for a path no route serves (upstream's generic server response:
    its details are present and empty)."""
    return StatusError(404, "NotFound", "the server could not find the requested resource",
                       name="", group="", kind="")


def already_exists(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        409, "AlreadyExists", f'{_qualified(resource, group)} "{name}" already exists',
        name=name, group=group, kind=resource,
    )


def conflict(resource: str, name: str, group: str = "", detail: str | None = None) -> StatusError:
    detail = detail or (
        "the object has been modified; please apply your changes to the latest version and try again"
    )
    return StatusError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {detail}',
        name=name, group=group, kind=resource,
    )


# metav1.GroupName: the group upstream names ListOptions and DeleteOptions in.
META_GROUP = "meta.k8s.io"


def qualified_kind(kind: str, group: str = "") -> str:
    """schema.GroupKind.String(): ``Deployment.apps``, bare for the core group."""
    return f"{kind}.{group}" if group else kind


def invalid(kind: str, name: str, causes: list[Cause], group: str = "") -> StatusError:
    """422 Invalid, as upstream's NewInvalid: the message names the
    group-qualified kind (``Deployment.apps "x" is invalid: ...``, core kinds
    bare); ``details.kind`` is the bare Kind and ``details.group`` the group."""
    if not causes:
        return StatusError(422, "Invalid", f'{qualified_kind(kind, group)} "{name}" is invalid',
                           name=name, group=group, kind=kind)
    if len(causes) == 1:
        summary = f"{causes[0].field}: {causes[0].message}"
    else:
        summary = "[" + ", ".join(f"{c.field}: {c.message}" for c in causes) + "]"
    return StatusError(
        422, "Invalid", f'{qualified_kind(kind, group)} "{name}" is invalid: {summary}',
        name=name, group=group, kind=kind, causes=causes,
    )


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def gone(message: str) -> StatusError:
    return StatusError(410, "Expired", message)


def method_not_allowed(message: str) -> StatusError:
    return StatusError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> StatusError:
    return StatusError(
        415, "UnsupportedMediaType",
        f'the body of the request was in an unknown format - accepted media types include: '
        f'{", ".join(accepted)}',
    )


def too_large(limit: int) -> StatusError:
    return StatusError(413, "RequestEntityTooLarge", f"the request body exceeds the limit of {limit} bytes")


def too_large_body(limit: int, how: str) -> StatusError:
    return StatusError(413, "RequestEntityTooLarge", f"the request body exceeds the limit of {limit} bytes {how}")


def timeout(message: str, retry_after: int | None = None) -> StatusError:
    """Upstream's NewTimeoutError: 504, reason Timeout, the message prefixed."""
    return StatusError(504, "Timeout", f"Timeout: {message}", retry_after=retry_after)


def too_large_resource_version(requested: int, current: int, retry_after: int | None = 1) -> StatusError:
    """A request for a revision the server has not reached (upstream's
    NewTooLargeResourceVersionError)."""
    err = timeout(f"Too large resource version: {requested}, current: {current}", retry_after)
    err.causes.append(Cause("ResourceVersionTooLarge", "Too large resource version", ""))
    return err


def internal(message: str) -> StatusError:
    return StatusError(500, "InternalError", message)


def forbidden(message: str) -> StatusError:
    return StatusError(403, "Forbidden", message)


def unauthorized() -> StatusError:
    return StatusError(401, "Unauthorized", "Unauthorized")


# Field errors: upstream's field.Error vocabulary. Every "Invalid value",
# "Duplicate value", ... message of the project is built here, so a bad value
# is printed one way everywhere.

def go_repr(value: Any) -> str:
    """A bad value as upstream's field.Error prints it: strings quoted (``%q``),
    numbers and booleans bare (``%v``), ``null`` for nil, string maps and
    string slices as Go literals (``%#v``), other objects as compact JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        inner = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in sorted(value.items()))
        return "map[string]string{" + inner + "}"
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "[]string{" + ", ".join(json.dumps(v) for v in value) + "}"
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=False)
    except (TypeError, ValueError):
        return json.dumps(str(value))


def required(path: str, detail: str = "") -> Cause:
    """``Required value`` (``Required value: <detail>`` with a detail)."""
    return Cause("FieldValueRequired", f"Required value: {detail}" if detail else "Required value", path)


def invalid_value(path: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {go_repr(value)}: {detail}", path)


def forbidden_field(path: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", f"Forbidden: {detail}", path)


def not_supported(path: str, value: Any, allowed: Iterable[str]) -> Cause:
    quoted = ", ".join(f'"{a}"' for a in allowed)
    return Cause(
        "FieldValueNotSupported",
        f"Unsupported value: {go_repr(value)}: supported values: {quoted}",
        path,
    )


def duplicate(path: str, value: Any, detail: str = "") -> Cause:
    msg = f"Duplicate value: {go_repr(value)}"
    return Cause("FieldValueDuplicate", f"{msg}: {detail}" if detail else msg, path)


def field_not_found(path: str, value: Any) -> Cause:
    return Cause("FieldValueNotFound", f"Not found: {go_repr(value)}", path)


def too_long(path: str, value: Any, limit: int) -> Cause:
    return Cause("FieldValueTooLong", f"Too long: may not be more than {limit} bytes", path)


def too_many(path: str, count: int, limit: int) -> Cause:
    return Cause("FieldValueTooMany", f"Too many: {count}: must have at most {limit} items", path)
