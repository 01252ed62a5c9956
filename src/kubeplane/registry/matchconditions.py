"""CEL ``matchConditions`` of admission webhooks (upstream's
``webhook/matchconditions``).

The environment has the variables upstream's has for webhooks: ``object``,
``oldObject`` (null when absent), ``request`` (the AdmissionRequest's
fields: kind, resource, subResource, requestKind, requestResource, name,
namespace, operation, userInfo, dryRun, options) and ``authorizer``, with
Kubernetes' authz library: ``authorizer.group(g).resource(r)``, then
``.subresource(s)``, ``.namespace(n)``, ``.name(n)``, ``.check(verb)``;
``authorizer.path(p).check(verb)``; ``authorizer.serviceAccount(ns, name)``;
``authorizer.requestResource``; a decision's ``allowed()``, ``reason()``,
``errored()``, ``error()``. Checks ask the API server's authorizer for the
request's user (or the service account named).

Compiled programs are cached by expression text; the runtime is
``cel-expr-python``, as for the DRA selectors.
"""

from __future__ import annotations

import contextvars
import re
import threading
from collections import OrderedDict
from typing import Any

from kubeplane.auth.authorizer import Attributes as AuthzAttributes, Decision
from kubeplane.auth.user import AUTHENTICATED, SERVICE_ACCOUNT_PREFIX, SERVICE_ACCOUNTS_GROUP, UserInfo

from cel_expr_python import cel as _cel
from cel_expr_python.ext import ext_strings

#: upstream's limit on one expression's length
MAX_EXPRESSION_LENGTH = 5 * 1024
#: upstream allows at most 64 match conditions per webhook
MAX_MATCH_CONDITIONS = 64

_T = _cel.Type
_M = _T.Map(_T.STRING, _T.DYN)
_K = "__authz__"

#: (authorizer, request user) of the evaluation under way
_checking: contextvars.ContextVar[tuple[Any, UserInfo] | None] = contextvars.ContextVar(
    "kubeplane_matchcondition_authz", default=None)


def _with(v: dict, kind: str, **fields: str) -> dict:
    if v.get(_K) not in _STEPS[kind]:
        raise ValueError(f"no such overload: {kind}")
    out = {k: x for k, x in v.items() if k != "requestResource"}
    out[_K] = _RESULT.get(kind, kind)
    out.update(fields)
    return out


#: which value each step may be called on
_STEPS = {
    "group": ("authorizer",), "path": ("authorizer",),
    "resource": ("group",), "subresource": ("resource",), "namespace": ("resource",), "name": ("resource",),
}


#: what each step gives
_RESULT = {"subresource": "resource", "namespace": "resource", "name": "resource"}


def _user(v: dict) -> UserInfo:
    current = _checking.get()
    sa = v.get("sa") or ""
    if sa:
        ns, _, name = sa.partition(":")
        return UserInfo(f"{SERVICE_ACCOUNT_PREFIX}{ns}:{name}",
                        groups=(SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{ns}", AUTHENTICATED))
    if current is None:
        raise ValueError("no authorizer for this evaluation")
    return current[1]


def _check(v: dict, verb: str) -> dict:
    kind = v.get(_K)
    current = _checking.get()
    if kind not in ("resource", "path") or current is None:
        raise ValueError("no such overload: check")
    if kind == "path":
        attrs = AuthzAttributes(_user(v), verb, resource_request=False, path=str(v.get("path") or ""))
    else:
        attrs = AuthzAttributes(_user(v), verb, namespace=str(v.get("namespace") or ""),
                                api_group=str(v.get("group") or ""), api_version="*",
                                resource=str(v.get("resource") or ""), subresource=str(v.get("subresource") or ""),
                                name=str(v.get("name") or ""))
    try:
        decision, reason = current[0].authorize(attrs)
    except Exception as exc:  # noqa: BLE001 - an authorizer failure is the decision's error()
        return {_K: "decision", "decision": "noopinion", "reason": "", "error": str(exc)}
    name = {Decision.ALLOW: "allow", Decision.DENY: "deny"}.get(decision, "noopinion")
    return {_K: "decision", "decision": name, "reason": reason or "", "error": ""}


def _decision(v: dict, field: str) -> Any:
    if v.get(_K) != "decision":
        raise ValueError(f"no such overload: {field}")
    if field == "allowed":
        return v.get("decision") == "allow"
    if field == "errored":
        return bool(v.get("error"))
    return str(v.get(field) or "")


def _service_account(v: dict, namespace: str, name: str) -> dict:
    if v.get(_K) != "authorizer":
        raise ValueError("no such overload: serviceAccount")
    return {_K: "authorizer", "sa": f"{namespace}:{name}"}


def _decls() -> list[Any]:
    F, O = _cel.FunctionDecl, _cel.Overload

    def member(oid: str, ret: Any, params: list[Any], impl: Any) -> Any:
        return O(oid, ret, params, is_member=True, impl=impl)

    steps = [F(step, [member(f"authz_{step}", _M, [_M, _T.STRING],
                             lambda v, arg, step=step: _with(v, step, **{step: arg}))])
             for step in ("group", "path", "resource", "subresource", "namespace", "name")]
    return steps + [
        F("check", [member("authz_check", _M, [_M, _T.STRING], _check)]),
        F("serviceAccount", [member("authz_service_account", _M, [_M, _T.STRING, _T.STRING], _service_account)]),
        F("allowed", [member("authz_allowed", _T.BOOL, [_M], lambda v: _decision(v, "allowed"))]),
        F("reason", [member("authz_reason", _T.STRING, [_M], lambda v: _decision(v, "reason"))]),
        F("errored", [member("authz_errored", _T.BOOL, [_M], lambda v: _decision(v, "errored"))]),
        F("error", [member("authz_error", _T.STRING, [_M], lambda v: _decision(v, "error"))]),
    ]


_ENV = _cel.NewEnv(
    variables={"object": _T.DYN, "oldObject": _T.DYN, "request": _T.DYN, "authorizer": _T.DYN},
    functions=_decls(),
    extensions=[ext_strings.ExtStrings()],
)


class CompileError(ValueError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _clean(text: str) -> str:
    text = text.strip()
    text = re.sub(r"^(INVALID_ARGUMENT|NOT_FOUND|OUT_OF_RANGE|UNKNOWN|INTERNAL|UNIMPLEMENTED): ", "", text)
    text = re.sub(r"\s*\[[A-Z_]+\]$", "", text)
    m = re.match(r'^Key not found in map : "(.*)"$', text)
    if m:
        return f"no such key: {m.group(1)}"
    return text


class Condition:
    __slots__ = ("name", "expression", "_program")

    def __init__(self, name: str, expression: str, program: Any) -> None:
        self.name = name
        self.expression = expression
        self._program = program

    def evaluate(self, activation: Any) -> bool:
        """True or False; :class:`RuntimeError` with upstream's wording on an error."""
        try:
            value = self._program.eval(activation)
        except RuntimeError as err:
            raise RuntimeError(f"expression '{self.expression}' resulted in error: {_clean(str(err))}") from None
        result = value.value()
        if isinstance(result, bool):
            return result
        if value.type() == _T.ERROR:
            raise RuntimeError(f"expression '{self.expression}' resulted in error: {_clean(str(result))}")
        raise RuntimeError(f"expression '{self.expression}' resulted in error: "
                           f"no such overload: expected bool, got {value.type().name().lower()}")


_MACRO = re.compile(r"\.\s*(all|exists_one|exists|map|filter)\s*\(")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')


def nested_comprehensions(expression: str) -> bool:
    """Whether a comprehension macro (all, exists, exists_one, map, filter)
    sits inside another's arguments. Over the unbounded lists and maps of an
    admission request that is quadratic or worse: upstream's cost estimate
    refuses such expressions, and the runtime here has no cost budget to stop
    one, so they are refused when written."""
    text = _STRING.sub(lambda m: " " * len(m.group(0)), expression)
    spans: list[tuple[int, int]] = []
    for m in _MACRO.finditer(text):
        depth, end = 0, len(text)
        for i in range(m.end() - 1, len(text)):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        spans.append((m.start(), end))
    return any(a < c < b for a, b in spans for c, _ in spans)


_cache: "OrderedDict[str, Any]" = OrderedDict()
_lock = threading.Lock()


def compile_condition(name: str, expression: str) -> Condition:
    """The compiled condition; :class:`CompileError` (``compilation failed: ...``)."""
    expression = expression.strip()
    with _lock:
        hit = _cache.get(expression)
        if hit is not None:
            _cache.move_to_end(expression)
    if hit is None:
        if len(expression) > MAX_EXPRESSION_LENGTH:
            hit = CompileError(f"compilation failed: expression too long ({len(expression)} characters, "
                               f"maximum {MAX_EXPRESSION_LENGTH})")
        else:
            try:
                program = _ENV.compile(expression)
                rtype = program.return_type()
                hit = program if rtype in (_T.BOOL, _T.DYN) else CompileError(
                    f"must evaluate to bool, got {rtype.name().lower()}")
                if not isinstance(hit, CompileError) and nested_comprehensions(expression):
                    hit = CompileError("estimated rule cost exceeds budget: nested comprehensions (all, exists, "
                                       "exists_one, map, filter) over the request's unbounded lists and maps")
            except RuntimeError as err:
                hit = CompileError("compilation failed: " + _clean(str(err)).replace("ERROR: <input>:", "ERROR: <input>:"))
        with _lock:
            _cache[expression] = hit
            if len(_cache) > 1024:
                _cache.popitem(last=False)
    if isinstance(hit, CompileError):
        raise CompileError(hit.message)
    return Condition(name, expression, hit)


def authorizer_value(request: dict[str, Any]) -> dict[str, Any]:
    """The ``authorizer`` variable of one request (its ``requestResource`` included)."""
    res = request.get("resource") or {}
    return {_K: "authorizer", "requestResource": {
        _K: "resource", "group": res.get("group", ""), "resource": res.get("resource", ""),
        "subresource": request.get("subResource", ""), "namespace": request.get("namespace", ""),
        "name": request.get("name", "")}}


def activation(obj: Any, old: Any, request: dict[str, Any]) -> Any:
    return _ENV.Activation(data={"object": obj, "oldObject": old, "request": request,
                                 "authorizer": authorizer_value(request)})


def match(conditions: list[Condition], act: Any, authorizer: Any = None,
          user: UserInfo | None = None) -> tuple[bool, list[str]]:
    """(matches, errors) as upstream's matcher decides: any condition False
    means no match (errors or not); otherwise errors decide by failure policy.
    ``authorizer`` (with the request's ``user``) answers the authz checks."""
    errs: list[str] = []
    token = _checking.set((authorizer, user) if authorizer is not None and user is not None else None)
    try:
        for c in conditions:
            try:
                if not c.evaluate(act):
                    return False, []
            except RuntimeError as err:
                errs.append(str(err))
    finally:
        _checking.reset(token)
    return True, errs
