"""``x-kubernetes-validations``: CEL rules of CRD schemas.

Each schema node with rules gets its rules compiled once (a CEL environment
per ``self`` type), with ``self`` and ``oldSelf`` declared:

* ``self`` is typed from the schema where the runtime allows it: ``string``,
  ``int``, ``double``, ``bool``, ``list(T)`` for arrays, ``map(string, T)``
  for ``additionalProperties`` maps, ``map(string, dyn)`` for objects with
  properties, ``dyn`` for int-or-string and preserved unknown fields;
  ``self.a.b`` chains naming properties the schema does not declare are
  compile errors (``undefined field 'x'``) as with upstream's object types,
  property names are escaped as upstream (``self.__namespace__``,
  ``self.foo__dash__bar``), and ``number`` properties are doubles;
* at a resource root (the CRD's root or an embedded resource) ``self``
  holds ``apiVersion``, ``kind`` and ``metadata`` with ``name`` and
  ``generateName`` only, as upstream.

Libraries: the CEL standard library, string extensions, optional values
(``self.?field.orValue(x)``; ``oldSelf`` is one under ``optionalOldSelf``),
``cel.bind``, and the Kubernetes libraries shared with the admission
environment (:mod:`kubeplane.cel.library`: regex ``find``/``findAll``, lists,
URLs, IPs and CIDRs, quantity). Not provided: the
``format`` library, and timestamp/duration/bytes typing of strings with
those formats (they are strings in rules).

Cost: the runtime cannot meter evaluation, so every rule gets a cost model
as upstream's estimator reasons: each operation of the expression weighs the
product of the sizes of the collections its enclosing comprehensions iterate
(``maxItems``/``maxProperties``, following iteration variables into nested
lists, or what fits in a 3 MiB request when unbounded), times the number of
times the rule runs (the product of the bounds of the lists and maps above
it). At CRD creation the estimate is checked
against upstream's limits (10^7 per expression, 10^8 per schema); at run time
the same model with the object's actual sizes is charged against the
per-call limit (10^6) and the per-object budget (10^7) before a rule runs, so
evaluation time stays bounded.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from cel_expr_python import cel as _cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from kubeplane.api.errors import Cause, duplicate, forbidden_field, invalid_value, required
from kubeplane.cel import library

from .schema import NIL_PATH, _Node

__all__ = ["RuleSet", "check_rules", "valid_field_path", "RULE_COMPILE_ERROR"]

_T = _cel.Type

PER_CALL_LIMIT = 1_000_000
RUNTIME_BUDGET = 10_000_000
STATIC_EXPRESSION_LIMIT = 10_000_000
STATIC_CRD_LIMIT = 100_000_000
MAX_REQUEST_BYTES = 3 * 1024 * 1024
MAX_MESSAGE_BYTES = 5 * 1024
RULE_COMPILE_ERROR = "compilation failed: "


# ------------------------------------------------------------- library


_clean = library.clean_error
_runtime_message = library.runtime_message


def _decls() -> list[Any]:
    return library.decls()


_HAS_OLD = "__hasOldSelf"
_OLD_VALUE = "__oldSelfValue"
# optionalOldSelf rules see oldSelf as an optional value (optional.none() on create)
_OPT_PREFIX = f"cel.bind(oldSelf, {_HAS_OLD} ? optional.of({_OLD_VALUE}) : optional.none(), "
_ERROR_AT = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*?)\n \| [^\n]*\n \| [. ]*\^", re.S)


def _optional_wrap(expr: str) -> str:
    return _OPT_PREFIX + expr + "\n)"


def _unwrap_error(message: str, expr: str) -> str:
    """A compile error of a wrapped optionalOldSelf rule, located in the rule as written."""
    lines = expr.split("\n")

    def fix(m: re.Match) -> str:
        line, col = int(m.group(1)), int(m.group(2))
        if line == 1:
            col -= len(_OPT_PREFIX)
        if not 1 <= line <= len(lines):
            line, col = len(lines), len(lines[-1]) + 1
        col = max(col, 1)
        return f"ERROR: <input>:{line}:{col}: {m.group(3)}\n | {lines[line - 1]}\n | {'.' * (col - 1)}^"

    return _ERROR_AT.sub(fix, message)


_DECLS = None
_envs: dict[str, Any] = {}
_env_lock = threading.Lock()


def _env_for(t: Any) -> Any:
    global _DECLS
    key = t.name() if t is not None else "dyn"
    with _env_lock:
        env = _envs.get(key)
        if env is None:
            if _DECLS is None:
                _DECLS = _decls()
            env = _cel.NewEnv(variables={"self": t, "oldSelf": t, _OLD_VALUE: t, _HAS_OLD: _T.BOOL},
                              functions=_DECLS,
                              extensions=[ext_strings.ExtStrings(), ext_optional.ExtOptional(),
                                          ext_bindings.ExtBindings()])
            if len(_envs) >= 256:  # bounded: self types come from user schemas
                _envs.pop(next(iter(_envs)))
            _envs[key] = env
    return env


def _elem_type(n: _Node | None) -> Any:
    if n is None or n.int_or_string or (not n.type):
        return _T.DYN
    if n.type == "string":
        return _T.STRING
    if n.type == "integer":
        return _T.INT
    if n.type == "boolean":
        return _T.BOOL
    if n.type == "array":
        return _T.List(_elem_type(n.items))
    if n.type == "object" and n.additional is not None and not n.properties:
        return _T.Map(_T.STRING, _elem_type(n.additional))
    if n.type == "object":
        return _T.Map(_T.STRING, _T.DYN)
    return _T.DYN


def _self_type(n: _Node) -> Any:
    if n.type == "number":
        return _T.DOUBLE
    return _elem_type(n)


# ------------------------------------------------------------ cost model

_MACRO = re.compile(r"\.\s*(all|exists_one|exists|map|filter)\s*\(")
_RECEIVER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*$")
_ITER_VAR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?|[-+*/%<>=!&|?:]+|\[")
# constants and the logical operators cost nothing of their own (as in CEL's cost model)
_FREE = frozenset({"true", "false", "null", "&&", "||", "!", "?", ":"})
_UNBOUNDED = (MAX_REQUEST_BYTES - 2) // 3


class _CostModel:
    """An expression's operations, each weighted by the sizes of the collections
    the comprehension macros around it iterate (upstream estimates costs the
    same way: per-element cost times the collection's maximum size)."""

    __slots__ = ("macros", "counts")

    def __init__(self, expr: str) -> None:
        text = _blank_strings(expr)
        # (receiver root, receiver fields, iteration variable, enclosing macro)
        self.macros: list[tuple[str, tuple[str, ...], str, int]] = []
        self.counts: dict[tuple[int, ...], int] = {}
        parens: list[int] = []
        open_macros: list[int] = []
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if c == ".":
                m = _MACRO.match(text, i)
                if m:
                    recv = _RECEIVER.search(text, max(0, i - 512), i)
                    root, fields = "", ()
                    if recv is not None:
                        parts = [p.strip() for p in recv.group(1).split(".")]
                        root, fields = parts[0], tuple(parts[1:])
                    var = _ITER_VAR.match(text, m.end())
                    sig = tuple(open_macros)
                    self.counts[sig] = self.counts.get(sig, 0) + 1
                    self.macros.append((root, fields, var.group(1) if var else "", open_macros[-1] if open_macros else -1))
                    idx = len(self.macros) - 1
                    parens.append(idx)
                    open_macros.append(idx)
                    i = m.end()
                    continue
            if c == "(":
                parens.append(-1)
            elif c == ")":
                if parens and parens.pop() >= 0:
                    open_macros.pop()
            else:
                t = _TOKEN.match(text, i)
                if t is not None:
                    tok = t.group(0)
                    if tok not in _FREE and not tok[0].isdigit():
                        sig = tuple(open_macros)
                        self.counts[sig] = self.counts.get(sig, 0) + 1
                    i = t.end()
                    continue
            i += 1

    def _origin(self, idx: int, var: str) -> int:
        """The enclosing macro that binds ``var`` (-1: none)."""
        j = self.macros[idx][3]
        while j >= 0:
            if self.macros[j][2] == var:
                return j
            j = self.macros[j][3]
        return -1

    def _total(self, sizes: list[int]) -> int:
        total = 0
        for sig, count in self.counts.items():
            w = count
            for k in sig:
                w *= max(sizes[k], 1)
            total += w
        return total

    def static_cost(self, node: _Node) -> int:
        sizes: list[int] = []
        elems: list[_Node | None] = []
        resolved: list[bool] = []
        for idx, (root, fields, _var, _parent) in enumerate(self.macros):
            base: _Node | None = None
            known = True
            if root in ("self", "oldSelf"):
                base = node
            else:
                j = self._origin(idx, root)
                if j >= 0 and resolved[j]:
                    base = elems[j]
                    known = base is not None
                else:
                    known = False
            for f in fields:
                if base is None:
                    break
                base = base.properties.get(f) if base.properties else base.additional
            if known and base is not None:
                sizes.append(max(_max_len(base), 1))
                elems.append(base.items if base.type == "array" else None)
                resolved.append(True)
            elif known:  # below preserved or untyped fields: unbounded, as upstream assumes
                sizes.append(_UNBOUNDED)
                elems.append(None)
                resolved.append(False)
            else:
                sizes.append(-1)
                elems.append(None)
                resolved.append(False)
        fallback = max([x for x in sizes if x > 0], default=max(_max_len(node), 1))
        return self._total([x if x > 0 else fallback for x in sizes])

    def runtime_cost(self, value: Any, limit: int = 1 << 20) -> int:
        sizes: list[int] = []
        elems: list[list[Any] | None] = []
        for idx, (root, fields, _var, _parent) in enumerate(self.macros):
            bases: list[Any] | None
            if root in ("self", "oldSelf"):
                bases = [value]
            else:
                j = self._origin(idx, root)
                bases = elems[j] if j >= 0 else None
            if bases is None:
                sizes.append(-1)
                elems.append(None)
                continue
            found: list[Any] = []
            for b in bases:
                for f in fields:
                    b = b.get(f) if type(b) is dict else None
                    if b is None:
                        break
                if b is not None:
                    found.append(b)
            size = max((len(x) for x in found if type(x) in (list, dict, str)), default=0)
            sizes.append(size)
            items: list[Any] = []
            for x in found:
                if type(x) is list:
                    items.extend(x)
                elif type(x) is dict:
                    items.extend(x)
                if len(items) > limit:
                    break
            elems.append(items)
        fallback = max([x for x in sizes if x >= 0], default=1)
        return self._total([x if x >= 0 else fallback for x in sizes])


def _min_size(n: _Node | None) -> int:
    if n is None:
        return 1
    if n.type in ("string", "object", "array"):
        return 2
    return 1


def _max_len(n: _Node | None) -> int:
    """The most elements the collection at ``n`` can hold."""
    if n is None:
        return 1
    if n.type == "array":
        if n.max_items is not None:
            return max(n.max_items, 0)
        return (MAX_REQUEST_BYTES - 2) // (_min_size(n.items) + 1)
    if n.type == "object" and (n.additional is not None or n.preserve or n.int_or_string):
        if n.max_props is not None:
            return max(n.max_props, 0)
        return (MAX_REQUEST_BYTES - 2) // (_min_size(n.additional) + 4)
    if n.type == "object":
        return max(len(n.properties), 1)
    return 1


def _cost_message(name: str, cost: int, limit: int) -> str:
    factor = cost / limit
    if factor > 100.0:
        f = "more than 100x"
    elif factor < 1.5:
        f = f"{factor:f}x"
    else:
        f = f"{factor:.1f}x"
    return (f"{name} exceeds budget by factor of {f} (try simplifying the rule, or adding maxItems, "
            "maxProperties, and maxLength where arrays, maps, and strings are declared)")


# ----------------------------------------------------------------- compile


_OLD_SELF = re.compile(r"(?<![A-Za-z0-9_.])oldSelf(?![A-Za-z0-9_])")


_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_SELF_REF = re.compile(r"(?<![A-Za-z0-9_.])(self|oldSelf)(?![A-Za-z0-9_])")
_FIELD_AFTER = re.compile(r"\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\()?")


def _self_fields(expr: str) -> frozenset[str] | None:
    """The fields of ``self``/``oldSelf`` an expression reads, when it reads
    them only as ``self.field`` (None: it uses the whole value)."""
    stripped = _STRINGS.sub("''", expr)
    fields: set[str] = set()
    for m in _SELF_REF.finditer(stripped):
        f = _FIELD_AFTER.match(stripped, m.end())
        if f is None or f.group(2) is not None or f.group(1) in ("all", "exists", "exists_one", "map", "filter"):
            return None
        fields.add(f.group(1))
    return frozenset(fields)


_CHAIN_START = re.compile(r"(?<![A-Za-z0-9_.])(?:self|oldSelf)(?![A-Za-z0-9_])")
_CHAIN_STEP = re.compile(r"\s*(\.)\s*([A-Za-z_][A-Za-z0-9_]*)")
_CALL_AFTER = re.compile(r"\s*\(")
_TYPE_META = ("apiVersion", "kind")


def _unescape(name: str) -> str | None:
    m = re.match(r"^__([a-z]+)__$", name)
    if m and m.group(1) in _CEL_RESERVED:
        return m.group(1)
    if "__" not in name:
        return None
    return (name.replace("__underscores__", "\0").replace("__dot__", ".").replace("__dash__", "-")
            .replace("__slash__", "/").replace("\0", "__"))


def _blank_strings(expr: str) -> str:
    """``expr`` with the contents of string literals blanked, positions kept."""
    return _STRINGS.sub(lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + m.group(0)[-1], expr)


def _undefined_fields(expr: str, node: _Node, resource_root: bool) -> str:
    """Compile errors for ``self.a.b`` chains naming fields the schema does not
    declare (upstream's object types make these compile errors)."""
    text = _blank_strings(expr)
    issues = []
    for m in _CHAIN_START.finditer(text):
        n: _Node | None = node
        root_level = resource_root
        meta_level = False
        pos = m.end()
        while n is not None:
            step = _CHAIN_STEP.match(text, pos)
            if step is None or _CALL_AFTER.match(text, step.end()):
                break
            name, dot = step.group(2), step.start(1)
            pos = step.end()
            if meta_level:
                if name not in ("name", "generateName"):
                    issues.append((dot, name))
                break
            if root_level and name in _TYPE_META:
                break
            if root_level and name == "metadata":
                meta_level, root_level = True, False
                continue
            root_level = False
            if n.preserve or n.int_or_string or n.type != "object":
                break
            if n.properties:
                nxt = n.properties.get(name)
                if nxt is None:
                    unescaped = _unescape(name)
                    nxt = n.properties.get(unescaped) if unescaped is not None else None
                if nxt is None:
                    issues.append((dot, name))
                    break
                n = nxt
            elif n.additional is not None:
                n = n.additional
            else:
                break
    if not issues:
        return ""
    lines = expr.split("\n")
    out = []
    for dot, name in issues:
        line_no = expr.count("\n", 0, dot)
        col = dot - (expr.rfind("\n", 0, dot) + 1)
        out.append(f"ERROR: <input>:{line_no + 1}:{col + 1}: undefined field '{name}'\n | {lines[line_no]}\n | {'.' * col}^")
    return "\n".join(out)


def _uses_old_self(expr: str) -> bool:
    # identifiers inside string literals do not count
    stripped = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", expr)
    return bool(_OLD_SELF.search(stripped))


_programs: "OrderedDict[tuple[str, str], Any]" = OrderedDict()
_programs_lock = threading.Lock()
_PROGRAM_CACHE = 4096


def _compile(self_type: Any, source: str) -> Any:
    """A compiled program for ``self`` of this type (cached), or the compile error text."""
    key = (self_type.name() if self_type is not None else "dyn", source)
    with _programs_lock:
        hit = _programs.get(key)
        if hit is not None:
            _programs.move_to_end(key)
            return hit
    try:
        result: Any = _env_for(self_type).compile(source)
    except RuntimeError as err:
        result = _clean(str(err))
    with _programs_lock:
        _programs[key] = result
        if len(_programs) > _PROGRAM_CACHE:
            _programs.popitem(last=False)
    return result


class _Compiled:
    __slots__ = ("rule", "text", "program", "error", "error_required", "message_program", "message_error",
                 "uses_old_self", "fields", "optional_old_self", "field_path", "reason", "message", "depth", "base",
                 "cost", "msg_cost")

    def __init__(self, rule: dict[str, Any], node: _Node, resource_root: bool = False) -> None:
        self.rule = rule
        text = rule.get("rule") if isinstance(rule.get("rule"), str) else ""
        self.text = text.strip()
        self.program = None
        self.error = ""
        self.error_required = False
        self.message_program = None
        self.message_error = ""
        msg = rule.get("message") if isinstance(rule.get("message"), str) else ""
        self.message = msg.strip()
        self.reason = rule.get("reason") if isinstance(rule.get("reason"), str) else ""
        self.optional_old_self = rule.get("optionalOldSelf") is True
        self.uses_old_self = False
        self.cost = _CostModel(self.text)
        self.msg_cost: _CostModel | None = None
        fp = rule.get("fieldPath") if isinstance(rule.get("fieldPath"), str) else ""
        self.field_path = ""
        if fp.strip():
            try:
                self.field_path = valid_field_path(fp.strip(), node)
            except ValueError:
                self.field_path = ""
        if not self.text:
            return
        source = _optional_wrap(self.text) if self.optional_old_self else self.text
        program = _compile(node.cel_type, source)
        if isinstance(program, str):
            self.error = RULE_COMPILE_ERROR + (_unwrap_error(program, self.text) if self.optional_old_self else program)
            return
        undefined = _undefined_fields(self.text, node, resource_root)
        if undefined:
            self.error = RULE_COMPILE_ERROR + undefined
            return
        rt = program.return_type()
        if rt != _T.BOOL and rt != _T.DYN:
            self.error = "cel expression must evaluate to a bool"
            return
        self.program = program
        self.uses_old_self = _uses_old_self(self.text)
        self.fields = _self_fields(self.text)
        mexpr = rule.get("messageExpression") if isinstance(rule.get("messageExpression"), str) else ""
        if mexpr.strip():
            mp = _compile(node.cel_type, mexpr.strip())
            if isinstance(mp, str):
                self.message_error = "messageExpression " + RULE_COMPILE_ERROR + mp
            elif _undefined_fields(mexpr.strip(), node, resource_root):
                self.message_error = ("messageExpression " + RULE_COMPILE_ERROR
                                      + _undefined_fields(mexpr.strip(), node, resource_root))
            else:
                mrt = mp.return_type()
                if mrt != _T.STRING and mrt != _T.DYN:
                    self.message_error = "must evaluate to a string"
                else:
                    self.message_program = mp
                    self.msg_cost = _CostModel(mexpr)
            if _uses_old_self(mexpr):
                self.uses_old_self = True
            mf = _self_fields(mexpr)
            self.fields = None if mf is None or self.fields is None else self.fields | mf

    def rule_string(self) -> str:
        return self.message or self.text

    def default_message(self) -> str:
        return self.message if self.message else f"failed rule: {self.text}"


_CEL_RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
    "import", "let", "loop", "package", "namespace", "return", "var", "void", "while",
})
_CEL_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def cel_escape(name: str) -> str | None:
    """A property name as CEL rules name it (upstream's escaping: ``__`` ->
    ``__underscores__``, ``.`` ``-`` ``/`` -> ``__dot__`` ``__dash__`` ``__slash__``,
    reserved words -> ``__word__``); None when it cannot be named."""
    if name in _CEL_RESERVED:
        return f"__{name}__"
    if not re.match(r"^[A-Za-z_./-][A-Za-z0-9_./-]*$", name):
        return None
    out = name.replace("__", "__underscores__").replace(".", "__dot__").replace("-", "__dash__").replace("/", "__slash__")
    return out if _CEL_IDENT.match(out) else None


def _annotate(n: _Node, inside_resource: bool = False) -> None:
    n.cel_type = _self_type(n)
    names = {}
    for k in n.properties:
        e = cel_escape(k)
        if e is not None and e != k:
            names[e] = k
    n.cel_names = names
    n.cel_numbers = tuple(k for k, p in n.properties.items() if p.type == "number")
    for c in n.properties.values():
        _annotate(c)
    for c in (n.items, n.additional):
        if c is not None:
            _annotate(c)


def valid_field_path(path: str, node: _Node) -> str:
    """The field.Path text of a rule's ``fieldPath`` (``.spec.a['b']`` -> ``spec.a[b]``); ValueError when invalid."""
    out = ""
    s = node
    toks = re.findall(r"'(?:[^'\\]|\\.)*'|[.\[\]]|[^.\[\]']+", path)
    i = 0

    def step(name: str, named: bool) -> None:
        nonlocal out, s
        if not named:
            out = f"{out}[{name}]"
            s = s.additional  # type: ignore[assignment]
        else:
            out = f"{out}.{name}" if out else name
            nxt = s.properties.get(name)
            if nxt is None:
                raise ValueError("does not refer to a valid field")
            s = nxt

    while i < len(toks):
        tok = toks[i]
        if s is None:
            raise ValueError("does not refer to a valid field")
        if tok == "[":
            if i + 2 >= len(toks):
                raise ValueError("unexpected end of JSON path")
            lit = toks[i + 1]
            if len(lit) < 2 or lit[0] != "'" or lit[-1] != "'":
                raise ValueError(f"expected single quoted string but got {lit}")
            name = re.sub(r"\\(.)", lambda m: m.group(1), lit[1:-1])
            if s.properties:
                step(name, True)
            elif s.additional is not None:
                step(name, False)
            else:
                raise ValueError("does not refer to a valid field")
            if toks[i + 2] != "]":
                raise ValueError(f"expected ] but got {toks[i + 2]}")
            i += 3
        elif tok == ".":
            if i + 1 >= len(toks):
                raise ValueError("unexpected end of JSON path")
            name = toks[i + 1]
            if s.properties:
                step(name, True)
            elif s.additional is not None:
                step(name, False)
            else:
                raise ValueError("does not refer to a valid field")
            i += 2
        else:
            raise ValueError(f"expected [ or . but got: {tok}")
    return out


# --------------------------------------------------------------- runtime


def _child_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _to_cel(value: Any, n: _Node) -> Any:
    """Numbers of ``number`` schemas are doubles in CEL, of ``integer`` schemas ints
    (JSON may carry ``2.0`` for an integer)."""
    t = type(value)
    if n.type == "number" and t is int:
        return float(value)
    if n.type == "integer" and t is float and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _root_view(obj: Any) -> Any:
    if not isinstance(obj, dict):
        return obj
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        view = dict(obj)
        view["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
        return view
    return obj


def _view(v: Any, n: _Node, resource_root: bool, fields: frozenset[str] | None) -> Any:
    """The CEL value of ``self``: only the fields the rules read, when known."""
    if resource_root:
        v = _root_view(v)
    else:
        v = _to_cel(v, n)
    if type(v) is not dict:
        return v
    names = n.cel_names
    if fields is not None:
        out = {}
        for k in fields:
            src = names.get(k, k)
            if src in v:
                out[k] = v[src]
    elif names or n.cel_numbers:
        out = dict(v)
        for e, src in names.items():
            if src in v:
                out[e] = v[src]
    else:
        return v
    for k in n.cel_numbers:
        x = out.get(k)
        if type(x) is int:
            out[k] = float(x)
    return out


class _Budget:
    __slots__ = ("remaining", "exhausted", "warnings", "ratcheting")

    def __init__(self, warnings: list[str] | None = None) -> None:
        self.remaining = RUNTIME_BUDGET
        self.exhausted = False
        self.warnings = warnings
        self.ratcheting = True


class RuleSet:
    """All CEL rules of a schema tree, compiled; evaluate with :meth:`validate`."""

    def __init__(self, root: _Node, root_is_resource: bool = True) -> None:
        _annotate(root)
        self.root = root
        self.root_is_resource = root_is_resource
        self.compiled: dict[int, list[_Compiled]] = {}
        self.fields: dict[int, frozenset[str] | None] = {}
        self.rule_children: dict[int, list[tuple[str, _Node]]] = {}
        self._compile(root)

    def _compile(self, n: _Node) -> None:
        n.cel_env = _env_for(n.cel_type)
        if n.rules:
            rules = [_Compiled(r, n, (n is self.root and self.root_is_resource) or n.embedded) for r in n.rules]
            self.compiled[id(n)] = rules
            fields: frozenset[str] | None = frozenset()
            for r in rules:
                if r.program is None:
                    continue
                if r.fields is None or fields is None:
                    fields = None
                else:
                    fields = fields | r.fields
            # the fields of an object the rules read (None: all of it)
            self.fields[id(n)] = fields if n.type == "object" and not n.embedded else None
        self.rule_children[id(n)] = [(k, p) for k, p in n.properties.items() if p.has_rules_below]
        for c in n.properties.values():
            self._compile(c)
        for c in (n.items, n.additional):
            if c is not None:
                self._compile(c)

    def validate(self, obj: Any, old: Any = None, warnings: list[str] | None = None,
                 ratcheting: bool = True) -> list[Cause]:
        """The rules' errors; with ``ratcheting``, rules not using oldSelf on values
        equal to their old value are ratcheted: their failures go to ``warnings``
        (when given)."""
        errs: list[Cause] = []
        budget = _Budget(warnings)
        budget.ratcheting = ratcheting
        self._walk(self.root, obj, old, "", errs, budget, self.root_is_resource)
        return errs

    def _walk(self, n: _Node, v: Any, old: Any, path: str, errs: list[Cause], budget: _Budget,
              resource_root: bool) -> None:
        if budget.exhausted or v is None or not n.has_rules_below:
            return
        rules = self.compiled.get(id(n))
        if rules:
            self._run_rules(n, rules, v, old, path, errs, budget, resource_root or n.embedded)
            if budget.exhausted:
                return
        if isinstance(v, dict):
            old_map = old if isinstance(old, dict) else None
            if n.properties:
                for k, prop in self.rule_children[id(n)]:
                    if k in v:
                        self._walk(prop, v[k], old_map.get(k) if old_map is not None and n.map_type != "atomic" else None,
                                   _child_path(path, k), errs, budget, False)
                        if budget.exhausted:
                            return
            elif n.additional is not None and n.additional.has_rules_below:
                for k, x in v.items():
                    ox = old_map.get(k) if old_map is not None and n.map_type != "atomic" else None
                    self._walk(n.additional, x, ox, f"{path}[{k}]", errs, budget, False)
                    if budget.exhausted:
                        return
        elif isinstance(v, list) and n.items is not None and n.items.has_rules_below:
            olds = _correlate_list(n, v, old)
            for i, x in enumerate(v):
                self._walk(n.items, x, olds[i] if olds is not None else None, f"{path}[{i}]", errs, budget, False)
                if budget.exhausted:
                    return

    def _run_rules(self, n: _Node, rules: list[_Compiled], v: Any, old: Any, path: str, errs: list[Cause],
                   budget: _Budget, resource_root: bool) -> None:
        field = path or NIL_PATH
        tname = n.type
        fields = self.fields.get(id(n))
        cv = _view(v, n, resource_root, fields)
        ov = None
        if old is not None:
            ov = _view(old, n, resource_root, fields)
        env = n.cel_env
        activation = None
        ratchet = budget.ratcheting and old is not None and type(v) is type(old) and v == old
        for r in rules:
            if r.error:
                errs.append(invalid_value(field, tname, f"rule compile error: {r.error}"))
                continue
            if r.program is None:
                continue
            if r.uses_old_self and old is None and not r.optional_old_self:
                continue
            ratcheted = ratchet and not r.uses_old_self
            if ratcheted and budget.warnings is None:
                continue
            if budget.remaining <= 0:
                errs.append(invalid_value(field, tname, "validation failed due to running out of cost budget, no further validation rules will be run"))
                budget.exhausted = True
                return
            cost = r.cost.runtime_cost(v)
            if old is not None and r.uses_old_self:
                cost = max(cost, r.cost.runtime_cost(old))
            if cost > PER_CALL_LIMIT:
                errs.append(invalid_value(field, tname, "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: " + r.rule_string()))
                budget.exhausted = True
                return
            if cost > budget.remaining:
                errs.append(invalid_value(field, tname, "validation failed due to running out of cost budget, no further validation rules will be run"))
                budget.exhausted = True
                return
            budget.remaining -= cost
            if activation is None:
                data: dict[str, Any] = {"self": cv, _HAS_OLD: ov is not None}
                if ov is not None:
                    data["oldSelf"] = ov
                    data[_OLD_VALUE] = ov
                activation = env.Activation(data=data)
            ok, err = _eval_bool(r.program, activation)
            if err is not None:
                if err.startswith("no such overload"):
                    errs.append(invalid_value(field, tname, f"'{err}': call arguments did not match a supported operator, function or macro signature for rule: {r.rule_string()}"))
                else:
                    errs.append(invalid_value(field, tname, f"{err} evaluating rule: {r.rule_string()}"))
                continue
            if ok:
                continue
            fpath = field
            if r.field_path:
                fpath = _child_path(path, r.field_path) if not r.field_path.startswith("[") else f"{path}{r.field_path}"
                fpath = fpath or NIL_PATH
            detail = r.default_message()
            if r.message_program is not None:
                mcost = r.msg_cost.runtime_cost(v) if r.msg_cost is not None else 1
                if mcost > budget.remaining:
                    errs.append(invalid_value(fpath, tname, "messageExpression evaluation failed due to running out of cost budget, no further validation rules will be run"))
                    budget.exhausted = True
                    return
                budget.remaining -= mcost
                msg = _eval_message(r.message_program, activation)
                if msg is not None:
                    detail = msg
            cause = _reason_error(fpath, tname, detail, r.reason)
            if ratcheted:
                budget.warnings.append(f"{cause.field}: {cause.message}")  # type: ignore[union-attr]
            else:
                errs.append(cause)


def _correlate_list(n: _Node, v: list[Any], old: Any) -> list[Any] | None:
    """Old items matched to new ones by map keys (only list-type=map lists correlate)."""
    if not isinstance(old, list) or n.list_type != "map" or not n.list_keys:
        return None
    keys = n.list_keys
    index: dict[tuple, Any] = {}
    for x in old:
        if isinstance(x, dict):
            index[tuple(repr(x.get(k)) for k in keys)] = x
    return [index.get(tuple(repr(x.get(k)) for k in keys)) if isinstance(x, dict) else None for x in v]


def _eval_bool(program: Any, activation: Any) -> tuple[bool, str | None]:
    try:
        value = program.eval(activation)
    except RuntimeError as err:
        return False, _runtime_message(str(err))
    except Exception as err:  # an extension function raised
        return False, _runtime_message(str(err))
    if value.type() == _T.ERROR:
        return False, _runtime_message(str(value.value()))
    result = value.value()
    if isinstance(result, bool):
        return result, None
    return False, "no such overload"


def _eval_message(program: Any, activation: Any) -> str | None:
    try:
        value = program.eval(activation)
    except Exception:
        return None
    if value.type() == _T.ERROR:
        return None
    msg = value.value()
    if not isinstance(msg, str):
        return None
    msg = msg.strip()
    if not msg or len(msg) > MAX_MESSAGE_BYTES or "\n" in msg or "\r" in msg:
        return None
    return msg


def _reason_error(path: str, tname: str, detail: str, reason: str) -> Cause:
    if reason == "FieldValueForbidden":
        return forbidden_field(path, detail)
    if reason == "FieldValueRequired":
        return required(path, detail)
    if reason == "FieldValueDuplicate":
        return duplicate(path, tname)
    return invalid_value(path, tname, detail)


# ------------------------------------------------------- CRD-time checks


def check_rules(schema: dict[str, Any], path: str) -> list[Cause]:
    """Compile every rule of a (structurally valid) schema; compile errors, costs, oldSelf placement."""
    root = _Node(schema)
    try:
        rules = RuleSet(root)
    except Exception as err:  # never crash on a schema
        return [Cause("InternalError", f"Internal error: {err}", f"{path}.x-kubernetes-validations")]
    errs: list[Cause] = []
    costs: list[tuple[int, str]] = []
    _check_node(root, schema, path, rules, errs, costs, cardinality=1, uncorrelatable=None)
    total = sum(c for c, _ in costs)
    if total > STATIC_CRD_LIMIT:
        for _, p in sorted(costs, key=lambda x: -x[0])[:4]:
            errs.append(forbidden_field(p, "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema"))
        errs.append(forbidden_field(path, _cost_message("x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema", total, STATIC_CRD_LIMIT)))
    return errs


def _check_node(n: _Node, raw: dict[str, Any], path: str, rules: RuleSet, errs: list[Cause],
                costs: list[tuple[int, str]], cardinality: int, uncorrelatable: str | None) -> None:
    for i, c in enumerate(rules.compiled.get(id(n), [])):
        rp = f"{path}.x-kubernetes-validations[{i}]"
        if not c.text:
            continue
        cost = min(c.cost.static_cost(n) * cardinality, 2**64 - 1)
        if cost > STATIC_EXPRESSION_LIMIT:
            errs.append(forbidden_field(f"{rp}.rule", _cost_message("estimated rule cost", cost, STATIC_EXPRESSION_LIMIT)))
        costs.append((cost, f"{rp}.rule"))
        if c.error:
            errs.append(_invalid_rule(f"{rp}.rule", c.rule, c.error))
        if c.message_error:
            errs.append(_invalid_rule(f"{rp}.messageExpression", c.rule, c.message_error))
        elif c.message_program is not None:
            mcost = (c.msg_cost.static_cost(n) if c.msg_cost is not None else 1) * cardinality
            if mcost > STATIC_EXPRESSION_LIMIT:
                errs.append(forbidden_field(f"{rp}.messageExpression", _cost_message("estimated messageExpression cost", mcost, STATIC_EXPRESSION_LIMIT)))
            costs.append((mcost, f"{rp}.messageExpression"))
        if c.program is not None:
            if c.uses_old_self:
                if uncorrelatable is not None:
                    errs.append(invalid_value(f"{rp}.rule", c.text,
                                              f"oldSelf cannot be used on the uncorrelatable portion of the schema within {uncorrelatable}"))
            elif "optionalOldSelf" in c.rule and c.rule.get("optionalOldSelf") is not None:
                errs.append(invalid_value(f"{rp}.optionalOldSelf", c.rule.get("optionalOldSelf"), "may not be set if oldSelf is not used in rule"))
    props = raw.get("properties") if isinstance(raw.get("properties"), dict) else {}
    for k, sub in n.properties.items():
        unc = uncorrelatable
        if n.map_type == "atomic" and unc is None:
            unc = path
        _check_node(sub, props.get(k, {}), f"{path}.properties[{k}]", rules, errs, costs, cardinality, unc)
    if n.additional is not None:
        unc = uncorrelatable
        card = cardinality * max(_max_len(n), 1)
        _check_node(n.additional, raw.get("additionalProperties") or {}, f"{path}.additionalProperties", rules,
                    errs, costs, card, unc)
    if n.items is not None:
        unc = uncorrelatable
        if n.list_type != "map" and unc is None:
            unc = path
        card = cardinality * max(_max_len(n), 1)
        _check_node(n.items, raw.get("items") or {}, f"{path}.items", rules, errs, costs, card, unc)


def _go_str(v: Any) -> str:
    import json

    return json.dumps(v if isinstance(v, str) else "", ensure_ascii=False)


def _rule_repr(rule: dict[str, Any]) -> str:
    """A ValidationRule as upstream's field.Invalid prints the struct value (Go's ``%#v``)."""
    reason = rule.get("reason")
    reason_s = "(*apiextensions.FieldValueErrorReason)(nil)" if not isinstance(reason, str) else f"&{_go_str(reason)}"
    oos = rule.get("optionalOldSelf")
    oos_s = "(*bool)(nil)" if not isinstance(oos, bool) else f"&{'true' if oos else 'false'}"
    return (f"apiextensions.ValidationRule{{Rule:{_go_str(rule.get('rule'))}, Message:{_go_str(rule.get('message'))}, "
            f"MessageExpression:{_go_str(rule.get('messageExpression'))}, Reason:{reason_s}, "
            f"FieldPath:{_go_str(rule.get('fieldPath'))}, OptionalOldSelf:{oos_s}}}")


def _invalid_rule(path: str, rule: dict[str, Any], detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {_rule_repr(rule)}: {detail}", path)
