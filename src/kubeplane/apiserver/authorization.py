"""The authorization filter of the HTTP front end (upstream's WithAuthorization).

Every request is described as authorizer attributes (the request info of
:mod:`kubeplane.auth.requestinfo` and the request's user) and put to the
authorizer; anything but an allow is a 403 Forbidden worded as upstream's
responsewriters.Forbidden words it, with the authorizer's reason appended.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from kubeplane.api.errors import StatusError
from kubeplane.auth.authorizer import Attributes, Authorizer, Decision
from kubeplane.auth.requestinfo import RequestInfo, request_info, to_attributes
from kubeplane.auth.user import UserInfo, current_user

log = logging.getLogger("kubeplane.apiserver")


def attributes(user: UserInfo, info: RequestInfo) -> Attributes:
    return to_attributes(user, info)


def forbidden_message(attrs: Attributes) -> str:
    """Upstream's forbiddenMessage."""
    who = attrs.user.name
    if not attrs.resource_request:
        return f'User "{who}" cannot {attrs.verb} path "{attrs.path}"'
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    if attrs.namespace:
        return (f'User "{who}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" '
                f'in the namespace "{attrs.namespace}"')
    return f'User "{who}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" at the cluster scope'


def forbidden(attrs: Attributes, reason: str) -> StatusError:
    """Upstream's ForbiddenStatusError: a 403 naming the resource (and object) refused."""
    msg = forbidden_message(attrs).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if reason:
        msg = f"{msg}: {reason}"
    if not attrs.resource_request or not attrs.resource:
        return StatusError(403, "Forbidden", f"forbidden: {msg}", name="", group="", kind="")
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    what = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    return StatusError(403, "Forbidden", f"{what} is forbidden: {msg}", name=attrs.name or None,
                       group=attrs.api_group or None, kind=attrs.resource)


def check(authorizer: Authorizer, attrs: Attributes) -> None:
    """Raises the 403 unless ``authorizer`` allows ``attrs``."""
    decision, reason = authorizer.authorize(attrs)
    if decision is not Decision.ALLOW:
        raise forbidden(attrs, reason)


def authorization_middleware(authorizer: Authorizer) -> Any:
    from kubeplane.apiserver.server import status_response

    # The request info depends on the method, the path and two query
    # parameters only: remembered per distinct request (bounded), as most
    # requests repeat a few shapes (creates and lists of a collection).
    infos: dict[tuple[str, str, str | None, str | None], RequestInfo] = {}

    def info_of(request: web.Request) -> RequestInfo:
        q = request.query
        key = (request.method, request.path, q.get("watch"), q.get("fieldSelector"))
        info = infos.get(key)
        if info is None:
            info = request_info(request.method, request.path, q)
            if len(infos) >= 4096:
                infos.clear()
            infos[key] = info
        return info

    # An authorizer may answer from the request info directly (RBACAuthorizer.decide:
    # its decision cache), sparing the attributes of a request it has seen before.
    decide = getattr(authorizer, "decide", None)

    @web.middleware
    async def authorize(request: web.Request, handler):
        user = current_user()
        info = info_of(request)
        try:
            if decide is not None:
                decision, reason = decide(user, info)
            else:
                decision, reason = authorizer.authorize(to_attributes(user, info))
        except Exception as exc:  # noqa: BLE001 - an authorizer failure refuses, the server survives
            log.exception("authorizer failed on %s %s", request.method, request.path)
            decision, reason = Decision.NO_OPINION, f"authorizer error: {exc}"
        if decision is not Decision.ALLOW:
            return status_response(forbidden(to_attributes(user, info), reason))
        return await handler(request)

    return authorize
