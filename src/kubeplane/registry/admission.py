"""The admission chain: the default plugins of upstream's kube-apiserver that
kubeplane implements, under upstream's names and in upstream's order.

As upstream, a write passes the chain twice: the mutating phase
(:meth:`AdmissionChain.admit`) after the strategy has defaulted the object and
before validation, the validating phase (:meth:`AdmissionChain.validate`) after
validation, just before the object is stored. A plugin refuses a request by
raising a :class:`~kubeplane.api.errors.StatusError`.

Every write path of the registry builds one :class:`Attributes` (upstream's
``admission.Attributes``): the operation (CREATE, UPDATE, DELETE, CONNECT),
the resource and subresource, the kind, name and namespace, the object and the
old object, dryRun, the operation's options (CreateOptions, UpdateOptions,
DeleteOptions as upstream sends them) and the user
(:func:`kubeplane.auth.user.current_user`). The order of :func:`default_chain`:

1. mutating built-ins (NamespaceLifecycle, DefaultStorageClass, ...), then
   MutatingAdmissionWebhook; when a webhook changed the object and a webhook
   with ``reinvocationPolicy: IfNeeded`` ran before it, the whole mutating
   phase runs once more (upstream's reinvoker: built-ins again, and the
   webhooks that asked for it);
2. schema and strategy validation (the registry);
3. validating built-ins, ValidatingAdmissionPolicy (a plugin added to the
   chain by its module, see :data:`VALIDATING_POLICY_SLOT`), then
   ValidatingAdmissionWebhook.

A new plugin subclasses :class:`AdmissionPlugin`, says which requests it
handles (:meth:`AdmissionPlugin.handles`, decided on the operation and the
resource alone, so the chain can remember the answer) and overrides
:meth:`~AdmissionPlugin.admit`, :meth:`~AdmissionPlugin.validate` or both.
Warnings for the client go through :func:`kubeplane.api.warnings.add_warning`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.auth.user import UserInfo, current_user
from kubeplane.registry.strategies import DEFAULT_CLASS_ANNOTATION
from kubeplane.storage.interface import Store

Obj = dict[str, Any]

CREATE = "CREATE"
UPDATE = "UPDATE"
DELETE = "DELETE"
CONNECT = "CONNECT"

NAMESPACES = resource("namespaces")
STORAGE_CLASSES = resource("storageclasses")

#: namespaces upstream's NamespaceLifecycle admission refuses to delete
IMMORTAL_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})

#: the kinds of subresources whose admission object is not the resource's own
SUBRESOURCE_KINDS: dict[str, tuple[str, str, str]] = {
    "scale": ("autoscaling", "v1", "Scale"),
    "binding": ("", "v1", "Binding"),
}


def operation_options(kind: str, *, dry_run: bool = False, field_manager: str | None = None,
                      **fields: Any) -> Obj:
    """The options object of an admission request (``CreateOptions``,
    ``UpdateOptions``, ``DeleteOptions``) as upstream serialises it: a patch is
    admitted with the UpdateOptions (or CreateOptions) its PatchOptions become."""
    out: Obj = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if dry_run:
        out["dryRun"] = ["All"]
    if field_manager:
        out["fieldManager"] = field_manager
    for k, v in fields.items():
        if v is not None:
            out[k] = v
    return out


@dataclass(slots=True)
class ReinvocationContext:
    """Upstream's admission.ReinvocationContext: set when a mutation asks for
    the mutating phase to run again, and per-plugin state kept across runs."""

    should_reinvoke: bool = False
    is_reinvoke: bool = False
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Attributes:
    """What a plugin learns of one request (upstream's admission.Attributes)."""

    operation: str
    resource: ResourceInfo
    name: str
    namespace: str | None
    #: the object being written (a plugin may change it in the mutating
    #: phase, in place); None for DELETE and CONNECT
    obj: Obj | None = None
    #: the stored object an UPDATE or DELETE starts from
    old_obj: Obj | None = None
    subresource: str = ""
    #: (group, version, kind) of ``obj``: the resource's kind, or the
    #: subresource's (autoscaling/v1 Scale, v1 Binding)
    kind: tuple[str, str, str] = ("", "", "")
    dry_run: bool = False
    #: CreateOptions / UpdateOptions / DeleteOptions (see operation_options)
    options: Obj | None = None
    user: UserInfo = field(default_factory=current_user)
    #: the strategy's defaulting, re-applied to an object a webhook patched
    defaulter: Callable[[Obj], None] | None = None
    reinvocation: ReinvocationContext = field(default_factory=ReinvocationContext)

    def __post_init__(self) -> None:
        if not self.kind[2]:
            sub = SUBRESOURCE_KINDS.get(self.subresource or "")
            self.kind = sub or (self.resource.group, self.resource.version, self.resource.kind)


class AdmissionPlugin:
    """One admission plugin; the base admits everything."""

    name: ClassVar[str] = ""
    #: API groups whose writes this plugin must observe before the next request
    #: (see :meth:`written`): a configuration it caches, say
    watched_groups: ClassVar[frozenset[str]] = frozenset()

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return False

    async def admit(self, attrs: Attributes) -> None:
        """Mutating phase: may change ``attrs.obj``."""

    async def validate(self, attrs: Attributes) -> None:
        """Validating phase: may only refuse."""

    async def written(self, res: ResourceInfo, revision: int) -> None:
        """A write to a resource of :attr:`watched_groups` is stored at
        ``revision``; return once it is in effect for the next request."""

    async def close(self) -> None:
        """Stop background work (watches, connection pools)."""


class NamespaceLifecycle(AdmissionPlugin):
    """Nothing is created in a namespace that is missing or terminating, and
    the namespaces the cluster needs cannot be deleted. As upstream's, it
    judges in the mutating phase, first of all plugins: no webhook is called
    for a request it refuses."""

    name = "NamespaceLifecycle"

    def __init__(self, store: Store) -> None:
        self.store = store

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        if operation == CREATE:
            return res.namespaced
        return operation == DELETE and res.key == NAMESPACES.key

    async def admit(self, attrs: Attributes) -> None:
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
        self.plugins: tuple[AdmissionPlugin, ...] = tuple(plugins)
        self._index()

    def _index(self) -> None:
        self._mutating = tuple(p for p in self.plugins if type(p).admit is not AdmissionPlugin.admit)
        self._validating = tuple(p for p in self.plugins if type(p).validate is not AdmissionPlugin.validate)
        self._watching: dict[str, tuple[AdmissionPlugin, ...]] = {}
        for p in self.plugins:
            for g in p.watched_groups:
                self._watching[g] = self._watching.get(g, ()) + (p,)
        self._for: dict[tuple[bool, str, tuple[str, str]], tuple[AdmissionPlugin, ...]] = {}

    def add(self, plugin: AdmissionPlugin, *, before: str | None = None) -> None:
        """Insert ``plugin`` before the plugin named ``before`` (at the end if
        there is none of that name)."""
        plugins = list(self.plugins)
        at = next((i for i, p in enumerate(plugins) if before and p.name == before), len(plugins))
        plugins.insert(at, plugin)
        self.plugins = tuple(plugins)
        self._index()

    def plugin(self, name: str) -> AdmissionPlugin | None:
        return next((p for p in self.plugins if p.name == name), None)

    def _handling(self, mutating: bool, operation: str, res: ResourceInfo) -> tuple[AdmissionPlugin, ...]:
        key = (mutating, operation, res.key)
        found = self._for.get(key)
        if found is None:
            found = self._for[key] = tuple(
                p for p in (self._mutating if mutating else self._validating) if p.handles(operation, res))
        return found

    def handles(self, mutating: bool, operation: str, res: ResourceInfo) -> bool:
        """Whether any plugin takes part in this phase of such a request (the
        registry builds no Attributes otherwise)."""
        return bool(self._handling(mutating, operation, res))

    @staticmethod
    def _attributes(args: tuple, kw: dict) -> Attributes:
        if len(args) == 1 and not kw and isinstance(args[0], Attributes):
            return args[0]
        return Attributes(*args, **kw)

    async def admit(self, *args: Any, **kw: Any) -> None:
        """The mutating phase: ``admit(attrs)`` (or the fields of one
        :class:`Attributes`). Runs a second time, as upstream's reinvoker
        does, when a plugin asked for it."""
        attrs = self._attributes(args, kw)
        plugins = self._handling(True, attrs.operation, attrs.resource)
        if not plugins:
            return
        for p in plugins:
            await p.admit(attrs)
        if attrs.reinvocation.should_reinvoke:
            attrs.reinvocation.is_reinvoke = True
            for p in plugins:
                await p.admit(attrs)

    async def validate(self, *args: Any, **kw: Any) -> None:
        """The validating phase: ``validate(attrs)``."""
        attrs = self._attributes(args, kw)
        for p in self._handling(False, attrs.operation, attrs.resource):
            await p.validate(attrs)

    async def written(self, res: ResourceInfo, revision: int) -> None:
        """Called by the registry after every stored write: plugins caching a
        configuration of ``res``'s group catch up to ``revision``."""
        for p in self._watching.get(res.group, ()):
            await p.written(res, revision)

    def set_authorizer(self, authorizer: Any) -> None:
        """Give the plugins that ask the authorizer (the webhooks'
        matchConditions ``authorizer``) the API server's; AlwaysAllow until then."""
        for p in self.plugins:
            if hasattr(p, "authorizer"):
                p.authorizer = authorizer

    async def close(self) -> None:
        for p in self.plugins:
            await p.close()


#: the plugin ValidatingAdmissionPolicy is inserted before, as in upstream's
#: plugin order: ``chain.add(policy_plugin, before=VALIDATING_POLICY_SLOT)``
VALIDATING_POLICY_SLOT = "ValidatingAdmissionWebhook"


def default_chain(store: Store) -> AdmissionChain:
    """kubeplane's default plugins, in the order of upstream's plugin list."""
    from kubeplane.registry.webhooks import MutatingAdmissionWebhook, ValidatingAdmissionWebhook, WebhookSource

    hooks = WebhookSource(store)
    return AdmissionChain([
        NamespaceLifecycle(store),
        DefaultStorageClass(store),
        # the mutating webhooks run after every built-in mutating plugin
        MutatingAdmissionWebhook(hooks, store),
        # ValidatingAdmissionPolicy goes here, between the two webhook plugins
        ValidatingAdmissionWebhook(hooks, store),
    ])


__all__ = [
    "AdmissionChain",
    "AdmissionPlugin",
    "Attributes",
    "CONNECT",
    "CREATE",
    "DELETE",
    "DefaultStorageClass",
    "IMMORTAL_NAMESPACES",
    "NamespaceLifecycle",
    "ReinvocationContext",
    "UPDATE",
    "VALIDATING_POLICY_SLOT",
    "default_chain",
    "operation_options",
]
