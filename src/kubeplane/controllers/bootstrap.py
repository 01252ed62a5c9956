"""The bootstrap signer and token cleaner controllers (upstream's
pkg/controller/bootstrap).

* The signer keeps one ``jws-kubeconfig-<token-id>`` key in
  ``kube-public/cluster-info`` per bootstrap token that may sign
  (``usage-bootstrap-signing: true``, not expired): a detached JWS of the
  ConfigMap's kubeconfig keyed by the token secret, by which a joining node
  that holds the token knows the ConfigMap comes from the real cluster.
  Signatures of tokens that are gone are removed.
* The cleaner deletes bootstrap token Secrets once they expire.
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.auth import bootstraptoken as bt
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

CONFIGMAPS = resource("configmaps")
SECRETS = resource("secrets")


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _is_token_secret(secret: Obj) -> bool:
    md = secret.get("metadata") or {}
    return secret.get("type") == bt.SECRET_TYPE and md.get("namespace") == bt.NAMESPACE


class BootstrapSigner(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 clock: Callable[[], _dt.datetime] = _utcnow, name: str = "bootstrap-signer-controller") -> None:
        super().__init__(name, client, factory)
        self.clock = clock
        self.configmaps = self.factory.informer_for(CONFIGMAPS)
        self.secrets = self.factory.informer_for(SECRETS)
        self.work = self.add_queue("cluster-info", self.sync)
        self.configmaps.add_event_handler(self._configmap, lambda _o, n: self._configmap(n), None)
        self.secrets.add_event_handler(self._secret, lambda _o, n: self._secret(n), self._secret)

    def _configmap(self, cm: Obj) -> None:
        md = cm.get("metadata") or {}
        if md.get("namespace") == bt.CLUSTER_INFO_NAMESPACE and md.get("name") == bt.CLUSTER_INFO:
            self.work.add(bt.CLUSTER_INFO)

    def _secret(self, secret: Obj) -> None:
        if _is_token_secret(secret):
            self.work.add(bt.CLUSTER_INFO)

    def signatures(self, content: str) -> dict[str, str]:
        """The signature keys cluster-info should hold for ``content``."""
        now = self.clock()
        out: dict[str, str] = {}
        next_expiry: float | None = None
        for secret in self.secrets.indexer.list():
            if not _is_token_secret(secret) or (secret.get("metadata") or {}).get("deletionTimestamp"):
                continue
            token = bt.secret_token(secret)
            if token is None or not bt.allows(secret, "signing") or bt.expired(secret, now):
                continue
            tid, sec = token.split(".")
            out[bt.JWS_KEY_PREFIX + tid] = bt.detached_jws(content, tid, sec)
            exp = bt.expiration(secret)
            if exp is not None:
                left = (exp - now).total_seconds()
                next_expiry = left if next_expiry is None else min(next_expiry, left)
        if next_expiry is not None:
            self.work.add_after(bt.CLUSTER_INFO, max(next_expiry, 0.0) + 0.5)
        return out

    async def sync(self, key: str) -> None:
        cm = self.configmaps.indexer.get_by_key(f"{bt.CLUSTER_INFO_NAMESPACE}/{bt.CLUSTER_INFO}")
        if cm is None:
            return
        data = dict(cm.get("data") or {})
        content = data.get(bt.KUBECONFIG_KEY)
        if not isinstance(content, str):
            return
        wanted = {k: v for k, v in data.items() if not k.startswith(bt.JWS_KEY_PREFIX)}
        wanted.update(self.signatures(content))
        if wanted == data:
            return
        try:
            await self.client.update(CONFIGMAPS, {**cm, "data": wanted})
        except StatusError as err:
            if err.code != 404:
                raise


class TokenCleaner(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 clock: Callable[[], _dt.datetime] = _utcnow, name: str = "token-cleaner-controller") -> None:
        super().__init__(name, client, factory)
        self.clock = clock
        self.secrets = self.factory.informer_for(SECRETS)
        self.work = self.add_queue("secret", self.sync)
        self.secrets.add_event_handler(self._enqueue, lambda _o, n: self._enqueue(n), None)

    def _enqueue(self, secret: Obj) -> None:
        if _is_token_secret(secret):
            md = secret.get("metadata") or {}
            self.work.add(f"{md.get('namespace')}/{md.get('name')}")

    async def sync(self, key: str) -> None:
        secret = self.secrets.indexer.get_by_key(key)
        if secret is None or not _is_token_secret(secret):
            return
        now = self.clock()
        if not bt.expired(secret, now):
            exp = bt.expiration(secret)
            if exp is not None:
                self.work.add_after(key, (exp - now).total_seconds() + 0.5)
            return
        md = secret.get("metadata") or {}
        log.info("deleting expired bootstrap token Secret %s", key)
        try:
            await self.client.delete(SECRETS, md.get("name", ""), md.get("namespace"),
                                     preconditions={"uid": md.get("uid")} if md.get("uid") else None)
        except StatusError as err:
            if err.code not in (404, 409):
                raise


def build_signer(client: Client, factory: SharedInformerFactory, opts: Any) -> list[Any]:
    return [BootstrapSigner(client, factory)]


def build_cleaner(client: Client, factory: SharedInformerFactory, opts: Any) -> list[Any]:
    return [TokenCleaner(client, factory)]
