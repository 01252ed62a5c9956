"""CEL ``matchConditions`` of admission webhooks (upstream's
``webhook/matchconditions``).

The environment has the variables upstream's has for webhooks: ``object``,
``oldObject`` (null when absent) and ``request`` (the AdmissionRequest's
fields: kind, resource, subResource, requestKind, requestResource, name,
namespace, operation, userInfo, dryRun, options). ``authorizer`` is not
provided: an expression naming it fails to compile, so such a configuration is
refused when it is written rather than misjudged at request time.

Compiled programs are cached by expression text; the runtime is
``cel-expr-python``, as for the DRA selectors.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from cel_expr_python import cel as _cel
from cel_expr_python.ext import ext_strings

#: upstream's limit on one expression's length
MAX_EXPRESSION_LENGTH = 5 * 1024
#: upstream allows at most 64 match conditions per webhook
MAX_MATCH_CONDITIONS = 64

_T = _cel.Type
_ENV = _cel.NewEnv(
    variables={"object": _T.DYN, "oldObject": _T.DYN, "request": _T.DYN},
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
            except RuntimeError as err:
                hit = CompileError("compilation failed: " + _clean(str(err)).replace("ERROR: <input>:", "ERROR: <input>:"))
        with _lock:
            _cache[expression] = hit
            if len(_cache) > 1024:
                _cache.popitem(last=False)
    if isinstance(hit, CompileError):
        raise CompileError(hit.message)
    return Condition(name, expression, hit)


def activation(obj: Any, old: Any, request: dict[str, Any]) -> Any:
    return _ENV.Activation(data={"object": obj, "oldObject": old, "request": request})


def match(conditions: list[Condition], act: Any) -> tuple[bool, list[str]]:
    """(matches, errors) as upstream's matcher decides: any condition False
    means no match (errors or not); otherwise errors decide by failure policy."""
    errs: list[str] = []
    for c in conditions:
        try:
            if not c.evaluate(act):
                return False, []
        except RuntimeError as err:
            errs.append(str(err))
    return True, errs
