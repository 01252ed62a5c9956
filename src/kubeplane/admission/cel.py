"""The CEL environment of admission expressions (ValidatingAdmissionPolicy
validations, messageExpressions, auditAnnotations, variables and
matchConditions), as upstream's ``k8s.io/apiserver/pkg/admission/plugin/cel``.

Variables: ``object``, ``oldObject`` (null when absent), ``request`` (the
admission request's attributes), ``params`` (only for a policy with a
paramKind), ``namespaceObject``, ``variables`` (the policy's composited
variables, each evaluated at most once per request and only when an
expression refers to it) and ``authorizer`` (not for messageExpressions).

Libraries: the CEL standard library with the string, math, encoder, optional
and bindings extensions, the Kubernetes libraries every kubeplane CEL
environment shares (:mod:`kubeplane.cel.library`: quantity and semver, URL,
IP and CIDR, regex ``find``/``findAll``, lists ``isSorted``, ``sum``, ``min``,
``max``; the string extension owns the names ``indexOf`` and ``lastIndexOf``,
so the list forms are missing), the sets library (``sets.contains``,
``sets.equivalent``, ``sets.intersects``) and the authorizer library::

    authorizer.group('apps').resource('deployments').namespace('ns').name('n').check('update').allowed()
    authorizer.path('/healthz').check('get').allowed()
    authorizer.serviceAccount('ns', 'sa').group('').resource('pods').check('list').reason()
    authorizer.requestResource.check('delete').errored()

Expressions are compiled once; :class:`Compiled` evaluates one against an
:class:`Evaluation` (the inputs of one request) after checking its cost
(:mod:`kubeplane.admission.cost`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from cel_expr_python import cel as _cel
from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_optional, ext_strings

from kubeplane.admission import ast, cost
from kubeplane.auth.authorizer import AlwaysAllow, Attributes as AuthzAttributes, Authorizer, Decision
from kubeplane.auth.user import SERVICE_ACCOUNT_PREFIX, SERVICE_ACCOUNTS_GROUP, AUTHENTICATED, UserInfo
from kubeplane.cel import library
from kubeplane.cel.library import clean_error

__all__ = [
    "BOOL", "STRING", "NULL", "ANY",
    "CELCompileError", "Compiled", "Evaluation", "EvalError", "compile_expression",
]

T = _cel.Type
#: return types an expression may be required to have (upstream's names)
BOOL, STRING, NULL, ANY = "bool", "string", "null_type", "any"
MAX_EXPRESSION_LENGTH = 5 * 1024 * 1024  # the request size bound; the API's own limits are smaller

#: the runtime's bound of comprehension iterations in one evaluation
MAX_ITERATIONS = 10_000

_AUTHZ = T.Map(T.STRING, T.DYN)
_MARK = "__k8s_authz__"


class CELCompileError(ValueError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EvalError(Exception):
    """An evaluation failed (its message as upstream words it)."""

    def __init__(self, message: str, *, cost_exceeded: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.cost_exceeded = cost_exceeded


# ------------------------------------------------------------ sets library

def _same(a: Any, b: Any) -> bool:
    """CEL equality of two plain values (a bool is no number)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _s_contains(a: list, b: list) -> bool:
    return all(any(_same(x, y) for y in a) for x in b)


def _s_equivalent(a: list, b: list) -> bool:
    return _s_contains(a, b) and _s_contains(b, a)


def _s_intersects(a: list, b: list) -> bool:
    return any(_same(x, y) for x in a for y in b)


# ------------------------------------------------------ authorizer library

_local = threading.local()


def _context() -> "Evaluation":
    ev = getattr(_local, "evaluation", None)
    if ev is None:
        raise ValueError("no authorizer in this context")
    return ev


def _builder(a: Mapping[str, Any], **changes: Any) -> dict:
    out = {k: v for k, v in a.items() if k != "requestResource"}
    out.update(changes)
    return out


def _a_path(a: Mapping[str, Any], path: str) -> dict:
    return _builder(a, **{_MARK: "path", "path": path})


def _a_group(a: Mapping[str, Any], group: str) -> dict:
    return _builder(a, **{_MARK: "group", "group": group})


def _a_resource(a: Mapping[str, Any], resource: str) -> dict:
    if a.get(_MARK) != "group":
        raise ValueError("no such overload: resource() needs a group check")
    return _builder(a, **{_MARK: "resource", "resource": resource})


def _resource_part(key: str) -> Callable[[Mapping[str, Any], str], dict]:
    def set_part(a: Mapping[str, Any], value: str) -> dict:
        if a.get(_MARK) != "resource":
            raise ValueError(f"no such overload: {key}() needs a resource check")
        return _builder(a, **{key: value})

    return set_part


def _a_service_account(a: Mapping[str, Any], namespace: str, name: str) -> dict:
    return {_MARK: "authorizer", "user": f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
            "groups": [SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{namespace}", AUTHENTICATED]}


def _a_check(a: Mapping[str, Any], verb: str) -> dict:
    kind = a.get(_MARK)
    if kind not in ("path", "resource"):
        raise ValueError("no such overload: check() needs a path or resource check")
    ev = _context()
    user = ev.user
    if a.get("user"):
        user = UserInfo(str(a["user"]), groups=tuple(a.get("groups") or ()))
    if kind == "path":
        attrs = AuthzAttributes(user=user, verb=verb, resource_request=False, path=str(a.get("path", "")))
    else:
        attrs = AuthzAttributes(
            user=user, verb=verb, namespace=str(a.get("namespace", "")), api_group=str(a.get("group", "")),
            api_version="*", resource=str(a.get("resource", "")), subresource=str(a.get("subresource", "")),
            name=str(a.get("name", "")),
        )
    try:
        decision, reason = ev.authorizer.authorize(attrs)
    except Exception as exc:  # noqa: BLE001 - an authorizer failure is the decision's error
        return {_MARK: "decision", "decision": "NoOpinion", "reason": "", "error": str(exc)}
    name = {Decision.ALLOW: "Allow", Decision.DENY: "Deny"}.get(decision, "NoOpinion")
    return {_MARK: "decision", "decision": name, "reason": reason or "", "error": ""}


def _decision(key: str, convert: Callable[[Mapping[str, Any]], Any]) -> Callable[[Mapping[str, Any]], Any]:
    def get(d: Mapping[str, Any]) -> Any:
        if d.get(_MARK) != "decision":
            raise ValueError(f"no such overload: {key}() needs a decision")
        return convert(d)

    return get


def _ov(oid: str, ret: Any, params: list, impl: Any, member: bool = True) -> Any:
    return _cel.Overload(oid, ret, params, is_member=member, impl=impl)


def _library() -> list[Any]:
    F = _cel.FunctionDecl
    L = T.List(T.DYN)
    return [
        *library.decls(),
        F("sets.contains", [_ov("k8s_sets_contains", T.BOOL, [L, L], _s_contains, False)]),
        F("sets.equivalent", [_ov("k8s_sets_equivalent", T.BOOL, [L, L], _s_equivalent, False)]),
        F("sets.intersects", [_ov("k8s_sets_intersects", T.BOOL, [L, L], _s_intersects, False)]),
        F("path", [_ov("k8s_authorizer_path", _AUTHZ, [_AUTHZ, T.STRING], _a_path)]),
        F("group", [_ov("k8s_authorizer_group", _AUTHZ, [_AUTHZ, T.STRING], _a_group)]),
        F("resource", [_ov("k8s_authorizer_resource", _AUTHZ, [_AUTHZ, T.STRING], _a_resource)]),
        F("subresource", [_ov("k8s_authorizer_subresource", _AUTHZ, [_AUTHZ, T.STRING],
                              _resource_part("subresource"))]),
        F("namespace", [_ov("k8s_authorizer_namespace", _AUTHZ, [_AUTHZ, T.STRING], _resource_part("namespace"))]),
        F("name", [_ov("k8s_authorizer_name", _AUTHZ, [_AUTHZ, T.STRING], _resource_part("name"))]),
        F("serviceAccount", [_ov("k8s_authorizer_service_account", _AUTHZ, [_AUTHZ, T.STRING, T.STRING],
                                 _a_service_account)]),
        F("check", [_ov("k8s_authorizer_check", _AUTHZ, [_AUTHZ, T.STRING], _a_check)]),
        F("allowed", [_ov("k8s_decision_allowed", T.BOOL, [_AUTHZ],
                          _decision("allowed", lambda d: d["decision"] == "Allow"))]),
        F("reason", [_ov("k8s_decision_reason", T.STRING, [_AUTHZ], _decision("reason", lambda d: d["reason"]))]),
        F("errored", [_ov("k8s_decision_errored", T.BOOL, [_AUTHZ],
                          _decision("errored", lambda d: bool(d["error"])))]),
        F("error", [_ov("k8s_decision_error", T.STRING, [_AUTHZ], _decision("error", lambda d: d["error"]))]),
    ]


_envs: dict[tuple[bool, bool], Any] = {}
_envs_lock = threading.Lock()


def _env(has_params: bool, has_authorizer: bool) -> Any:
    key = (has_params, has_authorizer)
    with _envs_lock:
        env = _envs.get(key)
        if env is None:
            variables = {"object": T.DYN, "oldObject": T.DYN, "request": T.DYN, "namespaceObject": T.DYN,
                         "variables": T.DYN}
            if has_params:
                variables["params"] = T.DYN
            if has_authorizer:
                variables["authorizer"] = _AUTHZ
            env = _envs[key] = _cel.NewEnv(
                variables=variables, functions=_library(),
                extensions=[ext_bindings.ExtBindings(), ext_strings.ExtStrings(), ext_math.ExtMath(),
                            ext_optional.ExtOptional(), ext_encoders.ExtEncoders()],
            )
        return env


_TYPE_NAMES = {"BOOL": BOOL, "STRING": STRING, "NULL_TYPE": NULL, "NULL": NULL}


_clean = library.clean_error


def _runtime_message(text: str) -> str:
    """The runtime's error text in cel-go's words where they differ."""
    if clean_error(text) == "Iteration budget exceeded":
        # the runtime's own bound (upstream has none besides the cost limit)
        return (f"operation cancelled: iteration budget exceeded (at most {MAX_ITERATIONS - 1} comprehension "
                "iterations per evaluation)")
    return library.runtime_message(text)


def _source_snippet(expr: str, line: int, col: int) -> str:
    lines = expr.split("\n")
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    return f"\n | {src}\n | {'.' * (col - 1)}^"


@dataclass(eq=False)
class Compiled:
    """One compiled expression."""

    expression: str
    program: Any
    tree: ast.Tree
    has_authorizer: bool
    #: names of the composited variables the expression reads
    variables: frozenset[str]

    def evaluate(self, ev: "Evaluation") -> Any:
        """The plain value; :class:`EvalError` when evaluation fails or would
        exceed the per-call limit or the evaluation's remaining budget."""
        values = ev.values(self.variables)
        charged = cost.estimate(self.tree.root, ev.shapes(values), ev.unknown_bound)
        if charged > cost.PER_CALL_LIMIT:
            raise EvalError("operation cancelled: actual cost limit exceeded", cost_exceeded=True)
        ev.spend(charged)
        activation = dict(ev.data)
        activation["variables"] = values
        if not self.has_authorizer:
            activation.pop("authorizer", None)
        _local.evaluation = ev
        try:
            value = self.program.eval(data=activation)
        except Exception as err:  # noqa: BLE001 - whatever the runtime raises is this evaluation's error
            raise EvalError(_runtime_message(str(err))) from None
        finally:
            _local.evaluation = None
        if value.type() == T.ERROR:
            raise EvalError(_runtime_message(str(value.value())))
        return value.plain_value()


class VariableError(Exception):
    pass


@dataclass
class Evaluation:
    """The inputs of one request's evaluation of one policy (with one
    binding's params) and what it spent so far."""

    data: dict[str, Any]
    user: UserInfo
    authorizer: Authorizer = field(default_factory=AlwaysAllow)
    #: compiled variables by name, in declaration order
    variable_programs: Mapping[str, Compiled] = field(default_factory=dict)
    budget: int = cost.RUNTIME_BUDGET
    _values: dict[str, Any] = field(default_factory=dict)
    _errors: dict[str, str] = field(default_factory=dict)
    _shapes: dict[str, cost.Shape] = field(default_factory=dict)
    _unknown: int | None = None
    _pending: set[str] = field(default_factory=set)

    def spend(self, amount: int) -> None:
        self.budget -= amount
        if self.budget < 0:
            raise EvalError("validation failed due to running out of cost budget, no further validation rules "
                            "will be run", cost_exceeded=True)

    def unknown_bound(self) -> int:
        if self._unknown is None:
            self._unknown = cost.unknown_bound(
                [v for k, v in self.data.items() if k != "authorizer"] + list(self._values.values()))
        return self._unknown

    def shapes(self, values: Mapping[str, Any]) -> Callable[[str], Any]:
        """The sizes of the inputs, looked up (and measured) by variable name."""
        def lookup(name: str) -> Any:
            if name == "variables":
                return cost.Shape([values])
            s = self._shapes.get(name)
            if s is None and name in self.data:
                s = self._shapes[name] = cost.Shape([self.data[name]])
            return s

        return lookup

    def values(self, names: frozenset[str]) -> dict[str, Any]:
        """The composited variables named, each evaluated once (lazily)."""
        out: dict[str, Any] = {}
        for name in names:
            if name in self._errors:
                raise EvalError(self._errors[name])
            if name not in self._values:
                prog = self.variable_programs.get(name)
                if prog is None:
                    continue
                if name in self._pending:
                    raise EvalError(f"composited variable {name!r} refers to itself")
                self._pending.add(name)
                try:
                    self._values[name] = prog.evaluate(self)
                except EvalError as err:
                    if err.cost_exceeded:
                        raise
                    self._errors[name] = f"composited variable \"{name}\" fails to evaluate: {err.message}"
                    raise EvalError(self._errors[name]) from None
                finally:
                    self._pending.discard(name)
            out[name] = self._values[name]
        return out


def _referenced_variables(tree: ast.Tree) -> set[tuple[str, ast.Node]]:
    out: set[tuple[str, ast.Node]] = set()
    for n in ast.walk(tree.root):
        if n[0] == "select" and n[1][0] == "ident" and n[1][1] == "variables":
            out.add((n[2], n))
        elif n[0] == "call" and n[1] in ("_[_]", "_[?_]", "_?._") and n[3] and n[3][0][0] == "ident" \
                and n[3][0][1] == "variables" and len(n[3]) > 1 and n[3][1][0] == "const":
            out.add((str(n[3][1][1]), n))
    return out


def compile_expression(expression: str, returns: Sequence[str] = (ANY,), *, has_params: bool = False,
                       has_authorizer: bool = True, variables: Sequence[str] | None = None) -> Compiled:
    """Compile (type-checked) or raise :class:`CELCompileError` with upstream's
    detail. ``variables`` are the composited variables declared before this
    expression (None: the expression may not use composition)."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CELCompileError(f"compilation failed: expression too long ({len(expression)} characters)")
    env = _env(has_params, has_authorizer)
    try:
        program = env.compile(expression)
    except RuntimeError as err:
        raise CELCompileError("compilation failed: " + _clean(str(err))) from None
    tree = ast.decode(program.serialize())
    known = set(variables or ())
    refs = _referenced_variables(tree)
    for name, node in sorted(refs, key=lambda r: r[0]):
        if name not in known:
            line, col = tree.location(node)
            # the select's offset is its dot; upstream points at it too
            raise CELCompileError(f"compilation failed: ERROR: <input>:{line}:{col}: undefined field '{name}'"
                                  + _source_snippet(expression, line, col))
    uses_authorizer = any(n[0] == "ident" and n[1] == "authorizer" for n in ast.walk(tree.root))
    rtype = program.return_type()
    tname = _TYPE_NAMES.get(rtype.name().upper(), rtype.name().lower())
    if ANY not in returns and tname not in returns:
        if len(returns) == 1:
            raise CELCompileError(f"must evaluate to {returns[0]}")
        raise CELCompileError(f"must evaluate to one of [{' '.join(returns)}]")
    return Compiled(expression, program, tree, uses_authorizer, frozenset(name for name, _ in refs))
