"""Authentication and impersonation filters of the HTTP front end, and the
authentication.k8s.io endpoints (TokenReview, SelfSubjectReview) and
``serviceaccounts/<name>/token`` (TokenRequest).

As upstream's filter chain: authentication names the user of every request
(401 for a bad credential), then impersonation (``Impersonate-*`` headers)
replaces it when the authorizer allows the ``impersonate`` verb, and the
request runs with :func:`kubeplane.auth.user.current_user` set to the result.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import orjson
from aiohttp import web

from kubeplane.api import errors
from kubeplane.api.meta import format_timestamp
from kubeplane.auth.authenticator import AuthenticationError, RequestAuthenticator
from kubeplane.auth.authorizer import AlwaysAllow, Attributes, Authorizer, Decision
from kubeplane.auth.user import (ANONYMOUS_NAME, AUTHENTICATED, SERVICE_ACCOUNT_PREFIX, SERVICE_ACCOUNTS_GROUP,
                                 UNAUTHENTICATED, UserInfo, reset_current_user, set_current_user)

log = logging.getLogger("kubeplane.apiserver")

#: set on a request once authenticated: the user it was authenticated as
#: (before impersonation)
AUTHENTICATED_USER: "web.RequestKey[UserInfo]" = web.RequestKey("authenticated_user", UserInfo)

IMPERSONATE_USER = "Impersonate-User"
IMPERSONATE_GROUP = "Impersonate-Group"
IMPERSONATE_UID = "Impersonate-Uid"
IMPERSONATE_EXTRA = "impersonate-extra-"


def _status(err: errors.StatusError) -> web.Response:
    return web.Response(body=orjson.dumps(err.to_status()), status=err.code,
                        headers={"Content-Type": "application/json"})


def peer_certificate(request: web.BaseRequest) -> tuple[bytes | None, Any]:
    """The client certificate (DER) and, when the handshake verified it, its
    subject as :meth:`ssl.SSLSocket.getpeercert` gives it."""
    transport = request.transport
    if transport is None:
        return None, None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None, None
    try:
        der = ssl_object.getpeercert(binary_form=True)
        return der, (ssl_object.getpeercert() or {}).get("subject") if der is not None else None
    except ValueError:  # handshake not done
        return None, None


def authentication_middleware(authenticator: RequestAuthenticator, authorizer: Authorizer | None = None) -> Any:
    """Authentication then impersonation, setting the request's current user."""
    authz = authorizer or AlwaysAllow()

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            der, subject = peer_certificate(request)
            user = await authenticator.authenticate(der, request.headers.get("Authorization"), subject)
        except AuthenticationError as exc:
            log.debug("unable to authenticate the request to %s: %s", request.path, exc)
            return _status(errors.unauthorized())
        request[AUTHENTICATED_USER] = user
        if any(h in request.headers for h in (IMPERSONATE_USER, IMPERSONATE_GROUP, IMPERSONATE_UID)) or any(
                k.lower().startswith(IMPERSONATE_EXTRA) for k in request.headers):
            try:
                user = impersonate(request, user, authz)
            except errors.StatusError as err:
                return _status(err)
        token = set_current_user(user)
        try:
            return await handler(request)
        finally:
            reset_current_user(token)

    return middleware


def impersonate(request: web.BaseRequest, requester: UserInfo, authorizer: Authorizer) -> UserInfo:
    """Upstream's WithImpersonation: each impersonated value is checked with
    the authorizer (verb ``impersonate``); 403 when one is refused."""
    headers = request.headers
    user = headers.get(IMPERSONATE_USER, "")
    groups = [g for g in headers.getall(IMPERSONATE_GROUP, [])]
    uid = headers.get(IMPERSONATE_UID, "")
    extra: dict[str, list[str]] = {}
    for k, v in headers.items():
        if k.lower().startswith(IMPERSONATE_EXTRA):
            key = urllib.parse.unquote(k[len(IMPERSONATE_EXTRA):]).lower()
            extra.setdefault(key, []).append(v)
    if not user:
        asked = [f"{IMPERSONATE_GROUP}={g}" for g in groups] + [f"{IMPERSONATE_EXTRA}{k}={v}"
                                                               for k, vs in extra.items() for v in vs]
        if uid:
            asked.append(f"{IMPERSONATE_UID}={uid}")
        raise errors.internal(f'Internal error occurred: requested [{" ".join(asked)}] without impersonating a '
                              f'user')
    return impersonated_user(requester, authorizer, user, groups, uid, extra)


def impersonated_user(requester: UserInfo, authorizer: Authorizer, user: str, groups: list[str], uid: str = "",
                      extra: dict[str, list[str]] | None = None) -> UserInfo:
    """The user ``requester`` asks to act as, once the authorizer allowed the
    ``impersonate`` verb on each value (the user or ServiceAccount, every
    group, extra and uid); 403 for the first one refused. Shared by the HTTP
    filter and the local wire, so both check the same things."""
    extra = extra or {}
    groups = list(groups)
    checks: list[tuple[Attributes, str, str]] = []  # attributes, name for the message, resource
    username = user
    sa_groups: list[str] = []
    if user.startswith(SERVICE_ACCOUNT_PREFIX) and user.count(":") == 3:
        ns, name = user[len(SERVICE_ACCOUNT_PREFIX):].split(":", 1)
        checks.append((Attributes(requester, "impersonate", namespace=ns, resource="serviceaccounts", name=name,
                                  api_version="v1"), name, "serviceaccounts"))
        if not groups:
            sa_groups = [SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{ns}"]
    else:
        checks.append((Attributes(requester, "impersonate", resource="users", name=user, api_version="v1"),
                       user, "users"))
    for g in groups:
        checks.append((Attributes(requester, "impersonate", resource="groups", name=g, api_version="v1"), g, "groups"))
    for key, values in extra.items():
        for v in values:
            checks.append((Attributes(requester, "impersonate", api_group="authentication.k8s.io", api_version="v1",
                                      resource="userextras", subresource=key, name=v), v, "userextras"))
    if uid:
        checks.append((Attributes(requester, "impersonate", api_group="authentication.k8s.io", api_version="v1",
                                  resource="uids", name=uid), uid, "uids"))
    for attrs, name, resource in checks:
        decision, reason = authorizer.authorize(attrs)
        if decision != Decision.ALLOW:
            raise forbidden(attrs, reason)

    all_groups = list(groups) or sa_groups
    if username == ANONYMOUS_NAME:
        if UNAUTHENTICATED not in all_groups:
            all_groups.append(UNAUTHENTICATED)
    elif AUTHENTICATED not in all_groups:
        all_groups.append(AUTHENTICATED)
    return UserInfo(username, uid=uid, groups=tuple(all_groups), extra={k: tuple(v) for k, v in extra.items()})


def forbidden(attrs: Attributes, reason: str = "") -> errors.StatusError:
    """Upstream's responsewriters.Forbidden for a resource request."""
    resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    msg = (f'User "{attrs.user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" '
           f'{scope}')
    if reason:
        msg += ": " + reason
    qualified = f"{resource}.{attrs.api_group}" if attrs.api_group else resource
    text = f'{qualified} "{attrs.name}" is forbidden: {msg}' if attrs.name else f"{qualified} is forbidden: {msg}"
    return errors.StatusError(403, "Forbidden", text, name=attrs.name, group=attrs.api_group, kind=resource)


# -- authentication.k8s.io endpoints ----------------------------------------------------

def self_subject_review(body: Any, user: UserInfo) -> dict:
    _check_review_body(body, "SelfSubjectReview")
    md = (body or {}).get("metadata") or {}
    return {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None, **({"name": md["name"]} if md.get("name") else {})},
            "status": {"userInfo": user.to_api()}}


async def token_review(body: Any, authenticator: RequestAuthenticator | None) -> dict:
    _check_review_body(body, "TokenReview")
    spec = body.get("spec") or {}
    if not isinstance(spec, dict):
        raise errors.bad_request("spec must be an object")
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise errors.invalid("TokenReview", "", [errors.required("spec.token")], group="authentication.k8s.io")
    auds = spec.get("audiences") or []
    if not isinstance(auds, list) or not all(isinstance(a, str) for a in auds):
        raise errors.bad_request("spec.audiences must be a list of strings")
    status: dict[str, Any] = {"user": {}}
    if authenticator is None:
        status["error"] = "authentication is not enabled"
        status["authenticated"] = False
    else:
        wanted = tuple(auds) or authenticator.api_audiences
        try:
            resp = await authenticator.authenticate_token(token, wanted)
        except AuthenticationError as exc:
            status["authenticated"] = False
            status["error"] = str(exc)
        else:
            if resp is None:
                status["authenticated"] = False
                status["error"] = "invalid bearer token"
            else:
                status["authenticated"] = True
                status["user"] = resp.user.to_api()
                status["audiences"] = list(resp.audiences)  # of those asked (default: the API's)
    md = body.get("metadata") or {}
    return {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None, **({"name": md["name"]} if md.get("name") else {})},
            "spec": {**spec, **({"audiences": auds} if auds else {})}, "status": status}


def _check_review_body(body: Any, kind: str) -> None:
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a JSON object")
    api_version, k = body.get("apiVersion"), body.get("kind")
    if api_version not in (None, "", "authentication.k8s.io/v1"):
        raise errors.bad_request(f"the API version in the data ({api_version}) does not match the expected API "
                                 f"version (authentication.k8s.io/v1)")
    if k not in (None, "", kind):
        raise errors.bad_request(f"the kind in the data ({k}) does not match the expected kind ({kind})")


MIN_TOKEN_SECONDS = 600
MAX_TOKEN_SECONDS = 1 << 32
DEFAULT_TOKEN_SECONDS = 3600


async def token_request(registry: Any, catalogue: Any, issuer: Any, api_audiences: tuple[str, ...],
                        namespace: str, sa_name: str, body: Any, dry_run: bool = False) -> dict:
    """``POST serviceaccounts/<name>/token`` (upstream's TokenREST)."""
    from kubeplane.api.resources import resource

    if issuer is None:
        raise errors.StatusError(404, "NotFound", "the server could not find the requested resource")
    _check_review_body(body, "TokenRequest")
    md = body.get("metadata") or {}
    spec = body.get("spec") or {}
    if not isinstance(md, dict) or not isinstance(spec, dict):
        raise errors.bad_request("metadata and spec must be objects")
    auds = spec.get("audiences") or list(api_audiences)
    if not isinstance(auds, list) or not all(isinstance(a, str) for a in auds):
        raise errors.bad_request("spec.audiences must be a list of strings")
    seconds = spec.get("expirationSeconds", DEFAULT_TOKEN_SECONDS)
    if seconds is None:
        seconds = DEFAULT_TOKEN_SECONDS
    causes = []
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise errors.bad_request("spec.expirationSeconds must be an integer")
    if seconds < MIN_TOKEN_SECONDS:
        causes.append(errors.invalid_value("spec.expirationSeconds", seconds,
                                           "may not specify a duration less than 10 minutes"))
    elif seconds > MAX_TOKEN_SECONDS:
        causes.append(errors.invalid_value("spec.expirationSeconds", seconds,
                                           "may not specify a duration larger than 2^32 seconds"))
    if md.get("name") and md["name"] != sa_name:
        causes.append(errors.invalid_value("metadata.name", md["name"], "must match the service account name if "
                                                                        "specified"))
    if md.get("namespace") and md["namespace"] != namespace:
        causes.append(errors.invalid_value("metadata.namespace", md["namespace"],
                                           "must match the service account namespace if specified"))
    if causes:
        raise errors.invalid("TokenRequest", sa_name, causes, group="authentication.k8s.io")
    from kubeplane.registry.admission import CREATE, Attributes, operation_options

    sa_res = resource("serviceaccounts")
    restriction = registry.admission.plugin("NodeRestriction") if registry.admission is not None else None
    if restriction is not None:
        # the create of the token subresource, as NodeRestriction admits it upstream
        await restriction.admit(Attributes(CREATE, sa_res, sa_name, namespace, body, None, "token",
                                           kind=("authentication.k8s.io", "v1", "TokenRequest"), dry_run=dry_run,
                                           options=operation_options("CreateOptions", dry_run=dry_run)))

    sa = await registry.get(sa_res, sa_name, namespace)
    sa_uid = sa["metadata"].get("uid", "")
    pod = secret = node = None
    ref = spec.get("boundObjectRef")
    out_ref = None
    if ref is not None:
        if not isinstance(ref, dict):
            raise errors.bad_request("spec.boundObjectRef must be an object")
        rkind, rname, ruid = ref.get("kind"), ref.get("name"), ref.get("uid") or ""
        rav = ref.get("apiVersion") or "v1"
        plural = {"Pod": "pods", "Secret": "secrets", "Node": "nodes"}.get(rkind or "")
        if plural is None or rav != "v1":
            raise errors.bad_request(f"cannot bind token to object of type {rav}, Kind={rkind}"
                                     if rkind else "cannot bind token to object of type ")
        if not rname:
            raise errors.invalid("TokenRequest", sa_name, [errors.required("spec.boundObjectRef.name")],
                                 group="authentication.k8s.io")
        res = resource(plural)
        obj = await registry.get(res, rname, None if plural == "nodes" else namespace)
        uid = obj["metadata"].get("uid", "")
        if ruid and ruid != uid:
            raise errors.StatusError(409, "Conflict", f'the UID in the bound object reference ({ruid}) does not '
                                                      f'match the UID in record. The object might have been '
                                                      f'deleted and then recreated')
        if plural == "pods":
            pod_sa = (obj.get("spec") or {}).get("serviceAccountName") or "default"
            if pod_sa != sa_name:
                raise errors.bad_request(f'cannot bind token for serviceaccount "{sa_name}" to pod running with '
                                         f'different serviceaccount name.')
            pod = (rname, uid)
            node_name = (obj.get("spec") or {}).get("nodeName")
            if node_name:
                try:
                    n = await registry.get(resource("nodes"), node_name, None)
                    node = (node_name, n["metadata"].get("uid", ""))
                except errors.StatusError:
                    node = None
        elif plural == "secrets":
            secret = (rname, uid)
        else:
            node = (rname, uid)
        out_ref = {"kind": rkind, "apiVersion": "v1", "name": rname, "uid": uid}
    token, exp = issuer.issue(namespace, sa_name, sa_uid, auds, seconds, pod=pod, secret=secret, node=node)
    out_spec: dict[str, Any] = {"audiences": auds, "expirationSeconds": seconds, "boundObjectRef": out_ref}
    return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": sa_name, "namespace": namespace, "creationTimestamp": None},
            "spec": out_spec, "status": {"token": "" if dry_run else token, "expirationTimestamp": format_timestamp(exp)}}
