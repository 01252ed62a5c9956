"""ServiceAccount tokens: issuing bound tokens (TokenRequest) as upstream's
``serviceaccount.JWTTokenGenerator`` does."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.auth import jwt
from kubeplane.auth.authenticator import DEFAULT_ISSUER
from kubeplane.auth.user import SERVICE_ACCOUNT_PREFIX


@dataclass
class TokenIssuer:
    #: the signing key, or a function that loads it (called once, on first use)
    key: Any
    issuer: str = DEFAULT_ISSUER
    clock: Callable[[], float] = field(default=time.time)

    def signing_key(self) -> Any:
        if callable(self.key):
            self.key = self.key()
        return self.key

    def issue(self, namespace: str, sa_name: str, sa_uid: str, audiences: list[str], expiration_seconds: int,
              *, pod: tuple[str, str] | None = None, secret: tuple[str, str] | None = None,
              node: tuple[str, str] | None = None) -> tuple[str, int]:
        """A signed token and its expiry (Unix seconds)."""
        now = int(self.clock())
        exp = now + int(expiration_seconds)
        k8s: dict[str, Any] = {"namespace": namespace, "serviceaccount": {"name": sa_name, "uid": sa_uid}}
        if pod is not None:
            k8s["pod"] = {"name": pod[0], "uid": pod[1]}
        if secret is not None:
            k8s["secret"] = {"name": secret[0], "uid": secret[1]}
        if node is not None:
            k8s["node"] = {"name": node[0], "uid": node[1]}
        claims = {
            "aud": list(audiences), "exp": exp, "iat": now, "iss": self.issuer, "jti": str(uuid.uuid4()),
            "kubernetes.io": k8s, "nbf": now, "sub": f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{sa_name}",
        }
        return jwt.sign(claims, self.signing_key()), exp

    def legacy(self, namespace: str, sa_name: str, sa_uid: str, secret_name: str) -> str:
        """A legacy (Secret-based, non-expiring) token, as the old token controller made them."""
        claims = {
            "iss": "kubernetes/serviceaccount",
            "kubernetes.io/serviceaccount/namespace": namespace,
            "kubernetes.io/serviceaccount/secret.name": secret_name,
            "kubernetes.io/serviceaccount/service-account.name": sa_name,
            "kubernetes.io/serviceaccount/service-account.uid": sa_uid,
            "sub": f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{sa_name}",
        }
        return jwt.sign(claims, self.signing_key())
