"""CEL device selectors, as in resource.k8s.io DeviceClass and request selectors.

Backed by ``cel-expr-python`` (Google's CEL runtime, with a type checker), so
undeclared identifiers, unknown functions and wrong argument types are
compile errors, reported when an object is created.

The environment has one variable, ``device``:

* ``device.driver`` — string;
* ``device.attributes[domain][name]`` — bool, int, string or semver version;
* ``device.capacity[domain][name]`` — a quantity.

Attribute and capacity names without a domain belong to the driver's domain.
An unknown domain reads as an empty map; a missing name is a runtime error.

Kubernetes' quantity and semver libraries are provided: ``quantity(s)``,
``isQuantity(s)``, ``semver(s)``, ``isSemver(s)`` and the members
``compareTo``, ``isLessThan``, ``isGreaterThan``, ``add``, ``sub``, ``sign``,
``isInteger``, ``asInteger``, ``asApproximateFloat``, ``major``, ``minor``,
``patch``. At run time both are CEL maps with one marker key holding a
normalized value, so that ``==`` compares values.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from fractions import Fraction
from functools import lru_cache
from typing import Any, Mapping

from cel_expr_python import cel as _cel
from cel_expr_python.ext import ext_bindings, ext_strings

from kubeplane.api.quantity import parse_quantity

__all__ = [
    "CELCompileError",
    "CELRuntimeError",
    "CompiledSelector",
    "DeviceEnv",
    "compile_selector",
    "compile_cache_clear",
    "is_semver",
    "semver_compare",
]

MAX_EXPRESSION_LENGTH = 10 * 1024
_QKEY = "__quantity__"
_VKEY = "__semver__"


class CELCompileError(ValueError):
    """A selector does not parse or does not type-check."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CELRuntimeError(RuntimeError):
    """Evaluating a selector against one device failed (the device does not match)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --------------------------------------------------------------- quantities


@lru_cache(maxsize=8192)
def _frac(s: str) -> Fraction:
    return Fraction(s)


def _qval(q: Mapping[str, Any]) -> Fraction:
    v = q.get(_QKEY)
    if v is None:
        raise ValueError("no such overload: expected a quantity")
    return _frac(v)


def _mkq(value: Fraction) -> dict[str, str]:
    return {_QKEY: str(value)}


def quantity_value(text: str | int) -> dict[str, str]:
    """The CEL value of a quantity given as text (``"40Gi"``) or integer."""
    return _mkq(parse_quantity(text))


def _f_quantity(s: str) -> dict[str, str]:
    return quantity_value(s)


def _f_is_quantity(s: str) -> bool:
    try:
        parse_quantity(s)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ semver

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


@lru_cache(maxsize=4096)
def _parse_semver(s: str) -> tuple[int, int, int, tuple[str, ...]]:
    m = _SEMVER.match(s)
    if m is None:
        raise ValueError(f"invalid semver: {s!r}")
    pre = tuple(m.group(4).split(".")) if m.group(4) else ()
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), pre


def semver_compare(a: str, b: str) -> int:
    """-1, 0 or 1 comparing two semver 2.0.0 strings by precedence (build metadata ignored)."""
    x, y = _parse_semver(a), _parse_semver(b)
    if x[:3] != y[:3]:
        return -1 if x[:3] < y[:3] else 1
    pa, pb = x[3], y[3]
    if pa == pb:
        return 0
    if not pa:
        return 1
    if not pb:
        return -1
    for ia, ib in zip(pa, pb):
        if ia == ib:
            continue
        na, nb = ia.isdigit(), ib.isdigit()
        if na and nb:
            return -1 if int(ia) < int(ib) else 1
        if na != nb:
            return -1 if na else 1
        return -1 if ia < ib else 1
    return -1 if len(pa) < len(pb) else 1


def semver_value(text: str) -> dict[str, str]:
    """The CEL value of a semver string (validated)."""
    _parse_semver(text)
    return {_VKEY: text}


def _f_semver(s: str) -> dict[str, str]:
    return semver_value(s)


def is_semver(s: str) -> bool:
    """True when ``s`` is a semver 2.0.0 version."""
    return _f_is_semver(s)


def _f_is_semver(s: str) -> bool:
    try:
        _parse_semver(s)
    except ValueError:
        return False
    return True


def _sv(v: Mapping[str, Any]) -> str:
    s = v.get(_VKEY)
    if s is None:
        raise ValueError("no such overload: expected a semver")
    return s


# ------------------------------------------------------ members (both kinds)


def _compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    if _QKEY in a and _QKEY in b:
        x, y = _qval(a), _qval(b)
        return (x > y) - (x < y)
    if _VKEY in a and _VKEY in b:
        return semver_compare(_sv(a), _sv(b))
    raise ValueError("no such overload: compareTo needs two quantities or two semvers")


def _f_add(a: Mapping[str, Any], b: Any) -> dict[str, str]:
    return _mkq(_qval(a) + (Fraction(b) if isinstance(b, int) else _qval(b)))


def _f_sub(a: Mapping[str, Any], b: Any) -> dict[str, str]:
    return _mkq(_qval(a) - (Fraction(b) if isinstance(b, int) else _qval(b)))


def _f_sign(a: Mapping[str, Any]) -> int:
    v = _qval(a)
    return (v > 0) - (v < 0)


def _f_is_integer(a: Mapping[str, Any]) -> bool:
    v = _qval(a)
    return v.denominator == 1 and -(2**63) <= v < 2**63


def _f_as_integer(a: Mapping[str, Any]) -> int:
    v = _qval(a)
    if v.denominator != 1 or not -(2**63) <= v < 2**63:
        raise ValueError("cannot convert value to integer")
    return int(v)


def _f_as_float(a: Mapping[str, Any]) -> float:
    return float(_qval(a))


def _part(i: int):
    def get(v: Mapping[str, Any]) -> int:
        return _parse_semver(_sv(v))[i]

    return get


# --------------------------------------------------------------- environment

_T = _cel.Type
_VAL = _T.Map(_T.STRING, _T.STRING)  # quantity or semver at run time


def _ov(oid: str, ret: Any, params: list[Any], impl: Any, member: bool = False) -> Any:
    return _cel.Overload(oid, ret, params, is_member=member, impl=impl)


def _decls() -> list[Any]:
    F = _cel.FunctionDecl
    return [
        F("quantity", [_ov("k8s_quantity_string", _VAL, [_T.STRING], _f_quantity)]),
        F("isQuantity", [_ov("k8s_is_quantity_string", _T.BOOL, [_T.STRING], _f_is_quantity)]),
        F("semver", [_ov("k8s_semver_string", _VAL, [_T.STRING], _f_semver)]),
        F("isSemver", [_ov("k8s_is_semver_string", _T.BOOL, [_T.STRING], _f_is_semver)]),
        F("compareTo", [_ov("k8s_value_compare_to", _T.INT, [_VAL, _VAL], _compare, True)]),
        F("isLessThan", [_ov("k8s_value_less", _T.BOOL, [_VAL, _VAL], lambda a, b: _compare(a, b) < 0, True)]),
        F("isGreaterThan", [_ov("k8s_value_greater", _T.BOOL, [_VAL, _VAL], lambda a, b: _compare(a, b) > 0, True)]),
        F("add", [
            _ov("k8s_quantity_add", _VAL, [_VAL, _VAL], _f_add, True),
            _ov("k8s_quantity_add_int", _VAL, [_VAL, _T.INT], _f_add, True),
        ]),
        F("sub", [
            _ov("k8s_quantity_sub", _VAL, [_VAL, _VAL], _f_sub, True),
            _ov("k8s_quantity_sub_int", _VAL, [_VAL, _T.INT], _f_sub, True),
        ]),
        F("sign", [_ov("k8s_quantity_sign", _T.INT, [_VAL], _f_sign, True)]),
        F("isInteger", [_ov("k8s_quantity_is_integer", _T.BOOL, [_VAL], _f_is_integer, True)]),
        F("asInteger", [_ov("k8s_quantity_as_integer", _T.INT, [_VAL], _f_as_integer, True)]),
        F("asApproximateFloat", [_ov("k8s_quantity_as_float", _T.DOUBLE, [_VAL], _f_as_float, True)]),
        F("major", [_ov("k8s_semver_major", _T.INT, [_VAL], _part(0), True)]),
        F("minor", [_ov("k8s_semver_minor", _T.INT, [_VAL], _part(1), True)]),
        F("patch", [_ov("k8s_semver_patch", _T.INT, [_VAL], _part(2), True)]),
    ]


_ENV = _cel.NewEnv(
    variables={"device": _T.DYN},
    functions=_decls(),
    extensions=[ext_bindings.ExtBindings(), ext_strings.ExtStrings()],
)

# Domains used as literal keys of attributes/capacity in any compiled selector.
# A device's maps get an empty entry for each, so unknown domains read as {}.
_DOMAIN_REF = re.compile(
    r"""\b(attributes|capacity)\s*(?:\[\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')\s*\]|\.\s*([A-Za-z_][A-Za-z0-9_]*))"""
)
_known_domains: dict[str, frozenset[str]] = {"attributes": frozenset(), "capacity": frozenset()}
_domains_version = 0
_domains_lock = threading.Lock()


def _note_domains(expr: str) -> None:
    global _domains_version
    found: dict[str, set[str]] = {"attributes": set(), "capacity": set()}
    for m in _DOMAIN_REF.finditer(expr):
        found[m.group(1)].add(m.group(2) or m.group(3) or m.group(4) or "")
    with _domains_lock:
        changed = False
        for kind, names in found.items():
            if not names <= _known_domains[kind]:
                _known_domains[kind] = _known_domains[kind] | names
                changed = True
        if changed:
            _domains_version += 1


def _clean_error(text: str) -> str:
    """Strip the status-code decorations of the runtime's messages."""
    text = text.strip()
    text = re.sub(r"^(INVALID_ARGUMENT|NOT_FOUND|OUT_OF_RANGE|UNKNOWN|INTERNAL|UNIMPLEMENTED): ", "", text)
    text = re.sub(r"\s*\[[A-Z_]+\]$", "", text)
    return text.replace("ERROR: <input>:", "")


# ------------------------------------------------------------- device env


def _split_qualified(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


class DeviceEnv:
    """The ``device`` variable of one device, built once and reused for every selector."""

    __slots__ = ("driver", "name", "_data", "_activation", "_version")

    def __init__(self, driver: str, device: Mapping[str, Any]) -> None:
        self.driver = driver
        self.name = device.get("name", "")
        attrs: dict[str, dict[str, Any]] = {}
        for qname, attr in (device.get("attributes") or {}).items():
            domain, ident = _split_qualified(qname, driver)
            attrs.setdefault(domain, {})[ident] = _attribute_value(attr)
        caps: dict[str, dict[str, Any]] = {}
        for qname, cap in (device.get("capacity") or {}).items():
            domain, ident = _split_qualified(qname, driver)
            raw = cap.get("value") if isinstance(cap, Mapping) else cap
            try:
                caps.setdefault(domain, {})[ident] = quantity_value(raw if raw is not None else "0")
            except ValueError:
                continue
        self._data: dict[str, Any] = {"driver": driver, "attributes": attrs, "capacity": caps}
        self._activation: Any = None
        self._version = -1

    @property
    def attributes(self) -> dict[str, dict[str, Any]]:
        return self._data["attributes"]

    @property
    def capacity(self) -> dict[str, dict[str, Any]]:
        return self._data["capacity"]

    def activation(self) -> Any:
        """The runtime activation, rebuilt only when new domains were referenced."""
        if self._version != _domains_version or self._activation is None:
            version = _domains_version
            for kind in ("attributes", "capacity"):
                maps = self._data[kind]
                for domain in _known_domains[kind]:
                    maps.setdefault(domain, {})
            self._activation = _ENV.Activation(data={"device": self._data})
            self._version = version
        return self._activation


def _attribute_value(attr: Any) -> Any:
    if not isinstance(attr, Mapping):
        return attr
    if "bool" in attr:
        return bool(attr["bool"])
    if "int" in attr:
        return int(attr["int"])
    if "string" in attr:
        return str(attr["string"])
    if "version" in attr:
        try:
            return semver_value(str(attr["version"]))
        except ValueError:
            return {_VKEY: str(attr["version"])}
    return None


# --------------------------------------------------------------- selectors


class CompiledSelector:
    """A type-checked selector; evaluate with :meth:`matches`."""

    __slots__ = ("expression", "_program", "evaluations")

    def __init__(self, expression: str, program: Any) -> None:
        self.expression = expression
        self._program = program
        self.evaluations = 0

    def matches(self, device_env: DeviceEnv) -> bool:
        """True when the device is selected; :class:`CELRuntimeError` when evaluation fails."""
        self.evaluations += 1
        try:
            value = self._program.eval(device_env.activation())
        except RuntimeError as err:
            raise CELRuntimeError(_clean_error(str(err))) from None
        result = value.value()
        if isinstance(result, bool):
            return result
        if value.type() == _T.ERROR:
            raise CELRuntimeError(_clean_error(str(result)))
        raise CELRuntimeError(f"expression must evaluate to bool, got {value.type().name().lower()}")

    def __repr__(self) -> str:
        return f"CompiledSelector({self.expression!r})"


_CACHE_SIZE = 1024
_cache: "OrderedDict[str, CompiledSelector | CELCompileError]" = OrderedDict()
_cache_lock = threading.Lock()


def compile_cache_clear() -> None:
    with _cache_lock:
        _cache.clear()


def compile_selector(expr: str) -> CompiledSelector:
    """Compile (cached by expression text); :class:`CELCompileError` on syntax or type errors."""
    with _cache_lock:
        hit = _cache.get(expr)
        if hit is not None:
            _cache.move_to_end(expr)
    if hit is None:
        hit = _compile(expr)
        with _cache_lock:
            _cache[expr] = hit
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(hit, CELCompileError):
        raise CELCompileError(hit.message)
    return hit


def _compile(expr: str) -> CompiledSelector | CELCompileError:
    if len(expr) > MAX_EXPRESSION_LENGTH:
        return CELCompileError(f"expression too long ({len(expr)} characters, maximum {MAX_EXPRESSION_LENGTH})")
    if not expr.strip():
        return CELCompileError("compilation failed: empty expression")
    try:
        program = _ENV.compile(expr)
    except RuntimeError as err:
        return CELCompileError("compilation failed: " + _clean_error(str(err)))
    rtype = program.return_type()
    if rtype != _T.BOOL and rtype != _T.DYN:
        return CELCompileError(f"must evaluate to bool, got {rtype.name().lower()}")
    _note_domains(expr)
    return CompiledSelector(expr, program)
