"""Bootstrap tokens (upstream's k8s.io/cluster-bootstrap and
plugin/pkg/auth/authenticator/token/bootstrap).

A bootstrap token ``<id>.<secret>`` (6 and 16 characters of ``[a-z0-9]``) is
kept in a Secret ``kube-system/bootstrap-token-<id>`` of type
``bootstrap.kubernetes.io/token`` with the keys ``token-id``,
``token-secret``, ``expiration`` (RFC 3339), ``usage-bootstrap-authentication``,
``usage-bootstrap-signing``, ``auth-extra-groups`` and ``description``. A
valid, unexpired token whose Secret allows authentication authenticates as
``system:bootstrap:<id>`` in ``system:bootstrappers`` (and its extra groups):
what a joining node uses to ask for its client certificate.

This module also holds what the token discovery of a join needs: the
detached JWS (HS256, keyed by the token secret) the bootstrap signer puts in
the ``kube-public/cluster-info`` ConfigMap, and the CA public key hash
(kubeadm's ``--discovery-token-ca-cert-hash``).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
import json
import re
import secrets as _secrets
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from kubeplane.api.meta import format_time, parse_time
from kubeplane.auth.authenticator import AuthenticationError, Response
from kubeplane.auth.user import UserInfo

SECRET_TYPE = "bootstrap.kubernetes.io/token"
SECRET_PREFIX = "bootstrap-token-"
NAMESPACE = "kube-system"
USER_PREFIX = "system:bootstrap:"
GROUP = "system:bootstrappers"
#: the ConfigMap token discovery reads (kubeadm's), and its keys
CLUSTER_INFO_NAMESPACE = "kube-public"
CLUSTER_INFO = "cluster-info"
KUBECONFIG_KEY = "kubeconfig"
JWS_KEY_PREFIX = "jws-kubeconfig-"

TOKEN_RE = re.compile(r"\A([a-z0-9]{6})\.([a-z0-9]{16})\Z")
TOKEN_ID_RE = re.compile(r"\A[a-z0-9]{6}\Z")
EXTRA_GROUP_RE = re.compile(r"\Asystem:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\Z")
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"

#: kubeadm's default token lifetime and usages
DEFAULT_TTL = _dt.timedelta(hours=24)
#: (kubeadm's system:bootstrappers:kubeadm:default-node-token; the bootstrap
#: policy binds this group to ask for and have approved a node client certificate)
DEFAULT_GROUPS = ("system:bootstrappers:kubeplane:default-node-token",)


def parse_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    m = TOKEN_RE.match(token or "")
    return (m.group(1), m.group(2)) if m else None


def generate_token() -> str:
    return ("".join(_secrets.choice(_ALPHABET) for _ in range(6)) + "."
            + "".join(_secrets.choice(_ALPHABET) for _ in range(16)))


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def secret_data(secret: dict, key: str) -> str:
    """The Secret's value at ``key`` (``data`` decoded, else ``stringData``; "" when absent or not text)."""
    data = secret.get("data") if isinstance(secret.get("data"), dict) else {}
    value = data.get(key)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return ""
    string = secret.get("stringData") if isinstance(secret.get("stringData"), dict) else {}
    v = string.get(key)
    return v if isinstance(v, str) else ""


def token_secret(token: str, *, ttl: _dt.timedelta | None = DEFAULT_TTL, description: str = "",
                 usages: tuple[str, ...] = ("authentication", "signing"),
                 groups: tuple[str, ...] = DEFAULT_GROUPS, now: _dt.datetime | None = None) -> dict:
    """The Secret that holds ``token`` (as kubeadm's ``token create`` writes it);
    ``ttl`` None or zero: the token never expires. ValueError on a bad token,
    usage or group."""
    parsed = parse_token(token)
    if parsed is None:
        raise ValueError(f'the bootstrap token "{token}" was not of the form "{TOKEN_RE.pattern[2:-2]}"')
    for usage in usages:
        if usage not in ("authentication", "signing"):
            raise ValueError(f'invalid bootstrap token usage "{usage}": valid usages are authentication, signing')
    for g in groups:
        if not EXTRA_GROUP_RE.match(g):
            raise ValueError(f'bootstrap group "{g}" is invalid (must match {EXTRA_GROUP_RE.pattern[2:-2]})')
    tid, secret = parsed
    data = {"token-id": tid, "token-secret": secret}
    if description:
        data["description"] = description
    if ttl is not None and ttl.total_seconds() > 0:
        data["expiration"] = format_time((now or _dt.datetime.now(_dt.timezone.utc)) + ttl)
    for usage in usages:
        data[f"usage-bootstrap-{usage}"] = "true"
    if groups:
        data["auth-extra-groups"] = ",".join(groups)
    return {"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
            "metadata": {"name": SECRET_PREFIX + tid, "namespace": NAMESPACE},
            "data": {k: _b64(v) for k, v in data.items()}}


def expiration(secret: dict) -> _dt.datetime | None:
    """The Secret's ``expiration`` time; None when it has none or it does not parse."""
    text = secret_data(secret, "expiration")
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None


def expired(secret: dict, now: _dt.datetime | None = None) -> bool:
    """Whether the Secret's ``expiration`` has passed (an unparsable one counts as passed)."""
    if not secret_data(secret, "expiration"):
        return False
    t = expiration(secret)
    return t is None or t <= (now or _dt.datetime.now(_dt.timezone.utc))


def secret_token(secret: dict) -> str | None:
    """The ``id.secret`` a bootstrap token Secret holds, if it is well formed."""
    tid, sec = secret_data(secret, "token-id"), secret_data(secret, "token-secret")
    token = f"{tid}.{sec}"
    return token if parse_token(token) else None


def allows(secret: dict, usage: str) -> bool:
    return secret_data(secret, f"usage-bootstrap-{usage}") == "true"


#: ``await getter(plural, name, namespace)``: the object or None
ObjectGetter = Callable[[str, str, "str | None"], Awaitable["dict | None"]]


@dataclass
class BootstrapTokenAuthenticator:
    """Upstream's bootstrap token authenticator (``--enable-bootstrap-token-auth``)."""

    get: ObjectGetter
    clock: Callable[[], _dt.datetime] = field(default=lambda: _dt.datetime.now(_dt.timezone.utc))

    async def authenticate_token(self, token: str, audiences: tuple[str, ...]) -> Response | None:
        parsed = parse_token(token)
        if parsed is None:
            return None
        tid, given = parsed
        secret = await self.get("secrets", SECRET_PREFIX + tid, NAMESPACE)
        if secret is None or (secret.get("metadata") or {}).get("deletionTimestamp"):
            return None
        if secret.get("type") != SECRET_TYPE:
            return None
        stored = secret_data(secret, "token-secret")
        if not stored or not hmac.compare_digest(stored.encode(), given.encode()):
            return None
        if secret_data(secret, "token-id") != tid:
            return None
        if expired(secret, self.clock()):
            return None
        if not allows(secret, "authentication"):
            return None
        groups = [GROUP]
        for g in secret_data(secret, "auth-extra-groups").split(","):
            g = g.strip()
            if not g:
                continue
            if not EXTRA_GROUP_RE.match(g):
                raise AuthenticationError(f"bootstrap token {tid} has an invalid auth-extra-groups entry {g!r}")
            if g not in groups:
                groups.append(g)
        return Response(UserInfo(USER_PREFIX + tid, groups=tuple(groups)), audiences)


# -- token discovery -----------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def detached_jws(content: str, token_id: str, token_secret_value: str) -> str:
    """A detached JWS (``header..signature``) of ``content``, HS256 keyed by
    the token secret, ``kid`` the token id (upstream's ComputeDetachedSignature)."""
    header = _b64url(json.dumps({"alg": "HS256", "kid": token_id}, separators=(",", ":")).encode())
    payload = _b64url(content.encode())
    sig = hmac.new(token_secret_value.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}..{_b64url(sig)}"


def verify_detached_jws(jws: str, content: str, token_id: str, token_secret_value: str) -> bool:
    parts = jws.split(".")
    if len(parts) != 3 or parts[1] != "":
        return False
    try:
        header = json.loads(_b64url_decode(parts[0]))
        sig = _b64url_decode(parts[2])
    except (ValueError, TypeError):
        return False
    if not isinstance(header, dict) or header.get("alg") != "HS256" or header.get("kid") != token_id:
        return False
    payload = _b64url(content.encode())
    want = hmac.new(token_secret_value.encode(), f"{parts[0]}.{payload}".encode(), hashlib.sha256).digest()
    return hmac.compare_digest(sig, want)


def ca_cert_hash(ca_pem: bytes | str) -> str:
    """``sha256:<hex>`` of the DER SubjectPublicKeyInfo of the (first) CA
    certificate in ``ca_pem`` (kubeadm's public key pin)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = ca_pem.encode() if isinstance(ca_pem, str) else ca_pem
    cert = x509.load_pem_x509_certificate(data)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def matches_ca_hash(ca_pem: bytes | str, pins: list[str] | tuple[str, ...]) -> bool:
    """Whether one certificate of the bundle ``ca_pem`` has one of the ``pins``."""
    data = ca_pem.encode() if isinstance(ca_pem, str) else ca_pem
    blocks = re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", data, re.S)
    have = set()
    for block in blocks:
        try:
            have.add(ca_cert_hash(block))
        except ValueError:
            continue
    return any(p.lower() in have for p in pins)


__all__ = ["BootstrapTokenAuthenticator", "ca_cert_hash", "detached_jws", "generate_token", "matches_ca_hash",
           "parse_token", "token_secret", "verify_detached_jws"]

