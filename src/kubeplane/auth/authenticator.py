"""Authenticators (upstream's ``k8s.io/apiserver/pkg/authentication``).

A request is authenticated as upstream's kube-apiserver does it: the
authenticators are asked in upstream's order (x509 client certificate, then
the bearer token authenticators: ``--token-auth-file``, ServiceAccount
tokens) and the first to recognise the request names its user. A credential
that is presented but recognised by none (a bad or expired token) is an
error, answered 401 Unauthorized; a request with no credential at all is the
anonymous user (``system:anonymous`` in ``system:unauthenticated``) when
anonymous requests are enabled. Every other user is also put in
``system:authenticated``.

Client certificates are verified by the TLS handshake against the client CA
(Python's ``ssl`` has no "request a certificate but let me verify it" mode,
so a certificate from another CA fails the handshake rather than getting a
401); the x509 authenticator then reads the user from it (CN the name, O the
groups) and checks it is meant for client authentication.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from kubeplane.auth import jwt
from kubeplane.api.gofmt import go_list
from kubeplane.auth.user import (ANONYMOUS, AUTHENTICATED, SERVICE_ACCOUNT_PREFIX, SERVICE_ACCOUNTS_GROUP,
                                 UNAUTHENTICATED, UserInfo)

log = logging.getLogger("kubeplane.auth")

#: the issuer (and default audience) of the API server's ServiceAccount tokens
DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: the issuer of legacy (Secret-based) ServiceAccount tokens
LEGACY_ISSUER = "kubernetes/serviceaccount"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
NODE_NAME = "authentication.kubernetes.io/node-name"
NODE_UID = "authentication.kubernetes.io/node-uid"


class AuthenticationError(Exception):
    """A credential was presented and is not valid: 401 Unauthorized."""


@dataclass(frozen=True, slots=True)
class Response:
    user: UserInfo
    #: the audiences the credential is valid for (of those asked about)
    audiences: tuple[str, ...] = ()


class TokenAuthenticator(Protocol):
    async def authenticate_token(self, token: str, audiences: tuple[str, ...]) -> Response | None:
        """The user of ``token``; None when this authenticator does not know it;
        :class:`AuthenticationError` when it is its kind of token but invalid."""
        ...


# -- x509 ---------------------------------------------------------------------------

class X509Authenticator:
    """Upstream's x509 authenticator with its CommonNameUserConversion, for
    certificates the TLS handshake already verified against the client CA."""

    def __init__(self, cache_size: int = 1024) -> None:
        self._cache: OrderedDict[bytes, UserInfo | AuthenticationError] = OrderedDict()
        self._cache_size = cache_size

    def authenticate_cert(self, der: bytes, subject: Any = None) -> UserInfo:
        """The user of the client certificate ``der``. ``subject``: the
        certificate's subject as :meth:`ssl.SSLSocket.getpeercert` gives it
        for a certificate the handshake verified (which also held it to the
        clientAuth usage), read instead of parsing the certificate."""
        hit = self._cache.get(der)
        if hit is None:
            hit = self._from_subject(der, subject) if subject else self._convert(der)
            self._cache[der] = hit
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(der)
        if isinstance(hit, AuthenticationError):
            raise hit
        return hit

    @staticmethod
    def _from_subject(der: bytes, subject: Any) -> UserInfo | AuthenticationError:
        cns: list[str] = []
        orgs: list[str] = []
        try:
            for rdn in subject:
                for key, value in rdn:
                    if key == "commonName":
                        cns.append(str(value))
                    elif key == "organizationName":
                        orgs.append(str(value))
        except (TypeError, ValueError):
            return X509Authenticator._convert(der)
        name = cns[0] if cns else ""
        if not name:
            return AuthenticationError("x509: certificate has no common name")
        cid = "X509SHA256=" + hashlib.sha256(der).hexdigest()
        return UserInfo(name, groups=tuple(orgs), extra={CREDENTIAL_ID: (cid,)})

    @staticmethod
    def _convert(der: bytes) -> UserInfo | AuthenticationError:
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return AuthenticationError("x509: malformed certificate")
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            if ExtendedKeyUsageOID.CLIENT_AUTH not in usages and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in usages:
                return AuthenticationError("x509: certificate specifies an incompatible key usage")
        except x509.ExtensionNotFound:
            pass  # no restriction: any usage (as Go's verifier treats it)
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        name = str(cns[0].value) if cns else ""
        if not name:
            return AuthenticationError("x509: certificate has no common name")
        groups = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
        cid = "X509SHA256=" + hashlib.sha256(der).hexdigest()
        return UserInfo(name, groups=groups, extra={CREDENTIAL_ID: (cid,)})


# -- --token-auth-file -----------------------------------------------------------------

class TokenFileAuthenticator:
    """Upstream's static token file: CSV lines ``token,user,uid[,"group1,group2"]``."""

    def __init__(self, tokens: dict[str, UserInfo]) -> None:
        self.tokens = tokens

    @classmethod
    def from_file(cls, path: str) -> "TokenFileAuthenticator":
        tokens: dict[str, UserInfo] = {}
        with open(path, newline="", encoding="utf-8") as f:
            import csv

            for lineno, record in enumerate(csv.reader(f), 1):
                if not record or (len(record) == 1 and not record[0].strip()):
                    continue
                if len(record) < 3:
                    raise ValueError(f"token file '{path}' must have at least 3 columns (token, user name, "
                                     f"user uid), found {len(record)}")
                token = record[0].strip()
                if not token:
                    log.warning("empty token has been found in token file '%s', line %d", path, lineno)
                    continue
                groups: tuple[str, ...] = ()
                if len(record) >= 4 and record[3]:
                    groups = tuple(g.strip() for g in record[3].split(",") if g.strip())
                if token in tokens:
                    log.warning("duplicate token has been found in token file '%s', line %d", path, lineno)
                tokens[token] = UserInfo(record[1], uid=record[2], groups=groups)
        return cls(tokens)

    async def authenticate_token(self, token: str, audiences: tuple[str, ...]) -> Response | None:
        user = self.tokens.get(token)
        return Response(user) if user is not None else None


# -- ServiceAccount tokens -----------------------------------------------------------------

#: ``await getter(plural, name, namespace)``: the object or None
ObjectGetter = Callable[[str, str, "str | None"], Awaitable["dict | None"]]


@dataclass
class ServiceAccountTokenAuthenticator:
    """Validates ServiceAccount JWTs: signature by one of ``keys``, issuer,
    audience, expiry, and that the ServiceAccount (and the Pod, Secret or Node
    a bound token names) still exists with the same uid."""

    #: the verifying keys, or a function that loads them (called once, on first use)
    keys: list[Any] | Callable[[], list[Any]]
    get: ObjectGetter
    issuers: tuple[str, ...] = (DEFAULT_ISSUER,)
    #: the API server's audiences, for tokens presented to it
    api_audiences: tuple[str, ...] = (DEFAULT_ISSUER,)
    #: accept legacy (Secret-based) tokens
    legacy: bool = True
    clock: Callable[[], float] = field(default=time.time)

    def _keys(self) -> list[Any]:
        if callable(self.keys):
            self.keys = list(self.keys())
        return self.keys

    async def authenticate_token(self, token: str, audiences: tuple[str, ...]) -> Response | None:
        if not jwt.looks_like_jwt(token):
            return None
        try:
            _, claims = jwt.unverified(token)
        except jwt.JWTError:
            return None
        iss = claims.get("iss")
        if iss == LEGACY_ISSUER and self.legacy:
            return await self._legacy(token)
        if iss not in self.issuers:
            return None  # someone else's token
        try:
            claims = jwt.verify(token, self._keys())
        except jwt.JWTError as exc:
            raise AuthenticationError(f"square/go-jose: error in cryptographic primitive: {exc}") from None
        now = self.clock()
        leeway = 60.0
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if not isinstance(exp, (int, float)) or now > exp + leeway:
            raise AuthenticationError("service account token has expired")
        if isinstance(nbf, (int, float)) and now < nbf - leeway:
            raise AuthenticationError("service account token is not valid yet")
        aud = claims.get("aud")
        token_auds = (aud,) if isinstance(aud, str) else tuple(a for a in aud or () if isinstance(a, str))
        wanted = audiences or self.api_audiences
        matched = tuple(a for a in wanted if a in token_auds)
        if not matched:
            raise AuthenticationError("token audiences " + go_list(token_auds) + " is invalid for the target "
                                      "audiences " + go_list(wanted))
        k8s = claims.get("kubernetes.io")
        if not isinstance(k8s, dict):
            raise AuthenticationError("service account token claims are missing kubernetes.io")
        ns = k8s.get("namespace")
        sa = _ref(k8s.get("serviceaccount"))
        if not isinstance(ns, str) or not ns or sa is None:
            raise AuthenticationError("service account token claims are missing the namespace or serviceaccount")
        sub = claims.get("sub")
        if sub != SERVICE_ACCOUNT_PREFIX + f"{ns}:{sa[0]}":
            raise AuthenticationError("service account token has an invalid subject")
        sa_obj = await self._existing("serviceaccounts", sa, ns, "service account")
        extra: dict[str, tuple[str, ...]] = {}
        pod = _ref(k8s.get("pod"))
        if pod is not None:
            await self._existing("pods", pod, ns, "pod")
            extra[POD_NAME], extra[POD_UID] = (pod[0],), (pod[1],)
        secret = _ref(k8s.get("secret"))
        if secret is not None:
            await self._existing("secrets", secret, ns, "secret")
        node = _ref(k8s.get("node"))
        if node is not None:
            await self._existing("nodes", node, None, "node")
            extra[NODE_NAME], extra[NODE_UID] = (node[0],), (node[1],)
        jti = claims.get("jti")
        if isinstance(jti, str) and jti:
            extra[CREDENTIAL_ID] = ("JTI=" + jti,)
        user = UserInfo(SERVICE_ACCOUNT_PREFIX + f"{ns}:{sa[0]}", uid=sa_obj["metadata"].get("uid", ""),
                        groups=(SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{ns}"), extra=extra)
        return Response(user, matched)

    async def _existing(self, plural: str, ref: tuple[str, str], namespace: str | None, what: str) -> dict:
        name, uid = ref
        obj = await self.get(plural, name, namespace)
        where = f"{namespace}/{name}" if namespace else name
        if obj is None:
            raise AuthenticationError(f"{what} {where} has been deleted")
        have = (obj.get("metadata") or {}).get("uid", "")
        if uid and have != uid:
            raise AuthenticationError(f"{what} UID ({have}) does not match claim ({uid})")
        if plural != "serviceaccounts" and (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise AuthenticationError(f"{what} {where} is being deleted")
        return obj

    async def _legacy(self, token: str) -> Response:
        import base64

        try:
            claims = jwt.verify(token, self._keys())
        except jwt.JWTError as exc:
            raise AuthenticationError(f"square/go-jose: error in cryptographic primitive: {exc}") from None
        ns = claims.get("kubernetes.io/serviceaccount/namespace")
        secret = claims.get("kubernetes.io/serviceaccount/secret.name")
        sa_name = claims.get("kubernetes.io/serviceaccount/service-account.name")
        sa_uid = claims.get("kubernetes.io/serviceaccount/service-account.uid") or ""
        if not all(isinstance(v, str) and v for v in (ns, secret, sa_name)):
            raise AuthenticationError("service account token claims are incomplete")
        sa_obj = await self._existing("serviceaccounts", (sa_name, sa_uid), ns, "service account")
        secret_obj = await self.get("secrets", secret, ns)
        if secret_obj is None:
            raise AuthenticationError(f"secret {ns}/{secret} has been deleted")
        stored = (secret_obj.get("data") or {}).get("token") or ""
        try:
            stored_token = base64.b64decode(stored).decode()
        except (ValueError, UnicodeDecodeError):
            stored_token = ""
        if stored_token != token:
            raise AuthenticationError("token does not match the one in its secret")
        cid = "JTI=" + claims["jti"] if isinstance(claims.get("jti"), str) and claims.get("jti") else ""
        extra = {CREDENTIAL_ID: (cid,)} if cid else {}
        user = UserInfo(SERVICE_ACCOUNT_PREFIX + f"{ns}:{sa_name}", uid=sa_obj["metadata"].get("uid", ""),
                        groups=(SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{ns}"), extra=extra)
        return Response(user, self.api_audiences)


def _ref(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, dict):
        return None
    name, uid = value.get("name"), value.get("uid", "")
    if not isinstance(name, str) or not name or not isinstance(uid, str):
        return None
    return name, uid


# -- the union ---------------------------------------------------------------------------

def with_authenticated_group(user: UserInfo) -> UserInfo:
    """Upstream's AuthenticatedGroupAdder."""
    if user.name == ANONYMOUS.name or AUTHENTICATED in user.groups or UNAUTHENTICATED in user.groups:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED), user.extra)


@dataclass
class RequestAuthenticator:
    """The API server's authenticators, in upstream's order, with anonymous last."""

    x509: X509Authenticator | None = None
    tokens: list[TokenAuthenticator] = field(default_factory=list)
    anonymous: bool = True
    api_audiences: tuple[str, ...] = (DEFAULT_ISSUER,)

    async def authenticate(self, peer_cert: bytes | None, authorization: str | None,
                           peer_subject: Any = None) -> UserInfo:
        """The request's user; raises :class:`AuthenticationError` (401).
        ``peer_subject``: the verified client certificate's subject, as
        :meth:`ssl.SSLSocket.getpeercert` gives it."""
        errors: list[str] = []
        if peer_cert is not None and self.x509 is not None:
            try:
                return with_authenticated_group(self.x509.authenticate_cert(peer_cert, peer_subject))
            except AuthenticationError as exc:
                errors.append(str(exc))
        token = bearer_token(authorization)
        if token is not None:
            try:
                resp = await self.authenticate_token(token, self.api_audiences)
            except AuthenticationError as exc:
                errors.append(str(exc))
            else:
                if resp is not None:
                    return resp.user
                errors.append("invalid bearer token")
        if errors:
            raise AuthenticationError("; ".join(errors))
        if not self.anonymous:
            raise AuthenticationError("no credentials")
        return ANONYMOUS

    async def authenticate_token(self, token: str, audiences: tuple[str, ...]) -> Response | None:
        """The bearer token authenticators' union (TokenReview asks it too)."""
        errors: list[str] = []
        for auth in self.tokens:
            try:
                resp = await auth.authenticate_token(token, audiences)
            except AuthenticationError as exc:
                errors.append(str(exc))
                continue
            if resp is not None:
                return Response(with_authenticated_group(resp.user), resp.audiences or audiences)
        if errors:
            raise AuthenticationError("[" + ", ".join(errors) + "]" if len(errors) > 1 else errors[0])
        return None


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, as upstream reads it."""
    if not header:
        return None
    parts = header.strip().split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]
