"""Admission webhooks: MutatingAdmissionWebhook and ValidatingAdmissionWebhook
(upstream's ``admission/plugin/webhook``).

:class:`WebhookSource` keeps the MutatingWebhookConfigurations and
ValidatingWebhookConfigurations compiled in memory, from a list and then a
watch of the store (upstream's informer-fed hook source): a request never
reads them from storage. The registry tells the chain about its own writes
(:meth:`AdmissionPlugin.written`), and the source waits for its watch to reach
that revision, so a configuration written through this server is in effect
for the next request.

For each request the plugins pick the webhooks whose rules (operations,
apiGroups, apiVersions, resources with ``*/status``/``pods/*`` forms, scope),
namespaceSelector (on the namespace's labels; a Namespace's own for Namespace
objects), objectSelector (new or old object) and matchConditions (CEL) match,
send each an AdmissionReview v1 over HTTPS (:mod:`kubeplane.registry.webhookclient`)
and act on the answer: a denial carries the webhook's status code and message,
a JSONPatch is applied (then defaulted and, later in the chain, validated),
warnings go back to the client. Mutating webhooks run one after the other in
configuration-name order; ``reinvocationPolicy: IfNeeded`` webhooks run once
more when a later webhook changed the object. Validating webhooks run
concurrently. failurePolicy decides what a call that failed means; a
webhook that may have side effects is not called on a dryRun request, which
fails instead, as upstream.

Configurations of admissionregistration.k8s.io itself are never sent to
webhooks (upstream's exemption), so a broken webhook cannot lock itself in.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from kubeplane.api import errors
from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, new_uid
from kubeplane.api.resources import ResourceInfo
from kubeplane.api.selectors import LabelSelector, label_selector_from_dict
from kubeplane.api.warning import add_warning
from kubeplane.auth.authorizer import AlwaysAllow
from kubeplane.registry.admissionrules import NAMESPACES, Rule, labels_of
from kubeplane.registry.admissionrules import object_selector_matches as _object_selector_matches
from kubeplane.registry.admission import CREATE, UPDATE, AdmissionPlugin, Attributes
from kubeplane.registry.webhookclient import CallError, WebhookClient
from kubeplane.storage.interface import CompactedError, Store, StorageError

log = logging.getLogger("kubeplane.registry.webhooks")

Obj = dict[str, Any]

GROUP = "admissionregistration.k8s.io"
MUTATING = "mutatingwebhookconfigurations"
VALIDATING = "validatingwebhookconfigurations"
PREFIX = f"/registry/{GROUP}/"

#: kinds whose requests no webhook sees (upstream's IsExemptAdmissionConfigurationResource)
EXEMPT_KINDS = frozenset({
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
})

_REINVOKE_KEY = "MutatingAdmissionWebhook"


@dataclass(slots=True)
class Hook:
    """One webhook of a configuration, compiled."""

    mutating: bool
    configuration: str
    name: str
    #: the identity reinvocation tracks (upstream: configuration/name/index)
    uid: str
    rules: tuple[Rule, ...]
    failure_policy: str
    side_effects: str | None
    timeout: float
    reinvocation: str
    client_config: Obj
    review_versions: tuple[str, ...]
    namespace_selector: Any
    object_selector: Any
    conditions: tuple[Any, ...] = ()
    #: a condition that did not compile (the configuration predates a check)
    condition_error: str | None = None
    _ns_sel: LabelSelector | None | StatusError = field(default=None)
    _obj_sel: LabelSelector | None | StatusError = field(default=None)

    @property
    def ignore_failures(self) -> bool:
        return self.failure_policy == "Ignore"

    def selector(self, which: str) -> LabelSelector:
        cached = self._ns_sel if which == "ns" else self._obj_sel
        if cached is None:
            raw = self.namespace_selector if which == "ns" else self.object_selector
            try:
                cached = label_selector_from_dict(raw if isinstance(raw, dict) else {})
            except StatusError as err:
                cached = errors.internal(f"Internal error occurred: {err.message}")
            if which == "ns":
                self._ns_sel = cached
            else:
                self._obj_sel = cached
        if isinstance(cached, StatusError):
            raise cached
        return cached


def compile_configuration(obj: Obj, mutating: bool) -> list[Hook]:
    """The hooks of one stored configuration (defaults applied as upstream's)."""
    md = obj.get("metadata") or {}
    config = str(md.get("name") or "")
    hooks: list[Hook] = []
    # the CEL library is imported with the first configuration, not at start-up
    from kubeplane.registry import matchconditions
    for i, wh in enumerate(obj.get("webhooks") or []):
        if not isinstance(wh, dict):
            continue
        conditions: list[Any] = []
        condition_error = None
        for mc in wh.get("matchConditions") or []:
            if not isinstance(mc, dict):
                continue
            try:
                conditions.append(matchconditions.compile_condition(str(mc.get("name") or ""),
                                                                    str(mc.get("expression") or "")))
            except matchconditions.CompileError as err:
                condition_error = err.message
        timeout = wh.get("timeoutSeconds")
        hooks.append(Hook(
            mutating=mutating,
            configuration=config,
            name=str(wh.get("name") or ""),
            uid=f"{config}/{wh.get('name')}/{i}",
            rules=tuple(Rule.from_dict(r) for r in wh.get("rules") or []),
            failure_policy=str(wh.get("failurePolicy") or "Fail"),
            side_effects=wh.get("sideEffects"),
            timeout=float(timeout) if isinstance(timeout, int) and not isinstance(timeout, bool) else 10.0,
            reinvocation=str(wh.get("reinvocationPolicy") or "Never"),
            client_config=wh.get("clientConfig") if isinstance(wh.get("clientConfig"), dict) else {},
            review_versions=tuple(wh.get("admissionReviewVersions") or ()),
            namespace_selector=wh.get("namespaceSelector"),
            object_selector=wh.get("objectSelector"),
            conditions=tuple(conditions),
            condition_error=condition_error,
        ))
    return hooks


class WebhookSource:
    """The webhook configurations, kept current by a watch of the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._configs: dict[str, tuple[str, list[Hook]]] = {}  # key -> (name, hooks)
        self._mutating: tuple[Hook, ...] = ()
        self._validating: tuple[Hook, ...] = ()
        self._revision = 0
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None
        self._advanced: asyncio.Condition | None = None
        self._closed = False
        #: the configurations were read at least once (until then every
        #: request is refused, as upstream's plugins refuse before they sync)
        self._synced = False

    # -- lifecycle ---------------------------------------------------------

    async def _ensure(self) -> None:
        if self._ready is None:
            self._ready = asyncio.Event()
            self._advanced = asyncio.Condition()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="webhook-configurations")
        if not self._ready.is_set():
            await self._ready.wait()

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _list(self) -> int:
        configs: dict[str, tuple[str, list[Hook]]] = {}
        start = ""
        while True:
            result = await self.store.list(PREFIX, limit=500, start_after=start, revision=0 if not start else rev)
            rev = result.revision
            for kv in result.items:
                compiled = self._compile(kv.key, kv.value)
                if compiled is not None:
                    configs[kv.key] = compiled
                start = kv.key
            if not result.more:
                break
        self._configs = configs
        self._rebuild()
        self._synced = True
        return rev

    def _compile(self, key: str, value: Obj) -> tuple[str, list[Hook]] | None:
        if key.startswith(PREFIX + MUTATING + "/"):
            mutating = True
        elif key.startswith(PREFIX + VALIDATING + "/"):
            mutating = False
        else:
            return None
        try:
            return str((value.get("metadata") or {}).get("name") or ""), compile_configuration(value, mutating)
        except Exception:  # noqa: BLE001 - a stored object the compiler cannot read is left out, logged
            log.exception("cannot read webhook configuration %s", key)
            return None

    def _rebuild(self) -> None:
        ordered = sorted(self._configs.values(), key=lambda c: c[0])
        self._mutating = tuple(h for _, hooks in ordered for h in hooks if h.mutating)
        self._validating = tuple(h for _, hooks in ordered for h in hooks if not h.mutating)

    async def _run(self) -> None:
        assert self._ready is not None and self._advanced is not None
        backoff = 0.05
        while not self._closed:
            try:
                rev = await self._list()
                await self._advance(rev)
                self._ready.set()
                watch = self.store.watch(PREFIX, rev)
                try:
                    while True:
                        batch = await watch.next_batch(None)
                        if batch is None:
                            return  # the store is closing
                        for ev in batch:
                            if ev.type == "DELETED":
                                self._configs.pop(ev.key, None)
                            else:
                                compiled = self._compile(ev.key, ev.value)
                                if compiled is not None:
                                    self._configs[ev.key] = compiled
                        self._rebuild()
                        await self._advance(batch[-1].revision if batch else rev)
                        backoff = 0.05
                finally:
                    watch.close()
            except asyncio.CancelledError:
                raise
            except (CompactedError, StorageError) as exc:
                log.info("webhook configuration watch restarts: %s", exc)
            except Exception:  # noqa: BLE001 - keep serving the last configurations; retry
                log.exception("webhook configuration watch failed")
            self._ready.set()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _advance(self, revision: int) -> None:
        assert self._advanced is not None
        async with self._advanced:
            if revision > self._revision:
                self._revision = revision
            self._advanced.notify_all()

    async def caught_up(self, revision: int, timeout: float = 2.0) -> bool:
        """Wait until the configurations reflect ``revision`` (bounded)."""
        await self._ensure()
        assert self._advanced is not None
        if self._synced and self._revision >= revision:
            return True
        try:
            async with asyncio.timeout(timeout):
                async with self._advanced:
                    await self._advanced.wait_for(lambda: self._synced and self._revision >= revision)
            return True
        except TimeoutError:
            return False

    async def hooks(self, mutating: bool, attrs: Attributes | None = None) -> tuple[Hook, ...]:
        await self._ensure()
        if not self._synced:
            res = attrs.resource if attrs is not None else None
            name = attrs.name if attrs is not None else ""
            what = (f'{res.qualified} "{name}"' if name else res.qualified) if res is not None else "request"
            raise StatusError(403, "Forbidden", f"{what} is forbidden: not yet ready to handle request",
                              name=name, group=res.group if res else None, kind=res.plural if res else None)
        return self._mutating if mutating else self._validating


def _check_match_conditions(res: ResourceInfo, obj: Obj, old: Obj | None) -> list[errors.Cause]:
    """matchConditions must compile (upstream checks them when they change)."""
    old_hooks = (old or {}).get("webhooks") if isinstance((old or {}).get("webhooks"), list) else []
    out: list[errors.Cause] = []
    hooks = obj.get("webhooks") if isinstance(obj.get("webhooks"), list) else []
    if old is not None and len(hooks) == len(old_hooks) and all(
            isinstance(h, dict) and isinstance(o, dict) and h.get("matchConditions") == o.get("matchConditions")
            for h, o in zip(hooks, old_hooks)):
        return out
    for i, hook in enumerate(hooks):
        conds = hook.get("matchConditions") if isinstance(hook, dict) else None
        for j, mc in enumerate(conds if isinstance(conds, list) else []):
            expr = mc.get("expression") if isinstance(mc, dict) else None
            if not isinstance(expr, str) or not expr.strip():
                continue
            from kubeplane.registry import matchconditions

            try:
                matchconditions.compile_condition(str(mc.get("name") or ""), expr)
            except matchconditions.CompileError as err:
                out.append(errors.invalid_value(f"webhooks[{i}].matchConditions[{j}].expression", expr.strip(),
                                                err.message))
    return out


def _install_validators() -> None:
    from kubeplane.api.validation import extra_validators

    for plural in (MUTATING, VALIDATING):
        checks = extra_validators.setdefault(f"{plural}.{GROUP}", [])
        if _check_match_conditions not in checks:
            checks.append(_check_match_conditions)


_install_validators()


# -- matching -----------------------------------------------------------------


def exempt(attrs: Attributes) -> bool:
    return attrs.kind[0] == GROUP and attrs.kind[2] in EXEMPT_KINDS


def rules_match(hook: Hook, attrs: Attributes) -> bool:
    # webhooks are matched exactly: kubeplane serves each resource in one
    # version and does not convert the reviewed object to a rule's version
    return any(r.matches(attrs.operation, attrs.resource, attrs.namespace or "", attrs.subresource or "")
               for r in hook.rules)


def object_selector_matches(hook: Hook, attrs: Attributes) -> bool:
    return _object_selector_matches(hook.selector("obj"), attrs.obj, attrs.old_obj)


async def namespace_selector_matches(hook: Hook, attrs: Attributes, store: Store) -> bool:
    res = attrs.resource
    is_ns = res.key == NAMESPACES.key
    if not attrs.namespace and not is_ns:
        return True  # a cluster-scoped object other than a namespace is never exempted
    sel = hook.selector("ns")
    if sel.empty:
        return True
    if is_ns and not attrs.subresource and attrs.operation in (CREATE, UPDATE):
        return sel.matches(labels_of(attrs.obj))
    name = attrs.name if is_ns else attrs.namespace
    kv = await store.get(NAMESPACES.storage_key(name or ""))
    if kv is None:
        raise errors.not_found("namespaces", name or "")
    return sel.matches(labels_of(kv.value))


def _gvk(kind: tuple[str, str, str]) -> Obj:
    return {"group": kind[0], "version": kind[1], "kind": kind[2]}


def request_fields(attrs: Attributes) -> Obj:
    """The AdmissionRequest without uid and objects (the CEL ``request``)."""
    res = attrs.resource
    gvr = {"group": res.group, "version": res.version, "resource": res.plural}
    out: Obj = {"kind": _gvk(attrs.kind), "resource": gvr}
    if attrs.subresource:
        out["subResource"] = attrs.subresource
    out["requestKind"] = _gvk(attrs.kind)
    out["requestResource"] = dict(gvr)
    if attrs.subresource:
        out["requestSubResource"] = attrs.subresource
    if attrs.name:
        out["name"] = attrs.name
    if attrs.namespace:
        out["namespace"] = attrs.namespace
    out["operation"] = attrs.operation
    out["userInfo"] = attrs.user.to_api()
    out["dryRun"] = bool(attrs.dry_run)
    if attrs.options is not None:
        out["options"] = attrs.options
    return out


def build_review(attrs: Attributes, uid: str) -> Obj:
    """The AdmissionReview v1 sent to a webhook."""
    request = {"uid": uid, **request_fields(attrs)}
    request["object"] = attrs.obj
    request["oldObject"] = attrs.old_obj
    # field order as upstream's encoding: objects, then dryRun and options
    for k in ("dryRun", "options"):
        if k in request:
            request[k] = request.pop(k)
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


@dataclass(slots=True)
class Verdict:
    allowed: bool
    status: Obj | None
    patch: list | None
    warnings: list[str]


def verify_response(body: Any, uid: str, mutating: bool) -> Verdict:
    """Upstream's VerifyAdmissionResponse for v1; ValueError with its wording."""
    if not isinstance(body, dict):
        raise ValueError("json: cannot unmarshal the response into an AdmissionReview")
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if api_version != "admission.k8s.io/v1" or kind != "AdmissionReview":
        group, _, version = str(api_version or "").rpartition("/")
        got = f"{group}/{version}, Kind={kind or ''}" if group else f"/{version}, Kind={kind or ''}"
        raise ValueError(f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {got}")
    response = body.get("response")
    if not isinstance(response, dict):
        raise ValueError("webhook response was absent")
    if response.get("uid") != uid:
        raise ValueError(f'expected response.uid="{uid}", got "{response.get("uid") or ""}"')
    patch_raw = response.get("patch")
    patch_type = response.get("patchType")
    has_patch = bool(patch_raw)
    if patch_type is not None and patch_type == "":
        raise ValueError('webhook returned invalid response.patchType of ""')
    if mutating and has_patch:
        if patch_type is None:
            raise ValueError("webhook returned response.patch but not response.patchType")
        if patch_type != "JSONPatch":
            raise ValueError(f'webhook returned invalid response.patchType of "{patch_type}"')
    elif not mutating and (has_patch or patch_type is not None):
        raise ValueError("validating webhook may not return response.patch or response.patchType")
    patch = None
    if has_patch:
        try:
            patch = orjson.loads(base64.b64decode(str(patch_raw), validate=True))
        except (binascii.Error, ValueError, orjson.JSONDecodeError) as exc:
            raise _UndecodablePatch(str(exc)) from None
        if not isinstance(patch, list):
            raise _UndecodablePatch("json: cannot unmarshal the patch into a JSON patch")
    warnings = response.get("warnings")
    status = response.get("status")
    return Verdict(
        allowed=response.get("allowed") is True,
        status=status if isinstance(status, dict) else None,
        patch=patch,
        warnings=[w for w in warnings if isinstance(w, str)] if isinstance(warnings, list) else [],
    )


class _UndecodablePatch(ValueError):
    pass


def denial(hook_name: str, status: Obj | None) -> StatusError:
    """A webhook's refusal as upstream's ToStatusErr makes it: the webhook's
    status (code, reason, details) with the message naming the webhook."""
    status = dict(status or {})
    message = status.get("message") if isinstance(status.get("message"), str) else ""
    reason = status.get("reason") if isinstance(status.get("reason"), str) else ""
    denied_by = f'admission webhook "{hook_name}" denied the request'
    if message:
        text = f"{denied_by}: {message}"
    elif reason:
        text = f"{denied_by}: {reason}"
    else:
        text = f"{denied_by} without explanation"
    code = status.get("code")
    if not isinstance(code, int) or isinstance(code, bool) or not 100 <= code <= 599:
        code = 0
    if not isinstance(status.get("details"), dict):
        status.pop("details", None)
    try:
        err = StatusError.from_status({**status, "code": code or 500}, 500)
    except (TypeError, ValueError, AttributeError):
        err = StatusError(code or 500, "", text)
    # a Failure without a code is answered as an internal error upstream
    err.code = code or 500
    err.reason = reason
    err.message = text
    err.args = (text,)
    return err


def internal_error(message: str) -> StatusError:
    """upstream's NewInternalError."""
    return StatusError(500, "InternalError", f"Internal error occurred: {message}",
                       causes=[errors.Cause("", message, "")])


# -- the plugins ----------------------------------------------------------------


class _WebhookPlugin(AdmissionPlugin):
    mutating: bool = True
    watched_groups = frozenset({GROUP})

    def __init__(self, source: WebhookSource, store: Store, client: WebhookClient | None = None) -> None:
        self.source = source
        self.store = store
        self.client = client if client is not None else WebhookClient(store)
        #: answers matchConditions' ``authorizer`` checks (AdmissionChain.set_authorizer)
        self.authorizer: Any = AlwaysAllow()

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return True

    async def written(self, res: ResourceInfo, revision: int) -> None:
        if res.plural in (MUTATING, VALIDATING):
            if not await self.source.caught_up(revision):
                log.warning("webhook configurations did not reach revision %d in time", revision)

    async def close(self) -> None:
        await self.source.close()
        await self.client.close()

    async def _invocation(self, hook: Hook, attrs: Attributes) -> bool:
        """Whether ``hook`` is to be called (upstream's ShouldCallHook)."""
        if not rules_match(hook, attrs):
            return False
        if not await namespace_selector_matches(hook, attrs, self.store):
            return False
        if not object_selector_matches(hook, attrs):
            return False
        if hook.condition_error is not None or hook.conditions:
            res = attrs.resource
            failed: list[str] = []
            if hook.condition_error is not None:
                failed.append(hook.condition_error)
            else:
                from kubeplane.registry import matchconditions

                act = matchconditions.activation(attrs.obj, attrs.old_obj, request_fields(attrs))
                matches, failed = matchconditions.match(list(hook.conditions), act, self.authorizer, attrs.user)
                if not matches:
                    return False
            if failed:
                if hook.ignore_failures:
                    return False
                text = failed[0] if len(failed) == 1 else "[" + ", ".join(failed) + "]"
                what = f'{res.qualified} "{attrs.name}"' if attrs.name else res.qualified
                raise StatusError(403, "Forbidden", f"{what} is forbidden: {text}",
                                  name=attrs.name, group=res.group, kind=res.plural)
        return True

    def _dry_run_check(self, hook: Hook, attrs: Attributes) -> CallError | None:
        if not attrs.dry_run:
            return None
        if hook.side_effects is None:
            return CallError(hook.name, "Webhook SideEffects is nil")
        if hook.side_effects not in ("None", "NoneOnDryRun"):
            raise errors.bad_request(f'admission webhook "{hook.name}" does not support dry run')
        return None

    async def _call(self, hook: Hook, attrs: Attributes) -> Verdict:
        """One call; :class:`CallError` when calling failed, StatusError for
        what fails whatever the failure policy."""
        err = self._dry_run_check(hook, attrs)
        if err is not None:
            raise err
        uid = new_uid()
        review = build_review(attrs, uid)
        body = await self.client.post(hook, review)
        try:
            return verify_response(body, uid, hook.mutating)
        except _UndecodablePatch as exc:
            raise CallError(hook.name, f"received undecodable patch in webhook response: {exc}") from None
        except ValueError as exc:
            raise CallError(hook.name, f"received invalid webhook response: {exc}") from None


class MutatingAdmissionWebhook(_WebhookPlugin):
    name = "MutatingAdmissionWebhook"
    mutating = True

    async def admit(self, attrs: Attributes) -> None:
        if exempt(attrs):
            return
        hooks = await self.source.hooks(True, attrs)
        if not hooks:
            return
        ctx = attrs.reinvocation
        state = ctx.values.get(_REINVOKE_KEY)
        if state is None:
            # upstream's webhookReinvokeContext
            state = ctx.values[_REINVOKE_KEY] = {"previous": set(), "reinvoke": set(), "last": None}

        def require_reinvoking() -> None:
            state["reinvoke"] |= state["previous"]
            state["previous"] = set()

        if ctx.is_reinvoke and attrs.obj != state["last"]:
            require_reinvoking()  # built-in plugins changed the object since the webhooks ran
        try:
            for hook in hooks:
                if not await self._invocation(hook, attrs):
                    continue
                if ctx.is_reinvoke and hook.uid not in state["reinvoke"]:
                    continue  # a webhook is never called for the first time on reinvocation
                changed = False
                failure: StatusError | None = None
                try:
                    verdict = await self._call(hook, attrs)
                    for w in verdict.warnings:
                        add_warning(w)
                    if not verdict.allowed:
                        failure = denial(hook.name, verdict.status)
                    elif verdict.patch:
                        changed = self._apply_patch(hook, attrs, verdict.patch)
                except CallError as exc:
                    if not hook.ignore_failures:
                        failure = internal_error(str(exc))
                    else:
                        log.warning("failed calling webhook, failing open %s: %s", hook.name, exc)
                if changed:
                    require_reinvoking()
                    ctx.should_reinvoke = True
                if hook.reinvocation == "IfNeeded":
                    state["previous"].add(hook.uid)
                if failure is not None:
                    raise failure
        finally:
            state["last"] = deep_copy(attrs.obj) if attrs.obj is not None else None

    def _apply_patch(self, hook: Hook, attrs: Attributes, patch: list) -> bool:
        from kubeplane.api import patch as patching

        if attrs.obj is None:
            raise internal_error(
                f'admission webhook "{hook.name}" attempted to modify the object, which is not supported for this '
                "operation")
        try:
            patched = patching.json_patch(attrs.obj, patch)
        except StatusError as err:
            raise internal_error(err.message) from None
        if not isinstance(patched, dict):
            raise internal_error("the patch did not produce an object")
        if attrs.defaulter is not None:
            try:
                attrs.defaulter(patched)
            except StatusError as err:
                raise internal_error(err.message) from None
            except (ValueError, TypeError, AttributeError) as exc:
                raise internal_error(str(exc)) from None
        if patched == attrs.obj:
            return False
        # in place: the registry carries on with the same dict
        attrs.obj.clear()
        attrs.obj.update(patched)
        return True


class ValidatingAdmissionWebhook(_WebhookPlugin):
    name = "ValidatingAdmissionWebhook"
    mutating = False

    async def validate(self, attrs: Attributes) -> None:
        if exempt(attrs):
            return
        hooks = await self.source.hooks(False, attrs)
        if not hooks:
            return
        chosen = [h for h in hooks if await self._invocation(h, attrs)]
        if not chosen:
            return
        results = await asyncio.gather(*(self._one(h, attrs) for h in chosen), return_exceptions=True)
        for r in results:  # the first error in webhook order, as upstream
            if isinstance(r, BaseException):
                raise r

    async def _one(self, hook: Hook, attrs: Attributes) -> None:
        try:
            verdict = await self._call(hook, attrs)
        except CallError as exc:
            if hook.ignore_failures:
                log.warning("failed calling webhook, failing open %s: %s", hook.name, exc)
                return
            raise internal_error(str(exc)) from None
        for w in verdict.warnings:
            add_warning(w)
        if not verdict.allowed:
            raise denial(hook.name, verdict.status)


__all__ = [
    "Hook",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "WebhookSource",
    "build_review",
    "compile_configuration",
    "denial",
    "rules_match",
    "verify_response",
]
