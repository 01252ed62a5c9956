"""Helpers shared by the validation modules: loose accessors, immutability, quantities.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from kubeplane.api.errors import Cause, invalid_value
from kubeplane.api.meta import same_json
from kubeplane.api.quantity import format_quantity, parse_quantity_with_format
from kubeplane.api.strings import regex_error


_PERCENT_RE = re.compile("^[0-9]+%$")


def _join(path: str, child: str) -> str:
    return f"{path}.{child}" if path else child


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _s(v: Any) -> str:
    return v if isinstance(v, str) else ("" if v is None else str(v))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


IMMUTABLE = "field is immutable"


def _immutable(new: Any, old: Any, path: str) -> list[Cause]:
    if same_json(new, old) or _norm(new) == _norm(old):
        return []
    return [invalid_value(path, new, IMMUTABLE)]


def _norm(v: Any) -> Any:
    """Drop unset values so that ``None``, missing, ``[]``, ``{}``, ``""``, ``False`` compare equal."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            nx = _norm(x)
            if nx is None:
                continue
            out[k] = nx
        return out or None
    if isinstance(v, list):
        return [_norm(x) for x in v] or None
    if v == "" or v is False:
        return None
    return v


def _nonnegative(obj: Mapping[str, Any], key: str, path: str) -> list[Cause]:
    v = obj.get(key)
    if v is None:
        return []
    if not _is_int(v) or v < 0:
        return [invalid_value(_join(path, key), v, "must be greater than or equal to 0")]
    return []


def _quantity(value: Any, path: str) -> tuple[Any, list[Cause]]:
    """Parse a quantity field; returns (Fraction | None, causes)."""
    try:
        q, _ = parse_quantity_with_format(value)
    except ValueError as e:
        return None, [invalid_value(path, value, str(e))]
    return q, []


def _canonical(value: Any) -> str:
    try:
        q, fmt = parse_quantity_with_format(value)
    except ValueError:
        return _s(value)
    return format_quantity(q, fmt)


def _validate_int_or_percent(v: Any, path: str) -> list[Cause]:
    if v is None:
        return []
    if isinstance(v, str):
        if not _PERCENT_RE.match(v):
            return [invalid_value(path, v, regex_error(
                "a valid percent string must be a numeric string followed by an ending '%'", "[0-9]+%", "1%", "93%"))]
        if int(v[:-1]) > 100:
            return [invalid_value(path, v, "must not be greater than 100%")]
        return []
    if not _is_int(v) or v < 0:
        return [invalid_value(path, v, "must be greater than or equal to 0")]
    return []


def _int_or_percent_is_zero(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, str):
        return v.rstrip("%") in ("0", "")
    return v == 0
