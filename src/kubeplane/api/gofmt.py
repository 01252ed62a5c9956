"""Values printed as Go prints them, for messages that quote upstream's wording: durations
(``time.Duration.String``), quoted strings (``strconv.Quote``, ``%q``), string lists (``%v`` of a
``[]string``), gRPC status codes and the kubelet's pod reference (``format.Pod``)."""

from __future__ import annotations

from typing import Any, Iterable

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _with_fraction(value: int, digits: int) -> str:
    whole, frac = divmod(value, 10 ** digits)
    if not frac:
        return str(whole)
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def go_duration_ns(ns: int) -> str:
    """A duration in nanoseconds as Go's ``time.Duration.String``: ``0s``, ``500ms``, ``1.5s``,
    ``1m30s``, ``2h0m0s``."""
    if ns == 0:
        return "0s"
    u = abs(ns)
    if u < 1000:
        text = f"{u}ns"
    elif u < 1_000_000:
        text = _with_fraction(u, 3) + "\u00b5s"
    elif u < 1_000_000_000:
        text = _with_fraction(u, 6) + "ms"
    else:
        text = _with_fraction(u % 60_000_000_000, 9) + "s"
        minutes = u // 60_000_000_000
        if minutes:
            text = f"{minutes % 60}m" + text
            if minutes >= 60:
                text = f"{minutes // 60}h" + text
    return "-" + text if ns < 0 else text


def go_duration(seconds: float) -> str:
    """A duration in seconds as Go's ``time.Duration.String`` (see :func:`go_duration_ns`)."""
    return go_duration_ns(round(seconds * 1_000_000_000))


def go_quote(s: str) -> str:
    """Go's ``strconv.Quote`` (what ``%q`` prints for a string)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch.isprintable() and o >= 0x20 and o != 0x7F:
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def go_list(items: Iterable[str]) -> str:
    """A ``[]string`` as Go's ``%v`` prints it: ``[a b c]``."""
    return "[" + " ".join(items) + "]"


_GRPC_CODES = {"OK": "OK", "CANCELLED": "Canceled"}


def grpc_code_name(name: str) -> str:
    """A gRPC status code (its Python enum name, ``NOT_FOUND``) as Go's ``codes.Code`` prints it
    (``NotFound``)."""
    return _GRPC_CODES.get(name) or "".join(w.capitalize() for w in name.split("_"))


def format_pod(pod: dict[str, Any]) -> str:
    """The kubelet's ``format.Pod``: ``name_namespace(uid)``."""
    md = pod.get("metadata") or {}
    return f"{md.get('name', '')}_{md.get('namespace', '')}({md.get('uid', '')})"


__all__ = ["format_pod", "go_duration", "go_duration_ns", "go_list", "go_quote", "grpc_code_name"]
