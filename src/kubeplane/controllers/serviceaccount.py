"""The ServiceAccount controller and the root CA publisher, after upstream's
``pkg/controller/serviceaccount`` (kube-controller-manager's
``serviceaccount-controller``) and ``pkg/controller/certificates/rootcacertpublisher``
(``root-ca-certificate-publisher-controller``).

Both keep one object in every active namespace: the ``default``
ServiceAccount, and the ``kube-root-ca.crt`` ConfigMap holding the cluster's
CA bundle (what pods mount with their token to verify the API server). Each
watches the namespaces and its own object (by name, so only those objects are
cached), and puts the object back when it is deleted or, for the ConfigMap,
changed.
"""

from __future__ import annotations

import logging

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, meta_namespace_key
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

NAMESPACES = resource("namespaces")
SERVICE_ACCOUNTS = resource("serviceaccounts")
CONFIG_MAPS = resource("configmaps")

DEFAULT_SERVICE_ACCOUNT = "default"
ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"
ROOT_CA_KEY = "ca.crt"
#: the annotation upstream's publisher puts on the ConfigMap
DESCRIPTION_ANNOTATION = "kubernetes.io/description"
ROOT_CA_DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints "
    "such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across "
    "distributions of Kubernetes clusters.")


def _name(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _namespace(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("namespace", "")


def _active(ns: Obj | None) -> bool:
    """A namespace that exists and is not being deleted."""
    if ns is None:
        return False
    if (ns.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (ns.get("status") or {}).get("phase", "Active") != "Terminating"


class _PerNamespace(Controller):
    """Syncs a namespace when it is added or updated, and when the one object
    this controller keeps in it (named ``object_name``) changes or goes."""

    object_name = ""

    def __init__(self, name: str, client: Client, factory: SharedInformerFactory | None, res, *,
                 workers: int = 1) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.namespaces = self.factory.informer_for(NAMESPACES)
        self.objects = self.factory.informer_for(res, field_selector=f"metadata.name={self.object_name}")
        self.res = res
        self.work = self.add_queue("namespace", self.sync)
        self.namespaces.add_event_handler(self._namespace_event, lambda _old, new: self._namespace_event(new), None)
        self.objects.add_event_handler(None, self._object_updated, self._object_deleted)

    def _namespace_event(self, ns: Obj) -> None:
        if _active(ns):
            self.work.add(_name(ns))

    def _object_updated(self, old: Obj, new: Obj) -> None:
        pass

    def _object_deleted(self, obj: Obj) -> None:
        namespace, _, name = meta_namespace_key(obj).rpartition("/")
        if name == self.object_name and namespace:
            self.work.add(namespace)

    def _namespace(self, name: str) -> Obj | None:
        return self.namespaces.indexer.get_by_key(name)

    def _cached(self, namespace: str) -> Obj | None:
        return self.objects.indexer.get_by_key(f"{namespace}/{self.object_name}")

    async def _create(self, namespace: str, obj: Obj) -> None:
        try:
            await self.client.create(self.res, obj, namespace)
        except StatusError as err:
            # made meanwhile (AlreadyExists), or the namespace is going (Forbidden) or gone
            if err.code not in (404, 409) and err.reason != "Forbidden":
                raise


class ServiceAccountsController(_PerNamespace):
    """A ``default`` ServiceAccount in every active namespace."""

    object_name = DEFAULT_SERVICE_ACCOUNT

    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 name: str = "serviceaccount-controller") -> None:
        super().__init__(name, client, factory, SERVICE_ACCOUNTS)

    async def sync(self, namespace: str) -> None:
        if not _active(self._namespace(namespace)) or self._cached(namespace) is not None:
            return
        await self._create(namespace, {"apiVersion": "v1", "kind": "ServiceAccount",
                                       "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}})


class RootCACertPublisher(_PerNamespace):
    """A ``kube-root-ca.crt`` ConfigMap with the cluster's CA bundle in every
    active namespace; edits of its data or description are put back."""

    object_name = ROOT_CA_CONFIG_MAP

    def __init__(self, client: Client, ca_bundle: bytes | str, factory: SharedInformerFactory | None = None, *,
                 name: str = "root-ca-certificate-publisher") -> None:
        bundle = ca_bundle.decode() if isinstance(ca_bundle, bytes) else str(ca_bundle)
        if not bundle.strip():
            raise ValueError("the root CA publisher needs a CA bundle; none was given")
        self.ca_bundle = bundle
        super().__init__(name, client, factory, CONFIG_MAPS)

    def _object_updated(self, old: Obj, new: Obj) -> None:
        if _name(new) == self.object_name and _namespace(new) and not self._current(new):
            self.work.add(_namespace(new))

    def _config_map(self, namespace: str) -> Obj:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": namespace,
                             "annotations": {DESCRIPTION_ANNOTATION: ROOT_CA_DESCRIPTION}},
                "data": {ROOT_CA_KEY: self.ca_bundle}}

    def _current(self, cm: Obj) -> bool:
        ann = (cm.get("metadata") or {}).get("annotations") or {}
        return (cm.get("data") == {ROOT_CA_KEY: self.ca_bundle}
                and ann.get(DESCRIPTION_ANNOTATION) == ROOT_CA_DESCRIPTION)

    async def sync(self, namespace: str) -> None:
        if not _active(self._namespace(namespace)):
            return
        cached = self._cached(namespace)
        if cached is None:
            await self._create(namespace, self._config_map(namespace))
            return
        if self._current(cached):
            return
        md = dict(cached.get("metadata") or {})
        md["annotations"] = {**(md.get("annotations") or {}), DESCRIPTION_ANNOTATION: ROOT_CA_DESCRIPTION}
        # the whole data is replaced, as upstream does; binaryData goes too
        new = {k: v for k, v in cached.items() if k not in ("data", "binaryData", "metadata")}
        new["metadata"] = md
        new["data"] = {ROOT_CA_KEY: self.ca_bundle}
        try:
            await self.client.update(CONFIG_MAPS, new)
        except StatusError as err:
            if err.code != 404:
                raise  # a conflict is retried with the newer object from the informer
            await self._create(namespace, self._config_map(namespace))
