"""Go duration strings (``time.ParseDuration``), as Kubernetes flags and
configuration files and the ``timeout`` request parameter use them."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+\.?\d*|\.\d+)([^\d.]*)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                 "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration ("1m30s", "250ms", "-1.5h"), in seconds; a
    ValueError worded as Go's for anything else."""
    s = text
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f'time: invalid duration "{text}"')
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f'time: invalid duration "{text}"')
        unit = m.group(2)
        if not unit:
            raise ValueError(f'time: missing unit in duration "{text}"')
        if unit not in _UNIT_SECONDS:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{text}"')
        total += float(m.group(1)) * _UNIT_SECONDS[unit]
        pos = m.end()
    return sign * total
