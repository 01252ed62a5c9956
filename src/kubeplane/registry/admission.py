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
Warnings for the client go through :func:`kubeplane.api.warning.add_warning`.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, ClassVar, Iterable

from kubeplane.api import errors
from kubeplane.api.meta import random_suffix
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
PODS_KEY = ("", "pods")
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
    #: audit annotations the plugins add: the request's admission record
    audit_annotations: dict[str, str] = field(default_factory=dict)

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


SERVICE_ACCOUNTS = resource("serviceaccounts")

#: the ServiceAccount a pod runs as when it names none
DEFAULT_SERVICE_ACCOUNT = "default"
#: where every container finds the token, the CA and the namespace
SERVICE_ACCOUNT_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
#: prefix of the projected token volume's name
SERVICE_ACCOUNT_VOLUME_PREFIX = "kube-api-access-"
#: the ConfigMap the root CA publisher keeps in every namespace
ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"
#: the token lifetime the volume asks for: an hour and 7 s, upstream's marker
#: of tokens issued to pods that old clients may still use past an hour
POD_TOKEN_EXPIRATION_SECONDS = 3607
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
ENFORCE_MOUNTABLE_SECRETS_ANNOTATION = "kubernetes.io/enforce-mountable-secrets"


def service_account_token_volume(name: str) -> Obj:
    """The projected volume of upstream's ServiceAccount admission (as defaulted)."""
    return {"name": name, "projected": {"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"expirationSeconds": POD_TOKEN_EXPIRATION_SECONDS, "path": "token"}},
        {"configMap": {"name": ROOT_CA_CONFIG_MAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}}


def _dicts(value: Any) -> list[Obj]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _pod_secret_names(spec: Obj) -> Iterable[str]:
    """Every Secret a pod spec names (upstream's VisitPodSecretNames)."""
    for ref in _dicts(spec.get("imagePullSecrets")):
        yield ref.get("name") or ""
    for c in (*_dicts(spec.get("initContainers")), *_dicts(spec.get("containers")),
              *_dicts(spec.get("ephemeralContainers"))):
        for env in _dicts(c.get("env")):
            ref = (env.get("valueFrom") or {}).get("secretKeyRef") if isinstance(env.get("valueFrom"), dict) else None
            if isinstance(ref, dict):
                yield ref.get("name") or ""
        for env_from in _dicts(c.get("envFrom")):
            if isinstance(env_from.get("secretRef"), dict):
                yield env_from["secretRef"].get("name") or ""
    for v in _dicts(spec.get("volumes")):
        for key, field in (("secret", "secretName"), ("azureFile", "secretName")):
            if isinstance(v.get(key), dict):
                yield v[key].get(field) or ""
        for key in ("cephfs", "flexVolume", "rbd", "scaleIO", "iscsi", "storageos", "cinder"):
            src = v.get(key)
            if isinstance(src, dict) and isinstance(src.get("secretRef"), dict):
                yield src["secretRef"].get("name") or ""
        csi = v.get("csi")
        if isinstance(csi, dict) and isinstance(csi.get("nodePublishSecretRef"), dict):
            yield csi["nodePublishSecretRef"].get("name") or ""
        projected = v.get("projected")
        if isinstance(projected, dict):
            for source in _dicts(projected.get("sources")):
                if isinstance(source.get("secret"), dict):
                    yield source["secret"].get("name") or ""


class ServiceAccount(AdmissionPlugin):
    """upstream's ServiceAccount admission: a pod runs as a ServiceAccount that
    exists (``default`` unless it names one) and, unless the pod or the
    account opts out, every container mounts a projected token volume at
    :data:`SERVICE_ACCOUNT_MOUNT_PATH`. Only creates are changed or checked;
    mirror pods are never changed and may not use accounts or secrets.

    The account is read from storage; when it is missing, ``default`` is
    looked for nine more times, 100 to 200 ms apart (the controller may be
    creating it in a namespace just made), any other name once."""

    name = "ServiceAccount"

    def __init__(self, store: Store, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None, mount_token: bool = True) -> None:
        self.store = store
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.mount_token = mount_token

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return operation == CREATE and res.key == PODS_KEY

    async def _account(self, namespace: str, name: str) -> Obj | None:
        key = SERVICE_ACCOUNTS.storage_key(name, namespace)
        kv = await self.store.get(key)
        if kv is not None:
            return kv.value
        ns = await self.store.get(NAMESPACES.storage_key(namespace))
        if ns is None or (ns.value.get("metadata") or {}).get("deletionTimestamp"):
            # NamespaceLifecycle, first in the mutating phase, refuses such a
            # request before this plugin runs; one gone meanwhile is left to it
            raise _NamespaceNotActive(namespace)
        attempts = 10 if name == DEFAULT_SERVICE_ACCOUNT else 1
        interval = (100 + self._rng.randrange(100)) / 1000
        for _ in range(attempts - 1):
            await self._sleep(interval)
            kv = await self.store.get(key)
            if kv is not None:
                return kv.value
        return None

    def _forbidden(self, attrs: Attributes, message: str) -> errors.StatusError:
        md = (attrs.obj or {}).get("metadata") or {}
        name = attrs.name
        gen = md.get("generateName")
        if isinstance(gen, str) and gen and name.startswith(gen[:58]) and len(name) == len(gen[:58]) + 5:
            name = gen  # the name is generated after admission upstream
        return errors.StatusError(403, "Forbidden", f'pods "{name}" is forbidden: {message}', name=name,
                                  kind="pods")

    async def _lookup(self, attrs: Attributes, sa_name: str) -> Obj:
        namespace = attrs.namespace or ""
        account = await self._account(namespace, sa_name)
        if account is None:
            raise self._forbidden(attrs, f"error looking up service account {namespace}/{sa_name}: "
                                         f'serviceaccount "{sa_name}" not found')
        return account

    async def admit(self, attrs: Attributes) -> None:
        if attrs.subresource:
            return  # a pod's subresources (binding) are not its business, as upstream's shouldIgnore
        try:
            await self._admit(attrs)
        except _NamespaceNotActive:
            return  # NamespaceLifecycle's refusal comes next

    async def _admit(self, attrs: Attributes) -> None:
        pod = attrs.obj
        if not isinstance(pod, dict):
            return
        md = pod.get("metadata") or {}
        if MIRROR_POD_ANNOTATION in (md.get("annotations") or {}):
            await self.validate(attrs)
            return
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return
        if not spec.get("serviceAccountName"):
            # the deprecated field names it when the new one does not (upstream's v1 conversion)
            spec["serviceAccountName"] = spec.get("serviceAccount") or DEFAULT_SERVICE_ACCOUNT
        # the deprecated field mirrors the name, as upstream's v1 conversion writes it
        spec["serviceAccount"] = spec["serviceAccountName"]
        account = await self._lookup(attrs, str(spec["serviceAccountName"]))
        if self.mount_token and _should_automount(account, spec):
            self._mount_token(spec)
        if not spec.get("imagePullSecrets"):
            pull = _dicts(account.get("imagePullSecrets"))
            if pull:
                spec["imagePullSecrets"] = [{"name": ref.get("name", "")} for ref in pull]
        await self._check(attrs, account)

    async def validate(self, attrs: Attributes) -> None:
        if attrs.subresource:
            return
        pod = attrs.obj
        if not isinstance(pod, dict):
            return
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        md = pod.get("metadata") or {}
        if MIRROR_POD_ANNOTATION in (md.get("annotations") or {}):
            if spec.get("serviceAccountName"):
                raise self._forbidden(attrs, "a mirror pod may not reference service accounts")
            if any(True for _ in _pod_secret_names(spec)):
                raise self._forbidden(attrs, "a mirror pod may not reference secrets")
            for v in _dicts(spec.get("volumes")):
                projected = v.get("projected")
                if isinstance(projected, dict) and any(
                        s.get("serviceAccountToken") is not None for s in _dicts(projected.get("sources"))):
                    raise self._forbidden(attrs, "a mirror pod may not use ServiceAccountToken volume projections")
            return
        sa_name = spec.get("serviceAccountName")
        if not sa_name:
            raise self._forbidden(attrs, f"no service account specified for pod {attrs.namespace}/{attrs.name}")
        try:
            account = await self._lookup(attrs, str(sa_name))
        except _NamespaceNotActive:
            raise self._forbidden(attrs, f"error looking up service account {attrs.namespace}/{sa_name}: "
                                         f'serviceaccount "{sa_name}" not found') from None
        await self._check(attrs, account)

    async def _check(self, attrs: Attributes, account: Obj) -> None:
        ann = ((account.get("metadata") or {}).get("annotations") or {})
        if str(ann.get(ENFORCE_MOUNTABLE_SECRETS_ANNOTATION, "")).lower() not in ("true", "1", "t"):
            return
        problem = _secret_reference_problem(account, (attrs.obj or {}).get("spec") or {})
        if problem:
            raise self._forbidden(attrs, problem)

    def _mount_token(self, spec: Obj) -> None:
        """Every container and init container without a mount at the token path
        mounts the (existing or new) ``kube-api-access-*`` volume."""
        volumes = spec.get("volumes") if isinstance(spec.get("volumes"), list) else []
        name = next((v["name"] for v in _dicts(volumes)
                     if isinstance(v.get("name"), str) and v["name"].startswith(SERVICE_ACCOUNT_VOLUME_PREFIX)), "")
        has_volume = bool(name)
        if not name:
            name = SERVICE_ACCOUNT_VOLUME_PREFIX + random_suffix(rng=self._rng.choice)
        needed = False
        for field in ("initContainers", "containers"):
            for c in _dicts(spec.get(field)):
                mounts = c.get("volumeMounts")
                if not isinstance(mounts, list):
                    mounts = []
                if any(m.get("mountPath") == SERVICE_ACCOUNT_MOUNT_PATH for m in _dicts(mounts)):
                    continue
                c["volumeMounts"] = [*mounts, {"name": name, "readOnly": True,
                                               "mountPath": SERVICE_ACCOUNT_MOUNT_PATH}]
                needed = True
        if needed and not has_volume:
            spec["volumes"] = [*volumes, service_account_token_volume(name)]


class _NamespaceNotActive(Exception):
    """The pod's namespace is missing or terminating: NamespaceLifecycle's business."""


def _should_automount(account: Obj, spec: Obj) -> bool:
    """The pod's choice wins, then the account's; mounted by default."""
    if isinstance(spec.get("automountServiceAccountToken"), bool):
        return spec["automountServiceAccountToken"]
    if isinstance(account.get("automountServiceAccountToken"), bool):
        return account["automountServiceAccountToken"]
    return True


def _secret_reference_problem(account: Obj, spec: Obj) -> str | None:
    """With ``kubernetes.io/enforce-mountable-secrets``, a pod may use only the
    Secrets its account lists (upstream's limitSecretReferences)."""
    sa = (account.get("metadata") or {}).get("name", "")
    allowed = {ref.get("name") for ref in _dicts(account.get("secrets"))}
    tail = f"is not allowed because service account {sa} does not reference that secret"
    for v in _dicts(spec.get("volumes")):
        if isinstance(v.get("secret"), dict):
            secret = v["secret"].get("secretName", "")
            if secret not in allowed:
                return f'volume with secret.secretName="{secret}" {tail}'
    for field, what in (("initContainers", "init container"), ("containers", "container")):
        for c in _dicts(spec.get(field)):
            for env in _dicts(c.get("env")):
                vf = env.get("valueFrom") if isinstance(env.get("valueFrom"), dict) else {}
                ref = vf.get("secretKeyRef")
                if isinstance(ref, dict) and ref.get("name") not in allowed:
                    return (f'{what} {c.get("name", "")} with envVar {env.get("name", "")} referencing '
                            f'secret.secretName="{ref.get("name", "")}" {tail}')
            for env_from in _dicts(c.get("envFrom")):
                ref = env_from.get("secretRef")
                if isinstance(ref, dict) and ref.get("name") not in allowed:
                    return (f'{what} {c.get("name", "")} with envFrom referencing '
                            f'secret.secretName="{ref.get("name", "")}" {tail}')
    pull = {ref.get("name") for ref in _dicts(account.get("imagePullSecrets"))}
    for i, ref in enumerate(_dicts(spec.get("imagePullSecrets"))):
        if ref.get("name") not in pull:
            return (f'imagePullSecrets[{i}].name="{ref.get("name", "")}" is not allowed because service account '
                    f"{sa} does not reference that imagePullSecret")
    return None


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


INGRESS_CLASSES = resource("ingressclasses")
INGRESS_CLASS_DEFAULT_ANNOTATION = "ingressclass.kubernetes.io/is-default-class"
INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"


class DefaultIngressClass(AdmissionPlugin):
    """An Ingress created without ``spec.ingressClassName`` (and without the
    deprecated class annotation) gets the default IngressClass: the newest
    one annotated ``ingressclass.kubernetes.io/is-default-class: "true"``."""

    name = "DefaultIngressClass"

    def __init__(self, store: Store) -> None:
        self.store = store

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return operation == CREATE and res.key == ("networking.k8s.io", "ingresses")

    async def admit(self, attrs: Attributes) -> None:
        if attrs.subresource:
            return
        obj = attrs.obj or {}
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("ingressClassName") is not None:
            return
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if isinstance(annotations, dict) and INGRESS_CLASS_ANNOTATION in annotations:
            return
        default = await self.default_class()
        if default:
            spec["ingressClassName"] = default

    async def default_class(self) -> str | None:
        result = await self.store.list(INGRESS_CLASSES.storage_prefix())
        best: tuple[str, str] | None = None
        for kv in result.items:
            md = kv.value.get("metadata") or {}
            if (md.get("annotations") or {}).get(INGRESS_CLASS_DEFAULT_ANNOTATION) == "true":
                # newest first; on equal creation times the name that sorts first
                cand = (md.get("creationTimestamp", ""), md.get("name", ""))
                if best is None or cand[0] > best[0] or (cand[0] == best[0] and cand[1] < best[1]):
                    best = cand
        return best[1] if best else None


class CertificateSubjectRestriction(AdmissionPlugin):
    """No CertificateSigningRequest for the kube-apiserver-client signer may
    ask for the ``system:masters`` group: a certificate with it would bypass
    authorization altogether."""

    name = "CertificateSubjectRestriction"
    SIGNER = "kubernetes.io/kube-apiserver-client"

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return operation == CREATE and res.key == ("certificates.k8s.io", "certificatesigningrequests")

    async def validate(self, attrs: Attributes) -> None:
        from cryptography.x509.oid import NameOID

        from kubeplane.api.validation.certificates import decode_bytes, parse_csr

        spec = (attrs.obj or {}).get("spec") or {}
        if spec.get("signerName") != self.SIGNER:
            return
        what = f'certificatesigningrequests.certificates.k8s.io "{attrs.name}" is forbidden'
        try:
            req = parse_csr(decode_bytes(spec.get("request")) or b"")
        except ValueError as err:
            raise errors.StatusError(403, "Forbidden", f"{what}: failed to parse CSR: {err}", name=attrs.name,
                                     group="certificates.k8s.io", kind="certificatesigningrequests") from None
        orgs = [a.value for a in req.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        if "system:masters" in orgs:
            raise errors.StatusError(
                403, "Forbidden", f"{what}: use of {self.SIGNER} signer with system:masters group is not allowed",
                name=attrs.name, group="certificates.k8s.io", kind="certificatesigningrequests")


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


def default_chain(store: Store, authorizer: Any = None, *, service_accounts: bool = False,
                  disabled: Iterable[str] = ()) -> AdmissionChain:
    """kubeplane's default plugins, in the order of upstream's plugin list.
    ``service_accounts`` adds the ServiceAccount plugin, which needs the
    ServiceAccount controller running (the API server turns it on; a bare
    registry, as unit tests build it, leaves it off). ``disabled`` names
    plugins to leave out (upstream's ``--disable-admission-plugins``; those
    that can be: LimitRanger, NodeRestriction, Priority, ResourceQuota). ``authorizer`` answers
    the CEL ``authorizer`` checks of the policies and the webhooks'
    matchConditions (AlwaysAllow when None; settable later with
    :meth:`AdmissionChain.set_authorizer`)."""
    from kubeplane.admission.policy import ValidatingAdmissionPolicyPlugin
    from kubeplane.registry.webhooks import MutatingAdmissionWebhook, ValidatingAdmissionWebhook, WebhookSource

    disabled = frozenset(disabled)
    plugins: list[AdmissionPlugin] = [NamespaceLifecycle(store)]
    # -- quota: LimitRanger --
    from kubeplane.registry import policyadmission

    if "LimitRanger" not in disabled:
        plugins.append(policyadmission.LimitRanger(store))

    if service_accounts:
        plugins.append(ServiceAccount(store))
    # -- security: NodeRestriction (kubeadm turns it on; so does kubeplane) --
    if "NodeRestriction" not in disabled:
        from kubeplane.registry.noderestriction import NodeRestriction

        plugins.append(NodeRestriction(store))
    # -- quota: Priority --
    if "Priority" not in disabled:
        plugins.append(policyadmission.Priority(store))

    # -- maintenance: DefaultTolerationSeconds --
    from kubeplane.admission.defaulttolerationseconds import DefaultTolerationSeconds

    plugins.append(DefaultTolerationSeconds())

    plugins.append(DefaultStorageClass(store))
    plugins.append(CertificateSubjectRestriction())
    # -- endpoints: DefaultIngressClass --
    plugins.append(DefaultIngressClass(store))

    hooks = WebhookSource(store)
    # the mutating webhooks run after every built-in mutating plugin
    plugins.append(MutatingAdmissionWebhook(hooks, store))
    # validating: the policies, then the webhooks (upstream's order)
    plugins.append(ValidatingAdmissionPolicyPlugin(store, authorizer=authorizer))
    plugins.append(ValidatingAdmissionWebhook(hooks, store))
    # -- quota: ResourceQuota (last, as upstream) --
    if "ResourceQuota" not in disabled:
        plugins.append(policyadmission.ResourceQuota(store))

    chain = AdmissionChain(plugins)
    if authorizer is not None:
        chain.set_authorizer(authorizer)
    return chain


__all__ = [
    "AdmissionChain",
    "AdmissionPlugin",
    "Attributes",
    "CONNECT",
    "CREATE",
    "CertificateSubjectRestriction",
    "DELETE",
    "UPDATE",
    "DefaultIngressClass",
    "DefaultStorageClass",
    "IMMORTAL_NAMESPACES",
    "NamespaceLifecycle",
    "ReinvocationContext",
    "ServiceAccount",
    "UPDATE",
    "VALIDATING_POLICY_SLOT",
    "default_chain",
    "operation_options",
    "service_account_token_volume",
]
