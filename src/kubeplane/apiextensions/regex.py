"""Schema ``pattern`` regular expressions, with the semantics of upstream's (RE2).

RE2 matches in linear time, so a pattern from a CRD cannot make validation
take unbounded time; the syntax accepted is Go's ``regexp`` syntax.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2
from re2 import _re2

__all__ = ["compile_pattern", "compile_or_none", "compile_full", "Matcher", "PatternError"]

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


_SEARCH_OPTIONS = re2.Options()
_SEARCH_OPTIONS.log_errors = False
_SEARCH_OPTIONS.max_mem = 8 << 20
_SEARCH_OPTIONS.never_capture = True
_UNANCHORED = _re2.RE2.Anchor.UNANCHORED
_NO_MATCH = (-1, -1)
_MEMO = 512


class Matcher:
    """A compiled pattern for yes/no searches: the RE2 engine called directly,
    with the answers for recently seen strings remembered (objects are
    re-validated with mostly unchanged values)."""

    __slots__ = ("pattern", "_re", "_seen")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._re = _re2.RE2(pattern.encode("utf-8"), _SEARCH_OPTIONS)
        if not self._re.ok():
            raise re2.error(self._re.error())
        self._seen: dict[str, bool] = {}

    def search(self, text: str) -> bool:
        hit = self._seen.get(text)
        if hit is None:
            b = text.encode("utf-8", "surrogatepass")
            hit = self._re.Match(_UNANCHORED, b, 0, len(b))[0] != _NO_MATCH
            if len(text) <= 256:
                if len(self._seen) >= _MEMO:
                    self._seen.clear()
                self._seen[text] = hit
        return hit


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> Any:
    try:
        re2.compile(pattern, options=_OPTIONS)
        return Matcher(pattern)
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


@lru_cache(maxsize=1024)
def _compile_full(pattern: str) -> Any:
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error:
        return None


def compile_full(pattern: str) -> Any:
    """A ``re2`` regex object (with match groups and iteration); None when invalid."""
    return _compile_full(pattern)
