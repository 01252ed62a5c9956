"""The user a request is made by (upstream's ``user.Info``) and the request's
current user.

The current user is a context variable: the HTTP front end sets it in its
middleware for the task that serves the request, the local wire server around
each request it starts, and tasks started while serving a request inherit it.
Code that runs outside any request (controllers in this process, start-up)
sees :data:`SYSTEM_ADMIN`, as upstream's loopback client is privileged.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping

#: groups every authenticated user belongs to, and the anonymous user's
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
#: the group RBAC's bootstrap policy binds to cluster-admin
SYSTEM_MASTERS = "system:masters"
ANONYMOUS_NAME = "system:anonymous"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
NODES_GROUP = "system:nodes"
NODE_PREFIX = "system:node:"
KUBE_SCHEDULER = "system:kube-scheduler"
KUBE_CONTROLLER_MANAGER = "system:kube-controller-manager"


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    #: extra attributes (authentication.k8s.io/credential-id, pod names of
    #: bound tokens...), each a tuple of values
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_api(self) -> dict:
        """As the ``userInfo`` of TokenReview, SelfSubjectReview and AdmissionReview."""
        out: dict = {"username": self.name}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


ANONYMOUS = UserInfo(ANONYMOUS_NAME, groups=(UNAUTHENTICATED,))
#: the identity of work done in the API server's own process outside a request
SYSTEM_ADMIN = UserInfo("system:apiserver", groups=(SYSTEM_MASTERS, AUTHENTICATED))

_current: contextvars.ContextVar[UserInfo] = contextvars.ContextVar("kubeplane_user", default=SYSTEM_ADMIN)


def current_user() -> UserInfo:
    return _current.get()


def set_current_user(user: UserInfo) -> contextvars.Token:
    return _current.set(user)


def reset_current_user(token: contextvars.Token) -> None:
    _current.reset(token)


@contextmanager
def acting_as(user: UserInfo) -> Iterator[UserInfo]:
    """``with acting_as(user):`` runs the block (and tasks it starts) as ``user``."""
    token = _current.set(user)
    try:
        yield user
    finally:
        _current.reset(token)
