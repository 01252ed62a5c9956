"""The generic registry: REST semantics over the versioned store.

One code path serves every resource in the catalogue; per-resource behaviour
comes from :mod:`kubeplane.registry.strategies`. Both the HTTP API server and
the in-process client call this class, so they cannot drift apart.

Objects handed out are the store's read-only dicts: callers that want to
modify one copy it first.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from typing import Any, Callable

import orjson

from kubeplane.api import errors
from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, format_time, new_uid, now_text, random_suffix, utcnow
from kubeplane.api.resources import CATALOGUE, Catalogue, ResourceInfo, resource
from kubeplane.api.selectors import parse_field_selector, parse_label_selector
from kubeplane.api.validation import validate_object
from kubeplane.auth.authorizer import AlwaysAllow
from kubeplane.registry import customresource as cr
from kubeplane.registry import rbac as rbac_rules
from kubeplane.registry.admission import (
    CREATE,
    DELETE,
    UPDATE,
    AdmissionChain,
    Attributes,
    ReinvocationContext,
    default_chain,
    operation_options,
)
from kubeplane.registry.retries import RETRY_SECONDS, Retries
from kubeplane.registry.strategies import Strategy, strategy_for
from kubeplane.registry.subresources import SubresourcesMixin
from kubeplane.registry.watch import WatchMixin, WatchOptions, parse_resource_version  # noqa: F401 - WatchOptions: callers import it here
from kubeplane.runtime import KeyedTurns
from kubeplane.storage.interface import (
    CompactedError,
    FutureRevisionError,
    KeyExistsError,
    KeyNotFoundError,
    RevisionConflictError,
    Store,
    parse_revision,
    wait_for_revision,
)

Obj = dict[str, Any]

log = logging.getLogger("kubeplane.registry")

NAMESPACES = resource("namespaces")



def _finalizer_names(md: dict[str, Any]) -> set[str]:
    """The finalizers as decoded upstream: null is the empty string. Values of other
    types are left to validation, which rejects them."""
    finalizers = md.get("finalizers")
    if not isinstance(finalizers, list):
        return set()
    return {"" if f is None else f for f in finalizers if f is None or isinstance(f, str)}


def _spec_finalizers(ns: Obj) -> list:
    """A namespace's spec.finalizers: it is deleted once they and its
    metadata.finalizers are gone (upstream's ShouldDeleteNamespaceDuringUpdate)."""
    spec = ns.get("spec")
    finalizers = spec.get("finalizers") if isinstance(spec, dict) else None
    return finalizers if isinstance(finalizers, list) else []


def _terminating(catalogue: Catalogue, res: ResourceInfo) -> bool:
    """Whether the CRD of a custom resource is being deleted (as the catalogue
    serves it now: ``res`` may be from before the delete)."""
    live = catalogue.by_gvr(res.group, res.version, res.plural)
    info = live.custom if live is not None and live.custom is not None else res.custom
    return bool(info.terminating)

def _admission_namespace(res: ResourceInfo, name: str, namespace: str | None) -> str | None:
    """The namespace of an admission request: a namespace's own name for the
    Namespace objects (as upstream's request info sets it), none for other
    cluster-scoped resources."""
    if res.key == NAMESPACES.key:
        return name
    return namespace if res.namespaced else None


def _status_success(res: ResourceInfo, name: str, uid: str | None) -> Obj:
    details: Obj = {"name": name, "group": res.group, "kind": res.plural}
    if not res.group:
        del details["group"]  # omitempty upstream: the core group is left out
    if uid:
        details["uid"] = uid
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


def _encode_continue(revision: int, start_after: str) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": start_after})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        pad = "=" * (-len(token) % 4)
        data = orjson.loads(base64.urlsafe_b64decode(token + pad))
        encoded_rv = data["rv"]
        start = str(data["start"])
    except Exception as exc:  # noqa: BLE001 - any garbage is the client's error
        raise errors.bad_request(f"continue key is not valid: {exc}") from None
    try:
        rv = parse_revision(encoded_rv)
    except ValueError:
        rv = 0
    if rv == 0:
        raise errors.bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    return rv, start


class Registry(WatchMixin, SubresourcesMixin):
    """REST verbs for every catalogued resource on top of one :class:`Store`.

    The verbs are here; watch (registry/watch.py), the subresources binding
    and scale (registry/subresources.py) and admission (registry/admission.py)
    have modules of their own, and this class is their one facade. A
    namespace's spec.finalizers change through ``subresource="finalize"``
    only; the namespace controller (controllers/namespace.py) empties
    terminating namespaces and finalizes them."""

    def __init__(
        self,
        store: Store,
        catalogue: Catalogue = CATALOGUE,
        *,
        clock: Callable[[], Any] = utcnow,
        validator: Callable[[ResourceInfo, Obj, Obj | None], list[errors.Cause]] | None = None,
        retry_seconds: float = RETRY_SECONDS,
        admission: AdmissionChain | None = None,
        authorizer: Any = None,
    ) -> None:
        self.store = store
        #: asked by the authorization reviews and the RBAC escalation checks
        #: (kubeplane.auth.authorizer.Authorizer; AlwaysAllow by default)
        self.authorizer = authorizer if authorizer is not None else AlwaysAllow()
        #: the admission plugins every write passes (registry/admission.py)
        self.admission = admission if admission is not None else default_chain(store)
        self.catalogue = catalogue
        self.clock = clock
        self._strategies: dict[tuple[str, str], Strategy] = {}
        self._validator = validator if validator is not None else _default_validator()
        #: writers of one key take turns (see _update_loop)
        self._turns = KeyedTurns()
        self._retry_seconds = retry_seconds
        policies = self.admission.plugin("ValidatingAdmissionPolicy")
        if policies is not None:
            policies.catalogue = self.catalogue  # paramKinds and rules resolve in the served catalogue
        #: ``pruner(res, obj) -> problems``: drops the fields the kind's schema
        #: does not know (in place) and reports type errors, as decoding into
        #: upstream's typed objects does; the API server sets it, and an object a
        #: webhook patched passes it before it is defaulted again
        self.pruner: Callable[[ResourceInfo, Obj], list[str]] | None = None

    # -- helpers -----------------------------------------------------------

    def strategy(self, res: ResourceInfo) -> Strategy:
        if res.custom is not None:
            s = res.custom.compiled.get("strategy")
            if s is None:
                s = res.custom.compiled["strategy"] = cr.CustomResourceStrategy(res)
            return s
        s = self._strategies.get(res.key)
        if s is None:
            s = self._strategies[res.key] = strategy_for(res)
        return s

    def _field_selector(self, res: ResourceInfo, text: str):
        if res.custom is not None:
            return parse_field_selector(text, res.plural, cr.field_getters(res))
        return parse_field_selector(text, res.plural)

    def _out(self, res: ResourceInfo, obj: Obj) -> Obj:
        """A stored object as ``res`` serves it: a custom resource read in
        another version than its storage version gets that apiVersion, and
        the schema's defaults are applied (as upstream defaults on read)."""
        if res.custom is None or obj.get("kind") == "Status":
            return obj
        obj = cr.to_version(res, obj)
        return cr.default_on_read(res, obj)
    def _patched_fixup(self, res: ResourceInfo, strategy: Strategy) -> Callable[[Obj], None]:
        """What an object an admission webhook patched goes through: upstream
        decodes it into the typed object (dropping unknown fields, refusing
        wrong types) and defaults it."""
        pruner = self.pruner
        if pruner is None:
            return strategy.default

        def fixup(obj: Obj) -> None:
            bad = [p for p in pruner(res, obj) if not p.startswith('unknown field "')]
            if bad:
                raise ValueError(bad[0])
            strategy.default(obj)

        return fixup

    def _now(self) -> str:
        return now_text() if self.clock is utcnow else format_time(self.clock())

    def _key(self, res: ResourceInfo, name: str, namespace: str | None) -> str:
        if res.namespaced and not namespace:
            raise errors.bad_request("the server could not find the requested resource: namespace is required")
        return res.storage_key(name, namespace if res.namespaced else None)

    def _validate(self, res: ResourceInfo, obj: Obj, old: Obj | None, more: list[errors.Cause] | None = None) -> None:
        """``more``: causes the strategy found for the endpoint written to."""
        causes = self._validator(res, obj, old)
        if more:
            causes = [*causes, *more]
        if res.custom is not None:
            causes = causes + cr.validate(res, obj, old)
        if causes:
            name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName", "")
            raise errors.invalid(res.kind, name, causes, group=res.group)

    def _check_type_meta(self, res: ResourceInfo, obj: Obj) -> None:
        api_version = obj.get("apiVersion")
        kind = obj.get("kind")
        if api_version in (None, "") and kind in (None, ""):
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            return
        if api_version in (None, ""):
            obj["apiVersion"] = res.api_version
        if kind in (None, ""):
            obj["kind"] = res.kind
        if obj["apiVersion"] != res.api_version or obj["kind"] != res.kind:
            raise errors.bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the expected API version "
                f"({res.api_version})" if obj["apiVersion"] != res.api_version else
                f"the kind in the data ({obj['kind']}) does not match the expected kind ({res.kind})"
            )

    def _check_metadata_shape(self, obj: Obj) -> Obj:
        md = obj.get("metadata")
        if md is None:
            md = obj["metadata"] = {}
        if not isinstance(md, dict):
            raise errors.bad_request("metadata must be an object")
        return md

    def _normalise_namespace(self, res: ResourceInfo, md: Obj, namespace: str | None) -> None:
        if res.namespaced:
            body_ns = md.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            ns = namespace or body_ns
            if not ns:
                raise errors.bad_request("an empty namespace may not be set during creation")
            md["namespace"] = ns
        else:
            md.pop("namespace", None)

    async def get(self, res: ResourceInfo, name: str, namespace: str | None = None) -> Obj:
        kv = await self.store.get(self._key(res, name, namespace))
        if kv is None:
            raise errors.not_found(res.plural, name, res.group)
        return self._out(res, kv.value) if res.custom is not None else kv.value

    async def list(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        resource_version_match: str = "",
    ) -> Obj:
        lsel = parse_label_selector(label_selector) if label_selector else None
        fsel = self._field_selector(res, field_selector) if field_selector else None
        prefix = res.storage_prefix(namespace if res.namespaced else None)
        revision = 0
        start_after = ""
        if continue_token:
            if resource_version not in ("", None):
                raise errors.bad_request("specifying resource version is not allowed when using continue")
            revision, start_after = _decode_continue(continue_token)
            if not start_after.startswith(prefix):
                raise errors.bad_request("continue key is not valid: key does not match the request")
        elif resource_version_match == "Exact":
            if resource_version in ("", "0"):
                raise errors.bad_request("resourceVersionMatch \"Exact\" requires a resourceVersion other than \"0\"")
            revision = parse_resource_version(resource_version)
        elif resource_version_match not in ("", "NotOlderThan"):
            raise errors.bad_request(f"resourceVersionMatch: Unsupported value: {resource_version_match!r}")
        elif resource_version not in ("", "0", None):
            await self._wait_for_revision(parse_resource_version(resource_version))
        items: list[Obj] = []
        more = False
        last_key = start_after
        list_revision = revision
        try:
            while True:
                page_limit = 0 if not limit else max(limit - len(items), 1) + (8 if (lsel or fsel) else 0)
                result = await self.store.list(prefix, revision=list_revision, limit=page_limit, start_after=last_key)
                list_revision = result.revision
                for kv in result.items:
                    obj = kv.value
                    last_key = kv.key
                    if lsel is not None and not lsel.matches((obj.get("metadata") or {}).get("labels")):
                        continue
                    if fsel is not None and not fsel.matches(obj):
                        continue
                    items.append(obj)
                    if limit and len(items) >= limit:
                        break
                if limit and len(items) >= limit:
                    # More exist if this page was cut short or the store has more.
                    more = result.more or kv is not result.items[-1]
                    break
                if not result.more:
                    break
        except CompactedError as exc:
            if continue_token:
                raise errors.StatusError(
                    410, "Expired",
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter, or use the continue token "
                    "in this response to retrieve the remainder of the results. Continuing with the "
                    "provided token results in an inconsistent list - objects that were created, modified, "
                    "or deleted between the time the first chunk was returned and now may show up in the list.",
                ) from None
            raise errors.gone(str(exc)) from None
        except FutureRevisionError as exc:
            raise errors.too_large_resource_version(exc.requested, exc.current, None) from None
        if res.custom is not None:
            items = [self._out(res, o) for o in items]
        metadata: Obj = {"resourceVersion": str(list_revision)}
        if more:
            metadata["continue"] = _encode_continue(list_revision, last_key)
        return {"kind": res.list_kind, "apiVersion": res.api_version, "metadata": metadata, "items": items}

    async def _wait_for_revision(self, rv: int, timeout: float = 3.0) -> None:
        """Wait (briefly) for the store to reach ``rv``: a 504 naming both revisions otherwise."""
        if not await wait_for_revision(self.store, rv, timeout):
            raise errors.too_large_resource_version(rv, self.store.revision)

    # -- create ------------------------------------------------------------

    async def create(
        self,
        res: ResourceInfo,
        obj: Obj,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        field_manager: str | None = None,
        _track_fields: bool = True,
        owned: bool = False,
        _options: Obj | None = None,
    ) -> Obj:
        """Create ``obj``. With ``owned`` the caller hands ``obj`` over (a freshly
        decoded request body): it is stored as it is modified, not copied."""
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        if not owned:
            obj = deep_copy(obj)
        if res.custom is not None and _terminating(self.catalogue, res):
            raise errors.method_not_allowed("create not allowed while custom resource definition is terminating")
        self._check_type_meta(res, obj)
        md = self._check_metadata_shape(obj)
        self._normalise_namespace(res, md, namespace)
        if rbac_rules.is_review(res):
            return await rbac_rules.review(self, res, obj, md.get("namespace"))
        if rbac_rules.is_rbac(res):
            rbac_rules.check_write(self, res, obj, None, "")
        strategy = self.strategy(res)
        # Server-owned metadata is reset on create.
        for k in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            md.pop(k, None)
        md["creationTimestamp"] = self._now()
        if not md.get("name") and md.get("generateName"):
            gen = md["generateName"]
            if isinstance(gen, str):
                md["name"] = gen[: max(0, 63 - 5)] + random_suffix()
        # Set before the strategy runs: a Job's generated selector names it.
        uid = md["uid"] = new_uid()
        created_at = md["creationTimestamp"]
        strategy.prepare_for_create(obj)
        strategy.default(obj)
        attrs = Attributes(
            # a Namespace's create names no namespace (its request has none yet)
            CREATE, res, md.get("name") or "", None if res.key == NAMESPACES.key else md.get("namespace"),
            obj, None, dry_run=dry_run, defaulter=self._patched_fixup(res, strategy),
            options=_options or operation_options("CreateOptions", dry_run=dry_run, field_manager=field_manager),
        )
        await self.admission.admit(attrs)
        if attrs.obj is not obj or obj.get("metadata") is not md:
            # A webhook's patch replaced the metadata: the server's fields stay.
            obj = attrs.obj if isinstance(attrs.obj, dict) else obj
            md = self._check_metadata_shape(obj)
            self._normalise_namespace(res, md, namespace)
            for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                md.pop(k, None)
            md["uid"], md["creationTimestamp"] = uid, created_at
        if res.custom is not None:
            # what mutating admission added is pruned and defaulted too (upstream
            # decodes a mutated custom resource again)
            strategy.default(obj)
        if strategy.tracks_generation:
            md["generation"] = 1
        else:
            md.pop("generation", None)
        self._validate(res, obj, None)
        attrs.name = md.get("name") or ""
        await self.admission.validate(attrs)
        if _track_fields and field_manager is not None:
            self._track_managed_fields(res, None, obj, field_manager)
        key = res.storage_key(md["name"], md.get("namespace"))
        if dry_run:
            if await self.store.get(key) is not None:
                raise errors.already_exists(res.plural, md["name"], res.group)
            return obj
        try:
            kv = await self.store.create(key, obj if res.custom is None else cr.to_storage(res, obj))
        except KeyExistsError:
            raise errors.already_exists(res.plural, md["name"], res.group) from None
        await self.admission.written(res, kv.mod_revision)
        return kv.value if res.custom is None else self._out(res, kv.value)

    def _track_managed_fields(
        self, res: ResourceInfo, old: Obj | None, new: Obj, manager: str, subresource: str | None = None
    ) -> None:
        from kubeplane.api.apply import track_update

        updated = track_update(old, new, manager, self._now(), subresource=subresource)
        new["metadata"]["managedFields"] = updated["metadata"].get("managedFields", [])

    # -- update ------------------------------------------------------------

    async def update(
        self,
        res: ResourceInfo,
        obj: Obj,
        *,
        name: str | None = None,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        owned: bool = False,
    ) -> Obj:
        """Replace the object named by ``obj`` (or ``name``). With ``owned`` the
        caller hands ``obj`` over (a freshly decoded request body): each attempt
        works on a copy of its top level and metadata only, the parts below are
        stored as they are (defaulting, which may fill them in place, gives the
        same result when an attempt is repeated)."""
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        md_in = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        name = name or md_in.get("name")
        if not name:
            raise errors.bad_request("name is required")
        if md_in.get("name") and md_in.get("name") != name:
            raise errors.bad_request(
                f"the name of the object ({md_in.get('name')}) does not match the name on the URL ({name})"
            )
        namespace = namespace or md_in.get("namespace")
        body_ns = md_in.get("namespace")
        if res.namespaced and body_ns and namespace and body_ns != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if subresource == "finalize" and res.key != NAMESPACES.key:
            raise errors.not_found(res.plural, name, res.group)
        key = self._key(res, name, namespace)
        want_rv = md_in.get("resourceVersion") or ""

        def mutate(current: Obj) -> Obj:
            if owned:
                new = dict(obj)
                if isinstance(obj.get("metadata"), dict):
                    new["metadata"] = dict(obj["metadata"])
            else:
                new = deep_copy(obj)
            if subresource is None:
                self._check_type_meta(res, new)
            else:
                new["apiVersion"], new["kind"] = res.api_version, res.kind
            return new

        return await self._update_loop(
            res, key, name, mutate, want_rv=want_rv, subresource=subresource, dry_run=dry_run,
            field_manager=field_manager,
            options=operation_options("UpdateOptions", dry_run=dry_run, field_manager=field_manager),
        )

    async def _update_loop(
        self,
        res: ResourceInfo,
        key: str,
        name: str,
        mutate: Callable[[Obj], Obj],
        *,
        want_rv: str = "",
        subresource: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        create_if_missing: Callable[[], Any] | None = None,
        options: Obj | None = None,
        view: "tuple[Callable[[Obj], Obj], Callable[[Obj, Obj], Obj]] | None" = None,
    ) -> Obj:
        """Read-modify-write with optimistic concurrency (upstream's GuaranteedUpdate).

        ``view`` (to the subresource's kind, back from it) shows admission the
        request as a write of that subresource's own kind (the Scale of a
        deployment).

        A client-supplied resourceVersion that is stale is a 409; a race with
        another writer when the client did not pin a version is retried.
        Writers of one key in this process take turns (a per-key lock), so
        concurrent unpinned updates of a hot object queue up instead of
        exhausting their retries; the revision check still guards against
        writers elsewhere.

        Admission sees every attempt (as upstream's, which runs inside
        GuaranteedUpdate); ``view`` is the pair (object -> what admission
        sees, (admitted view, object) -> object) of a subresource whose
        admission object is another kind (scale).
        """
        await self._turns.acquire(key)
        try:
            return await self._update_locked(
                res, key, name, mutate, want_rv=want_rv, subresource=subresource, dry_run=dry_run,
                field_manager=field_manager, create_if_missing=create_if_missing, options=options, view=view,
            )
        finally:
            self._turns.release(key)

    async def _update_locked(
        self,
        res: ResourceInfo,
        key: str,
        name: str,
        mutate: Callable[[Obj], Obj],
        *,
        want_rv: str,
        subresource: str | None,
        dry_run: bool,
        field_manager: str | None,
        create_if_missing: Callable[[], Any] | None,
        options: Obj | None = None,
        view: "tuple[Callable[[Obj], Obj], Callable[[Obj, Obj], Obj]] | None" = None,
    ) -> Obj:
        retries = Retries(self._retry_seconds)
        kv = await self.store.get(key)
        while True:
            if kv is None:
                if create_if_missing is None:
                    raise errors.not_found(res.plural, name, res.group)
                try:
                    return await create_if_missing()
                except StatusError as err:
                    if err.reason != "AlreadyExists":
                        raise
                # Created meanwhile by another writer: apply to that object, as
                # upstream's GuaranteedUpdate retries a lost create. Its commit
                # may still be under way, so wait a moment before reading it.
                await retries.again()
                await asyncio.sleep(0.002)
                kv = await self.store.get(key)
                continue
            current = kv.value if res.custom is None else cr.to_version(res, kv.value)
            new = mutate(current)
            new_md = self._check_metadata_shape(new)
            if rbac_rules.is_rbac(res) and subresource is None:
                rbac_rules.check_write(self, res, new, current, name)
            rv = want_rv or new_md.get("resourceVersion") or ""
            if rv and rv != str(kv.mod_revision):
                raise errors.conflict(res.plural, name, res.group)
            new = await self._prepare_update(res, new, current, subresource, field_manager,
                                             dry_run=dry_run, options=options, view=view)
            if new == current and not kv.stale:
                # No-op writes do not bump the revision (as upstream), unless the
                # stored value is stale: rewriting it re-encrypts with the current key.
                return current if res.custom is None else self._out(res, current)
            # upstream's ShouldDeleteDuringUpdate: the last finalizer gone, and
            # no grace period still running (a pod the kubelet has not stopped)
            finalizers_gone = bool(
                (new.get("metadata") or {}).get("deletionTimestamp") and not new["metadata"].get("finalizers")
                and not (current.get("metadata") or {}).get("deletionGracePeriodSeconds")
            ) and not (res.key == NAMESPACES.key and _spec_finalizers(new))
            if dry_run:
                return new
            try:
                if finalizers_gone:
                    kv2 = await self.store.delete(key, expected_revision=kv.mod_revision)
                    self._after_delete(res, kv2.value)
                    await self.admission.written(res, kv2.mod_revision)
                    return self._out(res, kv2.value)
                if res.custom is not None:
                    kv2 = await self.store.update(key, cr.to_storage(res, new), expected_revision=kv.mod_revision)
                    await self.admission.written(res, kv2.mod_revision)
                    return self._out(res, kv2.value)
                kv2 = await self.store.update(key, new, expected_revision=kv.mod_revision)
                await self.admission.written(res, kv2.mod_revision)
                return kv2.value
            except RevisionConflictError as exc:
                if rv:
                    raise errors.conflict(res.plural, name, res.group) from None
                # The state the write lost to, as upstream retries against the
                # object its failed transaction returned (a read may still show
                # the previous committed state while that write commits).
                kv = exc.current
            except KeyNotFoundError:
                raise errors.not_found(res.plural, name, res.group) from None
            await retries.again()

    @staticmethod
    def _keep_server_metadata(res: ResourceInfo, md: Obj, cur_md: Obj) -> None:
        """Server-owned metadata survives whatever the client (or a webhook) sent."""
        md["name"] = cur_md.get("name")
        if res.namespaced:
            md["namespace"] = cur_md.get("namespace")
        else:
            md.pop("namespace", None)
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if k in cur_md:
                md[k] = cur_md[k]
            else:
                md.pop(k, None)
        md.pop("resourceVersion", None)
        md.pop("selfLink", None)

    async def _prepare_update(
        self, res: ResourceInfo, new: Obj, current: Obj, subresource: str | None, field_manager: str | None,
        *, dry_run: bool = False, options: Obj | None = None,
        view: "tuple[Callable[[Obj], Obj], Callable[[Obj, Obj], Obj]] | None" = None,
    ) -> Obj:
        strategy = self.strategy(res)
        md = new["metadata"]
        cur_md = current.get("metadata") or {}
        self._keep_server_metadata(res, md, cur_md)
        if subresource != "status":
            strategy.default(new)
        name = cur_md.get("name") or ""
        attrs = Attributes(
            UPDATE, res, name, _admission_namespace(res, name, cur_md.get("namespace")),
            view[0](new) if view else new, view[0](current) if view else current, subresource or "",
            dry_run=dry_run, defaulter=None if view else self._patched_fixup(res, strategy),
            options=options or operation_options("UpdateOptions", dry_run=dry_run, field_manager=field_manager),
        )
        await self.admission.admit(attrs)
        if view is not None:
            new = view[1](attrs.obj, new)
            md = self._check_metadata_shape(new)
        elif new.get("metadata") is not md:
            md = self._check_metadata_shape(new)  # a webhook's patch replaced it
            self._keep_server_metadata(res, md, cur_md)
        if cur_md.get("deletionTimestamp"):
            # A terminating object may lose finalizers but gain none.
            added = _finalizer_names(md) - _finalizer_names(cur_md)
            if added:
                listed = ", ".join(orjson.dumps(f).decode() for f in sorted(added))
                raise errors.invalid(res.kind, md["name"], [errors.forbidden_field(
                    "metadata.finalizers",
                    f"no new finalizers can be added if the object is being deleted, found new finalizers []string{{{listed}}}",
                )], group=res.group)
        if subresource in ("status", "approval"):
            if subresource == "status":
                strategy.prepare_for_status_update(new, current)
            else:
                strategy.prepare_for_approval_update(new, current)
            # Metadata is not writable through the status endpoint. Only its top level
            # changes below (resourceVersion, managedFields): the rest is shared.
            md_keep = dict(cur_md)
            new["metadata"] = md_keep
            md = new["metadata"]
            md.pop("resourceVersion", None)
        elif subresource == "finalize":
            strategy.prepare_for_finalize_update(new, current)
        else:
            strategy.prepare_for_update(new, current)
            if strategy.tracks_generation and strategy.spec_changed(new, current):
                md["generation"] = int(cur_md.get("generation") or 0) + 1
        if field_manager is not None:
            self._track_managed_fields(res, current, new, field_manager, subresource)
        elif "managedFields" not in md and "managedFields" in cur_md:
            md["managedFields"] = cur_md["managedFields"]
        self._validate(res, new, current, strategy.subresource_causes(new, current, subresource))
        attrs.obj = view[0](new) if view else new
        await self.admission.validate(attrs)
        cur_cmp = dict(current)
        cur_cmp["metadata"] = {k: v for k, v in cur_md.items() if k != "resourceVersion"}
        if new == cur_cmp:
            return current
        return new

    # -- patch -------------------------------------------------------------

    async def patch(
        self,
        res: ResourceInfo,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        force: bool | None = None,
        prune: Callable[[Obj], None] | None = None,
    ) -> tuple[Obj, bool]:
        """Returns ``(object, created)``; only server-side apply can create.
        ``prune`` (not for apply) edits the patched object in place before it is
        stored (the API server drops unknown fields with it)."""
        from kubeplane.api import patch as patching

        key = self._key(res, name, namespace)
        if patch_type == "strategic" and res.custom is not None:
            raise errors.unsupported_media_type("application/strategic-merge-patch+json", [
                "application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"])
        if patch_type == "apply":
            return await self._apply(res, name, namespace, key, patch, subresource, dry_run, field_manager, force)
        if force is not None:
            raise errors.bad_request("force is only supported for server-side apply")
        if patch_type in ("json",):
            if not isinstance(patch, list):
                raise errors.bad_request("json patch must be a JSON array of operations")
        elif not isinstance(patch, dict):
            raise errors.bad_request(f"{patch_type} patch must be a JSON object")
        pinned_rv = ""
        if isinstance(patch, dict):
            pinned_rv = str(((patch.get("metadata") or {}) if isinstance(patch.get("metadata"), dict) else {})
                            .get("resourceVersion") or "")

        def mutate(current: Obj) -> Obj:
            if patch_type == "json":
                new = patching.json_patch(current, patch)
            elif patch_type == "merge":
                new = patching.merge_patch(current, patch)
            elif patch_type == "strategic":
                new = patching.strategic_merge_patch(current, patch, res.group, res.kind)
            else:
                raise errors.unsupported_media_type(patch_type, list(_PATCH_TYPES))
            if not isinstance(new, dict):
                raise errors.bad_request("the patch did not produce an object")
            new = deep_copy(new) if new is current else new
            if prune is not None:
                prune(new)
            if subresource is None:
                self._check_type_meta(res, new)
            md = self._check_metadata_shape(new)
            if not pinned_rv and patch_type != "json":
                md.pop("resourceVersion", None)
            elif patch_type == "json" and md.get("resourceVersion") == (current.get("metadata") or {}).get(
                "resourceVersion"
            ):
                md.pop("resourceVersion", None)
            return new

        obj = await self._update_loop(
            res, key, name, mutate, want_rv=pinned_rv, subresource=subresource, dry_run=dry_run,
            field_manager=field_manager or "unknown",
        )
        return obj, False

    async def _apply(
        self, res, name, namespace, key, patch, subresource, dry_run, field_manager, force
    ) -> tuple[Obj, bool]:
        from kubeplane.api import apply as ssa

        if not field_manager:
            raise errors.bad_request("PATCH requests with apply patch type require a field manager")
        if not isinstance(patch, dict):
            raise errors.bad_request("apply patch must be an object")
        patch = deep_copy(patch)
        if patch.get("apiVersion") in (None, "") or patch.get("kind") in (None, ""):
            raise errors.bad_request("apiVersion and kind must be set in an apply configuration")
        self._check_type_meta(res, patch)
        pmd = self._check_metadata_shape(patch)
        if pmd.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({pmd.get('name')}) does not match the name on the URL ({name})"
            )
        pmd["name"] = name
        if res.namespaced:
            if pmd.get("namespace") and namespace and pmd["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            pmd["namespace"] = namespace or pmd.get("namespace")
        pinned_rv = str(pmd.get("resourceVersion") or "")
        created = False

        async def create_new() -> Obj:
            nonlocal created
            if subresource is not None:
                raise errors.not_found(res.plural, name, res.group)
            new = ssa.apply(None, patch, field_manager, bool(force), self._now())
            # apply() already recorded this manager's fields.
            obj = await self.create(res, new, namespace, dry_run=dry_run, _track_fields=False, _options=(
                operation_options("CreateOptions", dry_run=dry_run, field_manager=field_manager)))
            created = True
            return obj

        def mutate(current: Obj) -> Obj:
            out = ssa.apply(current, patch, field_manager, bool(force), self._now(), subresource=subresource)
            md = out.get("metadata")
            if not pinned_rv and isinstance(md, dict) and "resourceVersion" in md:
                # the live object's version, not the client's: the apply is unconditional
                out = {**out, "metadata": {k: v for k, v in md.items() if k != "resourceVersion"}}
            return out

        obj = await self._update_loop(
            res, key, name, mutate, want_rv=pinned_rv, subresource=subresource, dry_run=dry_run,
            field_manager=None, create_if_missing=create_new,
            options=operation_options("UpdateOptions", dry_run=dry_run, field_manager=field_manager),
        )
        return obj, created

    # -- delete ------------------------------------------------------------

    async def delete(
        self,
        res: ResourceInfo,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: dict[str, str] | None = None,
        dry_run: bool = False,
        collection: bool = False,
    ) -> tuple[Obj, bool]:
        """Returns ``(object or Status, finished)``: finished is False while the
        object lingers (finalizers, graceful pod termination). ``collection``:
        one item of a deletecollection, admitted (as upstream) without a name."""
        if propagation_policy not in (None, "", "Orphan", "Background", "Foreground"):
            raise errors.invalid("DeleteOptions", "", [errors.not_supported(
                "propagationPolicy", propagation_policy, ["Foreground", "Background", "Orphan", "nil"])],
                group=errors.META_GROUP)
        if grace_period_seconds is not None and grace_period_seconds < 0:
            grace_period_seconds = 0
        key = self._key(res, name, namespace)
        options = operation_options(
            "DeleteOptions", dry_run=dry_run, gracePeriodSeconds=grace_period_seconds,
            propagationPolicy=propagation_policy or None, preconditions=preconditions or None)
        adm_name = "" if collection else name
        attrs = Attributes(DELETE, res, adm_name, _admission_namespace(res, name, namespace), None, None,
                           dry_run=dry_run, options=options)
        # upstream's DefaultGarbageCollectionPolicy: what a delete that names no policy does
        policy = propagation_policy or self.strategy(res).default_gc_policy
        await self._turns.acquire(key)
        try:
            return await self._delete_locked(
                res, key, name, grace_period_seconds, policy, preconditions, dry_run, attrs)
        finally:
            self._turns.release(key)

    async def _delete_locked(
        self,
        res: ResourceInfo,
        key: str,
        name: str,
        grace_period_seconds: int | None,
        propagation_policy: str | None,
        preconditions: dict[str, str] | None,
        dry_run: bool,
        attrs: Attributes | None = None,
    ) -> tuple[Obj, bool]:
        retries = Retries(self._retry_seconds)
        kv = await self.store.get(key)
        while True:
            if kv is None:
                raise errors.not_found(res.plural, name, res.group)
            current = kv.value if res.custom is None else cr.to_version(res, kv.value)
            md = current.get("metadata") or {}
            if preconditions:
                want_uid = preconditions.get("uid")
                if want_uid and want_uid != md.get("uid"):
                    raise errors.conflict(res.plural, name, res.group, detail=(
                        f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: {md.get('uid')}"))
                want_rv = preconditions.get("resourceVersion")
                if want_rv and want_rv != str(kv.mod_revision):
                    raise errors.conflict(res.plural, name, res.group, detail=(
                        f"Precondition failed: ResourceVersion in precondition: {want_rv}, "
                        f"ResourceVersion in object meta: {kv.mod_revision}"))
            if attrs is not None:
                # upstream's AdmissionToValidateObjectDeleteFunc: both phases,
                # on the stored object, within the delete's retries (each
                # attempt a request of its own for reinvocation)
                attempt = dataclasses.replace(attrs, old_obj=current, reinvocation=ReinvocationContext())
                await self.admission.admit(attempt)
                await self.admission.validate(attempt)
            new = self._graceful(res, current, grace_period_seconds, propagation_policy)
            if new is current:
                return self._out(res, current), False  # already terminating: nothing changes
            try:
                if new is not None:
                    if dry_run:
                        return new, False
                    if res.custom is not None:
                        new = cr.to_storage(res, new)
                    kv2 = await self.store.update(key, new, expected_revision=kv.mod_revision)
                    await self.admission.written(res, kv2.mod_revision)
                    return self._out(res, kv2.value), False
                if dry_run:
                    return _status_success(res, name, md.get("uid")), True
                kv2 = await self.store.delete(key, expected_revision=kv.mod_revision)
            except RevisionConflictError as exc:
                kv = exc.current  # lost to another writer: decide again on its state
                await retries.again()
                continue
            except KeyNotFoundError:
                raise errors.not_found(res.plural, name, res.group) from None
            self._after_delete(res, kv2.value)
            await self.admission.written(res, kv2.mod_revision)
            if res.key == ("", "pods"):
                return kv2.value, True
            return _status_success(res, name, md.get("uid")), True

    def _graceful(self, res: ResourceInfo, current: Obj, grace: int | None,
                  propagation: str | None = None) -> Obj | None:
        """The object to store instead of deleting it, or None to delete now."""
        md = current.get("metadata") or {}
        finalizers = list(md.get("finalizers") or [])
        # The garbage collector finishes these: it deletes dependents first
        # (Foreground) or strips their owner references (Orphan).
        gc_finalizer = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(propagation or "")
        if gc_finalizer and not md.get("deletionTimestamp"):
            finalizers = [f for f in finalizers if f not in ("foregroundDeletion", "orphan")] + [gc_finalizer]
            current = {**current, "metadata": {**md, "finalizers": finalizers}}
        is_ns = res.key == ("", "namespaces")
        if res.key == (cr.CRDS_GROUP, "customresourcedefinitions") and not md.get("deletionTimestamp"):
            # upstream's CRD REST: the first delete adds the cleanup finalizer, so
            # the custom resources go before the CRD does
            current = cr.mark_crd_terminating(current, self._now())
            md = current["metadata"]
            finalizers = list(md.get("finalizers") or [])
        pod_grace: int | None = None
        if res.key == ("", "pods"):
            spec = current.get("spec") or {}
            phase = (current.get("status") or {}).get("phase")
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", 30) or 0)
            # Unscheduled or finished pods go at once, as upstream.
            if spec.get("nodeName") and phase not in ("Succeeded", "Failed") and grace > 0:
                pod_grace = grace
        if not finalizers and pod_grace is None and not is_ns:
            return None
        if md.get("deletionTimestamp"):
            if pod_grace is not None and md.get("deletionGracePeriodSeconds", pod_grace) > pod_grace:
                new = deep_copy(current)
                new["metadata"]["deletionGracePeriodSeconds"] = pod_grace
                new["metadata"].pop("resourceVersion", None)
                return new
            # A terminating namespace goes once finalized (upstream's namespace REST).
            if not finalizers and pod_grace is None and not (is_ns and _spec_finalizers(current)):
                return None
            if not is_ns or (current.get("status") or {}).get("phase") == "Terminating":
                return current
            return self._ns_terminating(current)
        new = deep_copy(current)
        nmd = new["metadata"]
        nmd.pop("resourceVersion", None)
        nmd["deletionTimestamp"] = self._now()
        nmd["deletionGracePeriodSeconds"] = pod_grace if pod_grace is not None else 0
        if is_ns:
            new = self._ns_terminating(new)
        return new

    def _ns_terminating(self, ns: Obj) -> Obj:
        new = deep_copy(ns)
        new["metadata"].pop("resourceVersion", None)
        new["status"] = {"phase": "Terminating"}
        return new

    def _after_delete(self, res: ResourceInfo, obj: Obj) -> None:
        """Hook for cascading effects of a delete."""

    async def close(self) -> None:
        """Stops what admission runs in the background (the webhook
        configurations' watch, the webhook connection pool)."""
        await self.admission.close()


_PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


def _default_validator() -> Callable[[ResourceInfo, Obj, Obj | None], list[errors.Cause]]:
    # DRA objects carry CEL selectors that must compile at create time. Imported
    # here for start-up time: the CEL library loads when a registry is built,
    # not whenever this module is imported (clients import it for WatchOptions).
    from kubeplane.admission.policy_api import install as install_policies
    from kubeplane.dra.validation import install

    install()
    install_policies()
    return validate_object
