"""The authorizer interface (upstream's ``authorizer.Authorizer``).

An authorizer answers one question about one request's attributes: allow,
deny, or no opinion (the next authorizer of a union decides). The API server
asks it for every request once authentication has named the user; the
SubjectAccessReview kinds ask it on a client's behalf.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from kubeplane.auth.user import UserInfo


class Decision(enum.Enum):
    DENY = 0
    ALLOW = 1
    NO_OPINION = 2


@dataclass(frozen=True, slots=True)
class Attributes:
    """What is being asked (upstream's ``authorizer.AttributesRecord``)."""

    user: UserInfo
    verb: str
    #: a request for a resource (``/api``, ``/apis`` paths naming a resource)
    #: rather than a non-resource URL (``/healthz``, ``/version``, discovery roots)
    resource_request: bool = True
    namespace: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    #: the URL path of a non-resource request
    path: str = ""
    #: the field selector of a list, watch or deletecollection ("" : none);
    #: the Node authorizer reads it (``spec.nodeName=<node>``)
    field_selector: str = ""


class Authorizer(Protocol):
    def authorize(self, attrs: Attributes) -> tuple[Decision, str]:
        """The decision and, for a denial or no opinion, the reason (may be empty)."""
        ...


class AlwaysAllow:
    """Allows everything (upstream's ``--authorization-mode=AlwaysAllow``)."""

    def authorize(self, attrs: Attributes) -> tuple[Decision, str]:
        return Decision.ALLOW, ""
