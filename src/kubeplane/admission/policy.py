"""The ValidatingAdmissionPolicy admission plugin (upstream's
``k8s.io/apiserver/pkg/admission/plugin/policy/validating``).

For each request the plugin finds the policies whose ``matchConstraints``
match it, then each of their bindings whose ``matchResources`` match, the
binding's params (``paramRef``, for a policy with a ``paramKind``), checks the
policy's ``matchConditions`` and evaluates its validations and
auditAnnotations. A failed validation is acted on as the binding's
``validationActions`` say: ``Deny`` refuses the request (the first denial
wins, as upstream: ``ValidatingAdmissionPolicy 'p' with binding 'b' denied
request: ...``, with the validation's reason and its HTTP code), ``Warn``
sends the client a warning, ``Audit`` records the failure in the request's
audit annotations. An error (a missing param, a runtime error, a policy that
does not compile) follows the policy's ``failurePolicy``.

Policies, bindings, namespaces and params are read from caches fed by store
watches. Each request first takes whatever the watches have delivered (the
store fans events out as it commits them), so a policy or binding written
before a request applies to it. A policy is compiled once per generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from kubeplane.admission.policy_api import default_binding, default_policy
from kubeplane.api import errors
from kubeplane.api.resources import CATALOGUE, Catalogue, ResourceInfo, resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.api.warning import add_warning
from kubeplane.auth.authorizer import AlwaysAllow, Authorizer
from kubeplane.auth.user import current_user
from kubeplane.registry.admission import AdmissionPlugin
from kubeplane.registry.admissionrules import NAMESPACES, Rule, labels_of, object_selector_matches
from kubeplane.storage.interface import CompactedError, Store

if TYPE_CHECKING:
    from kubeplane.admission import cel

log = logging.getLogger("kubeplane.admission.policy")

Obj = dict[str, Any]

GROUP = "admissionregistration.k8s.io"
POLICIES = resource("validatingadmissionpolicies", GROUP)
BINDINGS = resource("validatingadmissionpolicybindings", GROUP)

#: the audit annotation key of failed validations with the Audit action
AUDIT_FAILURE_KEY = "validation.policy.admission.k8s.io/validation_failure"

#: upstream's celconfig.MaxEvaluatedMessageExpressionSizeBytes and audit annotation value limit
MAX_MESSAGE_BYTES = 5 * 1024
MAX_ANNOTATION_BYTES = 10 * 1024

_REASON_CODES = {"Unauthorized": 401, "Forbidden": 403, "RequestEntityTooLarge": 413, "Invalid": 422}

#: how often a cache asks its watch even when nothing is buffered
FULL_CHECK_SECONDS = 1.0


class WatchedCache:
    """The objects under one store prefix, kept by a watch that is drained
    on demand (:meth:`sync`); a watch that fell behind is replaced by a relist."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self.items: dict[str, Obj] = {}
        self._watch: Any = None
        #: bumped on every change, so derived indexes know when to rebuild
        self.version = 0
        self._checked = 0.0

    def quiet(self) -> bool:
        """True when the watch has delivered nothing since the last sync (and
        was asked recently): the cache is up to date."""
        return (self._watch is not None and getattr(self._watch, "buffered_bytes", 1) == 0
                and time.monotonic() - self._checked < FULL_CHECK_SECONDS)

    async def sync(self) -> None:
        if self._watch is None:
            await self._relist()
            return
        now = time.monotonic()
        if getattr(self._watch, "buffered_bytes", 1) == 0 and now - self._checked < FULL_CHECK_SECONDS:
            return  # nothing delivered (a watch dropped for falling behind is found by the full check)
        self._checked = now
        try:
            batch = await self._watch.next_batch(timeout=0)
        except CompactedError:
            batch = None
        if batch is None:
            await self._relist()
            return
        for ev in batch:
            if ev.type == "DELETED":
                self.items.pop(ev.key, None)
            else:
                self.items[ev.key] = ev.value
        if batch:
            self.version += 1

    async def _relist(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        result = await self.store.list(self.prefix)
        self._checked = time.monotonic()
        self.items = {kv.key: kv.value for kv in result.items}
        try:
            self._watch = self.store.watch(self.prefix, result.revision)
        except CompactedError:
            self._watch = None
        self.version += 1

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None


# ------------------------------------------------------------------ matching

@dataclass
class Request:
    """What the policies see of one request (upstream's admission.Attributes)."""

    operation: str
    resource: ResourceInfo
    name: str
    namespace: str
    obj: Obj | None
    old_obj: Obj | None
    subresource: str = ""
    dry_run: bool = False
    options: Obj | None = None
    user: Any = None
    kind: str = ""
    uid: str = ""


def _rules_match(rules: Iterable[Obj], req: Request, equivalent: bool) -> bool:
    return any(Rule.from_dict(r).matches(req.operation, req.resource, req.namespace, req.subresource, req.name,
                                         equivalent=equivalent)
               for r in rules if isinstance(r, dict))


class Matcher:
    """Upstream's matching.Matcher: namespace selector, object selector,
    excluded rules, then rules."""

    def __init__(self, namespaces: WatchedCache) -> None:
        self.namespaces = namespaces

    def namespace_object(self, req: Request) -> Obj | None:
        if not req.namespace:
            return None
        return self.namespaces.items.get(NAMESPACES.storage_key(req.namespace))

    def _namespacelabels_of(self, req: Request) -> dict | None:
        if req.resource.key == NAMESPACES.key:
            return labels_of(req.obj if req.obj is not None else req.old_obj)
        ns = self.namespace_object(req)
        return None if ns is None else labels_of(ns)

    def matches(self, mr: Obj | None, req: Request, *, require_rules: bool) -> bool:
        if not isinstance(mr, dict):
            return not require_rules
        ns_sel = mr.get("namespaceSelector")
        if ns_sel and (req.namespace or req.resource.key == NAMESPACES.key):
            selector = label_selector_from_dict(ns_sel)
            labels = self._namespacelabels_of(req)
            if labels is None or not selector.matches(labels):
                return False
        obj_sel = mr.get("objectSelector")
        if obj_sel and not object_selector_matches(label_selector_from_dict(obj_sel), req.obj, req.old_obj):
            return False
        equivalent = (mr.get("matchPolicy") or "Equivalent") == "Equivalent"
        if _rules_match(mr.get("excludeResourceRules") or [], req, equivalent):
            return False
        rules = mr.get("resourceRules") or []
        if not rules:
            return not require_rules
        return _rules_match(rules, req, equivalent)


# ---------------------------------------------------------------- compiling

@dataclass
class Validation:
    index: int
    expression: cel.Compiled
    message: str
    message_expression: cel.Compiled | None
    reason: str


@dataclass
class CompiledPolicy:
    name: str
    generation: Any
    policy: Obj
    failure_policy: str
    match_constraints: Obj | None
    param_kind: Obj | None
    match_conditions: list[tuple[str, cel.Compiled]] = field(default_factory=list)
    variables: dict[str, cel.Compiled] = field(default_factory=dict)
    validations: list[Validation] = field(default_factory=list)
    audit_annotations: list[tuple[str, cel.Compiled]] = field(default_factory=list)
    #: why the policy cannot be used (it is then an error for failurePolicy)
    error: str = ""


def compile_policy(policy: Obj) -> CompiledPolicy:
    # CEL is imported with the first policy, not at start-up (a cluster
    # without policies never needs it)
    from kubeplane.admission import cel

    policy = orjson.loads(orjson.dumps(policy))
    default_policy(policy)
    md = policy.get("metadata") or {}
    spec = policy.get("spec") if isinstance(policy.get("spec"), dict) else {}
    cp = CompiledPolicy(
        name=md.get("name", ""), generation=(md.get("uid"), md.get("generation"), md.get("resourceVersion")),
        policy=policy, failure_policy=spec.get("failurePolicy") or "Fail",
        match_constraints=spec.get("matchConstraints"), param_kind=spec.get("paramKind"),
    )
    has_params = cp.param_kind is not None
    try:
        declared: list[str] = []
        for mc in spec.get("matchConditions") or []:
            cp.match_conditions.append((mc.get("name", ""), cel.compile_expression(
                mc["expression"], (cel.BOOL,), has_params=has_params)))
        for var in spec.get("variables") or []:
            cp.variables[var["name"]] = cel.compile_expression(var["expression"], (cel.ANY,),
                                                               has_params=has_params, variables=declared)
            declared.append(var["name"])
        for i, v in enumerate(spec.get("validations") or []):
            mexpr = v.get("messageExpression") or ""
            cp.validations.append(Validation(
                i, cel.compile_expression(v["expression"], (cel.BOOL,), has_params=has_params, variables=declared),
                (v.get("message") or "").strip(),
                cel.compile_expression(mexpr, (cel.STRING,), has_params=has_params, has_authorizer=False,
                                       variables=declared) if mexpr.strip() else None,
                v.get("reason") or "Invalid",
            ))
        for a in spec.get("auditAnnotations") or []:
            cp.audit_annotations.append((a["key"], cel.compile_expression(
                a["valueExpression"].strip(), (cel.STRING, cel.NULL), has_params=has_params, variables=declared)))
    except (cel.CELCompileError, KeyError, TypeError, AttributeError) as exc:
        cp.error = exc.message if isinstance(exc, cel.CELCompileError) else f"invalid policy: {exc}"
    return cp


# ---------------------------------------------------------------- decisions

@dataclass
class Denial:
    policy: str
    binding: str
    message: str
    reason: str = "Invalid"


class ValidatingAdmissionPolicyPlugin(AdmissionPlugin):
    """The plugin; registered in the admission chain's validating phase
    before ValidatingAdmissionWebhook."""

    name = "ValidatingAdmissionPolicy"

    def __init__(self, store: Store, *, catalogue: Catalogue = CATALOGUE,
                 authorizer: Authorizer | None = None) -> None:
        self.store = store
        self.catalogue = catalogue
        #: asked by the CEL authorizer library (AlwaysAllow until the server sets its own)
        self.authorizer: Authorizer = authorizer if authorizer is not None else AlwaysAllow()
        self.policies = WatchedCache(store, POLICIES.storage_prefix())
        self.bindings = WatchedCache(store, BINDINGS.storage_prefix())
        self.namespaces = WatchedCache(store, NAMESPACES.storage_prefix())
        self.params: dict[str, WatchedCache] = {}
        self.matcher = Matcher(self.namespaces)
        self._compiled: dict[str, CompiledPolicy] = {}
        self._by_policy: dict[str, list[Obj]] = {}
        self._index_version = (-1, -1)
        self._sync_lock: asyncio.Lock | None = None

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        # Policies never apply to the policy kinds themselves, as upstream.
        return res.key not in (POLICIES.key, BINDINGS.key)

    async def close(self) -> None:
        for c in (self.policies, self.bindings, self.namespaces, *self.params.values()):
            c.close()

    # -- caches ---------------------------------------------------------

    async def _sync(self) -> None:
        # One request at a time drains the watches (a watch has one reader).
        if self._sync_lock is None:
            self._sync_lock = asyncio.Lock()
        async with self._sync_lock:
            await self._sync_locked()

    async def _sync_locked(self) -> None:
        await self.policies.sync()
        await self.bindings.sync()
        if not self.policies.items:
            if self._compiled or self.params:
                self._compiled, self._by_policy = {}, {}
                self._index_version = (-1, -1)
                for cache in self.params.values():
                    cache.close()
                self.params = {}
            return
        await self.namespaces.sync()
        version = (self.policies.version, self.bindings.version)
        if version != self._index_version:
            self._reindex()
            self._index_version = version
        wanted: set[str] = set()
        for cp in self._compiled.values():
            pk = cp.param_kind
            if isinstance(pk, dict):
                res = self._param_resource(pk)
                if res is not None:
                    prefix = res.storage_prefix()
                    wanted.add(prefix)
                    cache = self.params.get(prefix)
                    if cache is None:
                        cache = self.params[prefix] = WatchedCache(self.store, prefix)
                    await cache.sync()
        for prefix in [p for p in self.params if p not in wanted]:
            self.params.pop(prefix).close()  # no policy reads this kind any more

    def _reindex(self) -> None:
        compiled: dict[str, CompiledPolicy] = {}
        for policy in self.policies.items.values():
            md = policy.get("metadata") or {}
            name = md.get("name", "")
            gen = (md.get("uid"), md.get("generation"), md.get("resourceVersion"))
            old = self._compiled.get(name)
            if old is not None and old.generation[:2] == gen[:2]:
                old.generation = gen
                old.policy = {**old.policy, "status": policy.get("status")}
                compiled[name] = old
            else:
                compiled[name] = compile_policy(policy)
        self._compiled = compiled
        by_policy: dict[str, list[Obj]] = {}
        for b in self.bindings.items.values():
            b = orjson.loads(orjson.dumps(b))
            default_binding(b)
            pn = (b.get("spec") or {}).get("policyName")
            if isinstance(pn, str):
                by_policy.setdefault(pn, []).append(b)
        for lst in by_policy.values():
            lst.sort(key=lambda b: (b.get("metadata") or {}).get("name", ""))
        self._by_policy = by_policy

    def _param_resource(self, pk: Obj) -> ResourceInfo | None:
        return self.catalogue.by_api_version_kind(str(pk.get("apiVersion", "")), str(pk.get("kind", "")))

    # -- admission ------------------------------------------------------

    async def validate(self, attrs: Any) -> None:
        if not self.policies.items and self.policies.quiet():
            return  # no policy: nothing to do (the common case, kept cheap)
        await self._sync()
        if not self.policies.items:
            return
        req = _request_from(attrs)
        out = _Outcome()
        for name in sorted(self._compiled):
            cp = self._compiled[name]
            bindings = self._by_policy.get(name)
            if not bindings:
                continue
            if not self.matcher.matches(cp.match_constraints, req, require_rules=True):
                continue
            if cp.error:
                self._config_error(cp, None, cp.error, out.denials)
                continue
            out.policy_annotations = {}
            for binding in bindings:
                bspec = binding.get("spec") or {}
                if bspec.get("matchResources") is not None and \
                        not self.matcher.matches(bspec.get("matchResources"), req, require_rules=False):
                    continue
                bname = (binding.get("metadata") or {}).get("name", "")
                try:
                    params_list = self._params(cp, bspec, req)
                except _ConfigError as err:
                    self._config_error(cp, bname, err.message, out.denials)
                    continue
                for params in params_list:
                    self._evaluate(cp, binding, params, req, out)
            for key, values in out.policy_annotations.items():
                out.annotations.setdefault(f"{cp.name}/{key}", ", ".join(values))
        record = getattr(attrs, "audit_annotations", None)
        if isinstance(record, dict):
            for key, value in out.annotations.items():
                record.setdefault(key, value)
        if out.denials:
            raise _denied(out.denials[0], req)

    def _config_error(self, cp: CompiledPolicy, binding: str | None, message: str, denials: list[Denial]) -> None:
        if cp.failure_policy == "Ignore":
            return
        what = "binding" if binding is not None else "policy"
        denials.append(Denial(cp.name, binding or "", f"failed to configure {what}: {message}"))

    def _params(self, cp: CompiledPolicy, bspec: Obj, req: Request) -> list[Obj | None]:
        pk = cp.param_kind
        if not isinstance(pk, dict):
            return [None]
        ref = bspec.get("paramRef")
        kind_text = f"{pk.get('apiVersion')}, Kind={pk.get('kind')}"
        if not isinstance(ref, dict):
            raise _ConfigError(f"paramKind kind `{kind_text}` is defined but paramRef is not")
        res = self._param_resource(pk)
        if res is None:
            raise _ConfigError(f"failed to find resource referenced by paramKind: '{kind_text}'")
        cache = self.params.get(res.storage_prefix())
        items = cache.items if cache is not None else {}
        namespace = ""
        if res.namespaced:
            namespace = ref.get("namespace") or req.namespace
            if not namespace:
                raise _ConfigError("cannot use namespaced paramRef in policy binding that matches "
                                   "cluster-scoped resources")
        found: list[Obj | None] = []
        if ref.get("name"):
            obj = items.get(res.storage_key(ref["name"], namespace or None))
            if obj is not None:
                found.append(obj)
        elif ref.get("selector") is not None:
            selector = label_selector_from_dict(ref.get("selector"))
            prefix = res.storage_prefix(namespace or None)
            for key in sorted(items):
                if key.startswith(prefix) and selector.matches(labels_of(items[key])):
                    found.append(items[key])
        if not found:
            if ref.get("parameterNotFoundAction") == "Deny":
                raise _ConfigError("no params found for policy binding with `Deny` parameterNotFoundAction")
            return []
        return found

    def _evaluate(self, cp: CompiledPolicy, binding: Obj, params: Obj | None, req: Request,
                  out: "_Outcome") -> None:
        """One binding's evaluation of a policy with one param (upstream's validator)."""
        from kubeplane.admission import cel, cost

        bname = (binding.get("metadata") or {}).get("name", "")
        bspec = binding.get("spec") or {}
        actions = list(bspec.get("validationActions") or [])
        data = {
            "object": req.obj, "oldObject": req.old_obj, "request": _request_value(req),
            "namespaceObject": self.matcher.namespace_object(req) if req.resource.key != NAMESPACES.key else None,
            "authorizer": {cel._MARK: "authorizer", "requestResource": {
                cel._MARK: "resource", "group": req.resource.group, "resource": req.resource.plural,
                "subresource": req.subresource, "namespace": req.namespace, "name": req.name}},
        }
        if cp.param_kind is not None:
            data["params"] = params
        ev = cel.Evaluation(data, req.user, self.authorizer, cp.variables)
        fail_closed = cp.failure_policy != "Ignore"

        def failed(index: int, message: str, reason: str = "Invalid") -> None:
            """A validation that denies: acted on as the binding's actions say."""
            if "Deny" in actions:
                out.denials.append(Denial(cp.name, bname, message, reason))
            if "Warn" in actions:
                add_warning(f"Validation failed for ValidatingAdmissionPolicy '{cp.name}' with binding '{bname}': "
                            f"{message}")
            if "Audit" in actions and AUDIT_FAILURE_KEY not in out.annotations:
                # the first failure is the annotation (a record keeps one value per key)
                out.annotations[AUDIT_FAILURE_KEY] = orjson.dumps([{
                    "message": message, "policy": bspec.get("policyName", cp.name), "binding": bname,
                    "expressionIndex": index, "validationActions": actions}]).decode()

        # matchConditions: any false skips the policy; otherwise errors follow failurePolicy
        errs: list[str] = []
        for _cname, cond in cp.match_conditions:
            try:
                ok = cond.evaluate(ev)
            except cel.EvalError as err:
                errs.append(f"expression '{cond.expression}' resulted in error: {err.message}")
                continue
            if ok is not True:
                return
        if errs:
            if fail_closed:
                failed(0, errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
            return
        for v in cp.validations:
            try:
                ok = v.expression.evaluate(ev)
            except cel.EvalError as err:
                if err.message.startswith("validation failed due to running out of cost budget"):
                    if fail_closed:
                        failed(0, err.message)
                    break
                if fail_closed:
                    failed(v.index, f"expression '{v.expression.expression}' resulted in error: {err.message}")
                continue
            if ok is True:
                continue
            message = ""
            if v.message_expression is not None:
                try:
                    text = v.message_expression.evaluate(ev)
                except cel.EvalError as err:
                    if err.cost_exceeded:
                        if fail_closed:
                            failed(v.index, f"failed messageExpression: {err.message}")
                        continue
                    log.debug("messageExpression of policy %s failed: %s", cp.name, err.message)
                    text = None
                if isinstance(text, str):
                    text = text.strip()
                    if len(text) <= MAX_MESSAGE_BYTES and "\n" not in text:
                        message = text
            if not message:
                message = v.message or f"failed expression: {v.expression.expression.strip()}"
            failed(v.index, message, v.reason)
        # audit annotations have a budget of their own
        ev.budget = cost.RUNTIME_BUDGET
        for key, compiled in cp.audit_annotations:
            try:
                value = compiled.evaluate(ev)
            except cel.EvalError as err:
                if fail_closed:
                    out.denials.append(Denial(
                        cp.name, bname, f"expression '{compiled.expression}' resulted in error: {err.message}"))
                continue
            if isinstance(value, str) and value.strip():
                values = out.policy_annotations.setdefault(key, [])
                value = value.strip()[:MAX_ANNOTATION_BYTES]
                if value not in values:
                    values.append(value)


@dataclass
class _Outcome:
    denials: list[Denial] = field(default_factory=list)
    #: the request's audit annotations
    annotations: dict[str, str] = field(default_factory=dict)
    #: the current policy's annotation values by key, from all its bindings
    policy_annotations: dict[str, list[str]] = field(default_factory=dict)


class _ConfigError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _denied(d: Denial, req: Request) -> errors.StatusError:
    text = f"ValidatingAdmissionPolicy '{d.policy}' with binding '{d.binding}' denied request: {d.message}" \
        if d.binding else f"ValidatingAdmissionPolicy '{d.policy}' denied request: {d.message}"
    res = req.resource
    name = req.name or ((req.obj or {}).get("metadata") or {}).get("name") or ""
    what = f'{res.qualified} "{name}"' if name else res.qualified
    return errors.StatusError(_REASON_CODES.get(d.reason, 422), d.reason, f"{what} is forbidden: {text}",
                              name=name, group=res.group, kind=res.plural, causes=[errors.Cause("", text, "")])


def _attr(attrs: Any, *names: str) -> Any:
    """The first of ``names`` the admission record has set (tolerates the
    spellings the record's fields may take)."""
    for name in names:
        value = getattr(attrs, name, None)
        if value is not None:
            return value
    return None


def _request_from(attrs: Any) -> Request:
    res: ResourceInfo = attrs.resource
    user = _attr(attrs, "user", "user_info") or current_user()
    obj = _attr(attrs, "obj", "object")
    return Request(
        operation=attrs.operation, resource=res, name=attrs.name or "", namespace=attrs.namespace or "",
        obj=obj if attrs.operation != "DELETE" else None, old_obj=_attr(attrs, "old_obj", "old_object", "old"),
        subresource=_attr(attrs, "subresource") or "", dry_run=bool(_attr(attrs, "dry_run")),
        options=_attr(attrs, "options"), user=user, kind=res.kind, uid=_attr(attrs, "uid") or "",
    )


def _request_value(req: Request) -> Obj:
    res = req.resource
    kind = {"group": res.group, "version": res.version, "kind": res.kind}
    if req.subresource == "scale":
        kind = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    resource_ = {"group": res.group, "version": res.version, "resource": res.plural}
    out: Obj = {
        "uid": req.uid, "kind": kind, "resource": resource_, "subResource": req.subresource,
        "requestKind": kind, "requestResource": resource_, "requestSubResource": req.subresource,
        "name": req.name, "namespace": req.namespace, "operation": req.operation,
        "userInfo": req.user.to_api() if req.user is not None else {}, "dryRun": req.dry_run,
    }
    out["options"] = req.options if req.options is not None else _default_options(req.operation)
    return out


def _default_options(operation: str) -> Obj:
    kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}.get(operation)
    return {"kind": kind, "apiVersion": "meta.k8s.io/v1"} if kind else {}
