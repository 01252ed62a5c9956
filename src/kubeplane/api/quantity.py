"""Resource quantities (``resource.Quantity``): exact parsing and canonical text.

Values are exact :class:`fractions.Fraction` numbers. Like upstream, anything
finer than one nano-unit is rounded up (away from zero) to the next nano-unit,
and the canonical text keeps the format family (binary, decimal SI, decimal
exponent) of the string it came from.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import Literal, Union

QuantityFormat = Literal["BinarySI", "DecimalSI", "DecimalExponent"]
QuantityLike = Union[str, int, float, Fraction]

SPLIT_RE = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
FORMAT_ERROR = f"quantities must match the regular expression '{SPLIT_RE}'"
SUFFIX_ERROR = "unable to parse quantity's suffix"

_SPLIT = re.compile(SPLIT_RE)
_NUMBER = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)$")
_EXPONENT = re.compile(r"^[eE][+-]?[0-9]+$")

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXP = {v: k for k, v in _DECIMAL.items()}
_BINARY_BY_EXP = {v: k for k, v in _BINARY.items()}


def _round_up_nano(value: Fraction) -> Fraction:
    """Round to a whole number of nano-units, away from zero."""
    scaled = value * 10**9
    if scaled.denominator == 1:
        return value
    n = math.ceil(scaled) if scaled > 0 else math.floor(scaled)
    return Fraction(n, 10**9)


@lru_cache(maxsize=4096)
def _parse_str(s: str) -> tuple[Fraction, QuantityFormat]:
    if not s:
        raise ValueError(FORMAT_ERROR)
    m = _SPLIT.match(s)
    if m is None:
        raise ValueError(FORMAT_ERROR)
    number, suffix = m.group(1), m.group(2)
    if not _NUMBER.match(number):
        raise ValueError(FORMAT_ERROR)
    base = Fraction(number)
    fmt: QuantityFormat
    if suffix in _BINARY:
        value = base * (1 << _BINARY[suffix])
        fmt = "BinarySI"
    elif suffix in _DECIMAL:
        value = base * Fraction(10) ** _DECIMAL[suffix]
        fmt = "DecimalSI"
    elif _EXPONENT.match(suffix):
        exp = int(suffix[1:])
        if abs(exp) > 1000:
            raise ValueError(SUFFIX_ERROR)
        value = base * Fraction(10) ** exp
        fmt = "DecimalExponent"
    else:
        raise ValueError(SUFFIX_ERROR)
    return _round_up_nano(value), fmt


def parse_quantity_with_format(q: QuantityLike) -> tuple[Fraction, QuantityFormat]:
    """Parse a quantity and report the format family it was written in."""
    if isinstance(q, str):
        return _parse_str(q.strip() if q[:1].isspace() or q[-1:].isspace() else q)
    if isinstance(q, bool):
        raise ValueError(FORMAT_ERROR)
    if isinstance(q, int):
        return Fraction(q), "DecimalSI"
    if isinstance(q, float):
        if not math.isfinite(q):
            raise ValueError(FORMAT_ERROR)
        return _round_up_nano(Fraction(repr(q))), "DecimalSI"
    if isinstance(q, Fraction):
        return _round_up_nano(q), "DecimalSI"
    raise ValueError(FORMAT_ERROR)


def parse_quantity(q: QuantityLike) -> Fraction:
    """Exact value of a quantity such as ``"1.5Gi"``, ``"100m"``, ``"1e3"`` or ``2``.

    Raises ``ValueError`` with upstream's message for malformed input.
    """
    return parse_quantity_with_format(q)[0]


def is_quantity(q: object) -> bool:
    """True when ``q`` parses as a quantity."""
    try:
        parse_quantity(q)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def _decimal_parts(value: Fraction) -> tuple[int, int]:
    """``value`` as ``mantissa * 10**exp`` with exp a multiple of 3 in [-9, 18], mantissa integral."""
    exp = -9
    mantissa = value * 10**9
    # value is already a whole number of nano-units
    m = mantissa.numerator
    while exp < 18 and m % 1000 == 0 and m != 0:
        m //= 1000
        exp += 3
    return m, exp


def format_quantity(value: Fraction | int, fmt: QuantityFormat = "DecimalSI") -> str:
    """Canonical text of a value in a format family, as upstream's ``Quantity.String()``.

    ``format_quantity(Fraction(3, 2) * 2**30, "BinarySI") == "1536Mi"``;
    ``format_quantity(Fraction(1, 10)) == "100m"``.
    """
    value = _round_up_nano(Fraction(value))
    if value == 0:
        return "0"
    if fmt == "BinarySI":
        if -1024 < value < 1024 or value.denominator != 1:
            fmt = "DecimalSI"
        else:
            n = value.numerator
            sign = "-" if n < 0 else ""
            n = abs(n)
            exp = 0
            while exp < 60 and n % 1024 == 0:
                n //= 1024
                exp += 10
            return f"{sign}{n}{_BINARY_BY_EXP.get(exp, '')}"
    mantissa, exp = _decimal_parts(value)
    if fmt == "DecimalExponent":
        return f"{mantissa}e{exp}" if exp else str(mantissa)
    return f"{mantissa}{_DECIMAL_BY_EXP[exp]}"


@lru_cache(maxsize=4096)
def canonical_quantity(s: str) -> str:
    """Canonical text of a quantity string (``"1.5Gi"`` → ``"1536Mi"``)."""
    value, fmt = parse_quantity_with_format(s)
    return format_quantity(value, fmt)


def _ceil_away(value: Fraction) -> int:
    return math.ceil(value) if value >= 0 else math.floor(value)


def int_value(q: QuantityLike) -> int:
    """Whole units, rounded up away from zero (upstream ``Value()``): ``"100m"`` → 1."""
    return _ceil_away(parse_quantity(q))


def milli_value(q: QuantityLike) -> int:
    """Milli-units, rounded up away from zero (upstream ``MilliValue()``): ``"0.5"`` → 500."""
    return _ceil_away(parse_quantity(q) * 1000)


__all__ = [
    "FORMAT_ERROR",
    "QuantityFormat",
    "QuantityLike",
    "canonical_quantity",
    "format_quantity",
    "int_value",
    "is_quantity",
    "milli_value",
    "parse_quantity",
    "parse_quantity_with_format",
]
