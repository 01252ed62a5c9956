"""Schema ``pattern`` regular expressions, with the semantics of upstream's (RE2).

RE2 matches in linear time, so a pattern from a CRD cannot make validation
take unbounded time; the syntax accepted is Go's ``regexp`` syntax.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

__all__ = ["compile_pattern", "compile_or_none", "PatternError"]

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = 8 << 20


class PatternError(ValueError):
    """A pattern that does not compile; the message follows Go's regexp errors."""


# RE2 (C++) error texts and Go's regexp/syntax wording for the same problem.
_GO_WORDING = (
    ("missing ): ", "missing closing ): "),
    ("missing ]: ", "missing closing ]: "),
    ("unexpected ): ", "unexpected ): "),
    ("invalid perl operator: ", "invalid or unsupported Perl syntax: "),
    ("invalid escape sequence: ", "invalid escape sequence: "),
    ("invalid character class range: ", "invalid character class range: "),
    ("invalid character class: ", "invalid character class: "),
    ("missing argument to repetition operator: ", "missing argument to repetition operator: "),
    ("bad repetition operator: ", "invalid nested repetition operator: "),
    ("invalid repetition size: ", "invalid repeat count: "),
    ("invalid named capture group: ", "invalid named capture: "),
    ("trailing \\", "trailing backslash at end of expression"),
)


def _go_message(err: Any) -> str:
    text = err.args[0] if err.args else str(err)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for cpp, go in _GO_WORDING:
        if text.startswith(cpp):
            rest = text[len(cpp):]
            if not rest or go.endswith("expression"):
                return f"error parsing regexp: {go}"
            return f"error parsing regexp: {go}`{rest}`"
    return f"error parsing regexp: {text}"


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> Any:
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as err:
        return PatternError(_go_message(err))


def compile_pattern(pattern: str) -> Any:
    """The compiled pattern; :class:`PatternError` when it is not valid."""
    r = _compile(pattern)
    if isinstance(r, PatternError):
        raise PatternError(str(r))
    return r


def compile_or_none(pattern: str) -> Any:
    r = _compile(pattern)
    return None if isinstance(r, PatternError) else r
