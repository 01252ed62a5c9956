"""The admission chain: the default plugins of upstream's kube-apiserver that
kubeplane implements, under upstream's names and in upstream's order.

As upstream, a write passes the chain twice: the mutating phase
(:meth:`AdmissionChain.admit`) after the strategy has defaulted the object and
before validation, the validating phase (:meth:`AdmissionChain.validate`) after
validation, just before the object is stored. A plugin refuses a request by
raising a :class:`~kubeplane.api.errors.StatusError`.

A new plugin subclasses :class:`AdmissionPlugin`, says which requests it
handles (:meth:`AdmissionPlugin.handles`, decided on the operation and the
resource alone, so the chain can remember the answer) and overrides
:meth:`~AdmissionPlugin.admit`, :meth:`~AdmissionPlugin.validate` or both;
:func:`default_chain` lists the plugins in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.auth.user import UserInfo, current_user
from kubeplane.registry.strategies import DEFAULT_CLASS_ANNOTATION
from kubeplane.storage.interface import Store

Obj = dict[str, Any]

CREATE = "CREATE"
UPDATE = "UPDATE"
DELETE = "DELETE"

NAMESPACES = resource("namespaces")
STORAGE_CLASSES = resource("storageclasses")

#: namespaces upstream's NamespaceLifecycle admission refuses to delete
IMMORTAL_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})


@dataclass(slots=True)
class Attributes:
    """What a plugin learns of one request (upstream's admission.Attributes)."""

    operation: str
    resource: ResourceInfo
    name: str
    namespace: str | None
    #: the object being created (the plugin may change it in the mutating phase)
    obj: Obj | None = None
    #: the stored object an update or delete replaces
    old_obj: Obj | None = None
    subresource: str | None = None
    dry_run: bool = False
    #: the request's CreateOptions, UpdateOptions or DeleteOptions, when known
    options: Obj | None = None
    user: UserInfo = field(default_factory=current_user)
    #: audit annotations the plugins add: the request's admission record
    audit_annotations: dict[str, str] = field(default_factory=dict)


class AdmissionPlugin:
    """One admission plugin; the base admits everything."""

    name: ClassVar[str] = ""

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return False

    async def admit(self, attrs: Attributes) -> None:
        """Mutating phase: may change ``attrs.obj``."""

    async def validate(self, attrs: Attributes) -> None:
        """Validating phase: may only refuse."""


class NamespaceLifecycle(AdmissionPlugin):
    """Nothing is created in a namespace that is missing or terminating, and
    the namespaces the cluster needs cannot be deleted."""

    name = "NamespaceLifecycle"

    def __init__(self, store: Store) -> None:
        self.store = store

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        if operation == CREATE:
            return res.namespaced
        return operation == DELETE and res.key == NAMESPACES.key

    async def validate(self, attrs: Attributes) -> None:
        if attrs.operation == DELETE:
            if attrs.name in IMMORTAL_NAMESPACES:
                raise errors.StatusError(
                    403, "Forbidden", f'namespaces "{attrs.name}" is forbidden: this namespace may not be deleted',
                    name=attrs.name, kind="namespaces",
                )
            return
        namespace = attrs.namespace or ""
        kv = await self.store.get(NAMESPACES.storage_key(namespace))
        if kv is None:
            raise errors.not_found("namespaces", namespace)
        if (kv.value.get("metadata") or {}).get("deletionTimestamp"):
            # upstream's admission.NewForbidden: names the object being created
            res, name = attrs.resource, attrs.name
            what = f'{res.qualified} "{name}"' if name else res.qualified
            raise errors.StatusError(
                403, "Forbidden",
                f"{what} is forbidden: unable to create new content in namespace {namespace} "
                "because it is being terminated",
                name=name, group=res.group, kind=res.plural,
            )


class DefaultStorageClass(AdmissionPlugin):
    """A claim created without ``spec.storageClassName`` gets the default class."""

    name = "DefaultStorageClass"

    def __init__(self, store: Store) -> None:
        self.store = store

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return operation == CREATE and res.key == ("", "persistentvolumeclaims")

    async def admit(self, attrs: Attributes) -> None:
        spec = (attrs.obj or {}).get("spec")
        if isinstance(spec, dict) and "storageClassName" not in spec:
            default = await self.default_class()
            if default:
                spec["storageClassName"] = default

    async def default_class(self) -> str | None:
        result = await self.store.list(STORAGE_CLASSES.storage_prefix())
        best: tuple[str, str] | None = None
        for kv in result.items:
            md = kv.value.get("metadata") or {}
            if (md.get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true":
                cand = (md.get("creationTimestamp", ""), md.get("name", ""))
                # Upstream picks the newest default class when several exist.
                if best is None or cand > best:
                    best = cand
        return best[1] if best else None


class AdmissionChain:
    """The plugins in order; each phase runs those that handle the request."""

    def __init__(self, plugins: Iterable[AdmissionPlugin]) -> None:
        self.plugins = tuple(plugins)
        self._mutating = tuple(p for p in self.plugins if type(p).admit is not AdmissionPlugin.admit)
        self._validating = tuple(p for p in self.plugins if type(p).validate is not AdmissionPlugin.validate)
        self._for: dict[tuple[bool, str, tuple[str, str]], tuple[AdmissionPlugin, ...]] = {}

    def _handling(self, mutating: bool, operation: str, res: ResourceInfo) -> tuple[AdmissionPlugin, ...]:
        key = (mutating, operation, res.key)
        found = self._for.get(key)
        if found is None:
            found = self._for[key] = tuple(
                p for p in (self._mutating if mutating else self._validating) if p.handles(operation, res))
        return found

    async def admit(self, operation: str, res: ResourceInfo, name: str, namespace: str | None,
                    obj: Obj | None = None) -> None:
        plugins = self._handling(True, operation, res)
        if plugins:
            attrs = Attributes(operation, res, name, namespace, obj)
            for p in plugins:
                await p.admit(attrs)

    async def validate(self, operation: str, res: ResourceInfo, name: str, namespace: str | None,
                       obj: Obj | None = None, old: Obj | None = None, *, subresource: str | None = None,
                       dry_run: bool = False, options: Obj | None = None) -> Attributes | None:
        """Runs the validating plugins; returns the request's admission record
        (None when no plugin handles the request)."""
        plugins = self._handling(False, operation, res)
        if plugins:
            attrs = Attributes(operation, res, name, namespace, obj, old, subresource, dry_run, options)
            for p in plugins:
                await p.validate(attrs)
            return attrs
        return None

    def plugin(self, name: str) -> AdmissionPlugin | None:
        """The plugin registered under ``name`` (e.g. ``ValidatingAdmissionPolicy``)."""
        for p in self.plugins:
            if p.name == name:
                return p
        return None


def default_chain(store: Store, authorizer: Any = None) -> AdmissionChain:
    """kubeplane's default plugins, in the order of upstream's plugin list.
    ``authorizer`` answers the policies' CEL ``authorizer`` checks (AlwaysAllow
    when None; settable later as the ValidatingAdmissionPolicy plugin's
    ``authorizer``)."""
    from kubeplane.admission.policy import ValidatingAdmissionPolicyPlugin

    return AdmissionChain([
        NamespaceLifecycle(store), DefaultStorageClass(store),
        # validating, before ValidatingAdmissionWebhook
        ValidatingAdmissionPolicyPlugin(store, authorizer=authorizer),
    ])


__all__ = [
    "AdmissionChain",
    "AdmissionPlugin",
    "Attributes",
    "CREATE",
    "DELETE",
    "UPDATE",
    "DefaultStorageClass",
    "IMMORTAL_NAMESPACES",
    "NamespaceLifecycle",
    "default_chain",
]
