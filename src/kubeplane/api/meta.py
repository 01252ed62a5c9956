"""Small helpers over object metadata shared by every layer."""

from __future__ import annotations

import datetime as _dt
import os
import random
import string
import threading
import time
from typing import Any, Callable, Mapping

import orjson

Obj = dict[str, Any]

# Upstream's generateName suffix alphabet: no vowels (no words) and no
# look-alike characters.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


_UTC = _dt.timezone.utc
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)
_ONE_SECOND = _dt.timedelta(seconds=1)
#: the last formatted second: (whole seconds since the epoch, text)
_last_formatted: tuple[int, str] = (-1 << 62, "")


def now_text() -> str:
    """``format_time(utcnow())`` read from ``time.time()``: the current second's
    text is made once."""
    global _last_formatted
    second = int(time.time())
    last = _last_formatted
    if last[0] == second:
        return last[1]
    text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
    _last_formatted = (second, text)
    return text


#: random bytes for uids, drawn from the OS in blocks
_uid_pool = b""
_uid_pos = 0
_UID_BLOCK = 16 * 256
_uid_lock = threading.Lock()


def new_uid() -> str:
    """A random (version 4) UUID in its text form, as ``str(uuid.uuid4())``
    gives, from a block of OS randomness drawn once per 256 uids."""
    global _uid_pool, _uid_pos
    with _uid_lock:
        if _uid_pos >= len(_uid_pool):
            _uid_pool = os.urandom(_UID_BLOCK)
            _uid_pos = 0
        h = _uid_pool[_uid_pos:_uid_pos + 16].hex()
        _uid_pos += 16
    # version 4 (the 13th digit), variant 10xx (the top bits of the 17th)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT_DIGIT[h[16]]}{h[17:20]}-{h[20:]}"


_VARIANT_DIGIT = {f"{d:x}": "89ab"[d & 3] for d in range(16)}


def format_time(t: _dt.datetime) -> str:
    """RFC 3339 with second precision and ``Z``, as metav1.Time serialises.

    Writes format the current time several times per object; the text of the
    last second formatted is reused."""
    global _last_formatted
    if t.tzinfo is None:
        t = t.astimezone(_UTC)
    second = (t - _EPOCH) // _ONE_SECOND
    last = _last_formatted
    if last[0] == second:
        return last[1]
    text = t.astimezone(_UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _last_formatted = (second, text)
    return text


def parse_time(s: str) -> _dt.datetime:
    """Parses ``...Z``, ``...+00:00`` and fractional seconds."""
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    t = _dt.datetime.fromisoformat(s)
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t


def parse_timestamp(s: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (``Z`` or an offset, fractions up to
    nanoseconds, kept to microseconds)."""
    return parse_time(s.strip()).timestamp()


def format_timestamp(seconds: float) -> str:
    """Seconds since the epoch as ``format_time`` writes them (the fraction dropped)."""
    return format_time(_dt.datetime.fromtimestamp(int(seconds), _UTC))


def random_suffix(n: int = 5, rng: Callable[[str], str] = random.choice) -> str:
    return "".join(rng(_NAME_ALPHABET) for _ in range(n))


def meta_of(obj: Mapping[str, Any]) -> Any:
    """``obj["metadata"]``, or an empty dict when it is missing or empty (read-only)."""
    return obj.get("metadata") or {}


def key_of(obj: Obj) -> str:
    """``namespace/name``, or ``name`` for cluster-scoped objects (client-go's key)."""
    md = obj.get("metadata") or {}
    ns = md.get("namespace")
    return f"{ns}/{md.get('name', '')}" if ns else md.get("name", "")


def name_of(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def namespace_of(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("namespace", "")


def rv_of(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("resourceVersion", "")


def labels_of(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def is_alnum(s: str) -> bool:
    return bool(s) and all(c in string.ascii_lowercase + string.digits for c in s)


def without_managed_fields(obj: Obj, *, fresh: bool = False) -> Obj:
    """``obj`` without ``metadata.managedFields``: a copy sharing all but the
    top level and the metadata dict, or ``obj`` itself when it has none and
    ``fresh`` is False (with ``fresh``, always a new top level and metadata
    dict that the caller may modify)."""
    md = obj.get("metadata")
    if not fresh and (not md or "managedFields" not in md):
        return obj
    out = dict(obj)
    if isinstance(md, dict):
        out["metadata"] = {k: v for k, v in md.items() if k != "managedFields"}
    return out


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are certainly the same JSON value: ``==`` alone
    takes ``True`` for ``1``, their encodings tell them apart. May answer False
    for equal values it cannot encode; callers then look closer."""
    if a is b:
        return True
    if a != b:
        return False
    # Equal strings, and equal ints (not bools), encode alike; a string equals only strings.
    if a.__class__ is str or (a.__class__ is int and b.__class__ is int):
        return True
    try:
        return orjson.dumps(a) == orjson.dumps(b)
    except TypeError:
        return False


def deep_copy(obj: Any) -> Any:
    """A deep copy of JSON-shaped data; an orjson round trip is several times
    faster than :func:`copy.deepcopy` for API objects."""
    import copy

    try:
        return orjson.loads(orjson.dumps(obj))
    except (TypeError, orjson.JSONEncodeError):
        return copy.deepcopy(obj)
