"""The string formats of OpenAPI schemas that custom resources are validated against.

The set and the checks follow the format registry the Kubernetes API server
uses for CustomResourceDefinition schemas (kube-openapi's strfmt): a string
whose schema names an unknown format is not checked.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import date
from typing import Callable
from urllib.parse import urlsplit

__all__ = ["FORMAT_CHECKS", "SUPPORTED_FORMATS", "check_format", "supported_format"]

# letters and digits of any script, without "_" (Go's [a-zA-Z0-9\p{S}\p{L}], symbols aside)
_LD = r"[^\W_]"
_HOSTNAME = re.compile(
    rf"^({_LD}((-?{_LD}{{0,62}})?)|({_LD}((({_LD}|-){{0,61}}{_LD})?)\.){{1,}}[^\W\d_]{{2,63}})$"
)
_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$", re.I)
_UUID3 = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$", re.I)
_UUID4 = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$", re.I)
_UUID5 = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$", re.I)
_EMAIL = re.compile(r"^[^@\s<>()\[\],;:\"]+@[^@\s<>()\[\],;:\"]+$")
_MAC = re.compile(
    r"^(?:[0-9A-Fa-f]{2}(?:[:-][0-9A-Fa-f]{2}){5}|[0-9A-Fa-f]{2}(?:[:-][0-9A-Fa-f]{2}){7}"
    r"|[0-9A-Fa-f]{2}(?:[:-][0-9A-Fa-f]{2}){19}|[0-9A-Fa-f]{4}(?:\.[0-9A-Fa-f]{4}){2}"
    r"|[0-9A-Fa-f]{4}(?:\.[0-9A-Fa-f]{4}){3}|[0-9A-Fa-f]{4}(?:\.[0-9A-Fa-f]{4}){9})$"
)
_HEXCOLOR = re.compile(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")
_RGB = re.compile(
    r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,"
    r"\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$"
)
_SSN = re.compile(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$")
_BSON = re.compile(r"^[0-9a-fA-F]{24}$")
_DATETIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?$"
)
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_DURATION_UNIT = r"(?:ns|us|µs|ms|s|m|h|d|w)"
_DURATION = re.compile(
    r"^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)\s*(?:ns|us|µs|ms|s|m|h|d|w|"
    r"nanoseconds?|microseconds?|milliseconds?|seconds?|minutes?|hours?|days?|weeks?|"
    r"sec|secs|min|mins|hr|hrs)\s*)+$"
)


def _hostname(s: str) -> bool:
    if len(s) > 255 or not _HOSTNAME.match(s):
        return False
    return all(len(p) <= 63 for p in s.split("."))


def _ipv4(s: str) -> bool:
    if "." not in s:
        return False
    parts = s.split(".")
    if len(parts) != 4:
        # Go's sloppy parser accepts IPv4-mapped IPv6 too ("::ffff:1.2.3.4")
        try:
            return ipaddress.ip_address(s).version == 6 and ipaddress.ip_address(s).ipv4_mapped is not None
        except ValueError:
            return False
    # leading zeros are tolerated, as upstream's sloppy parser does
    return all(p.isdigit() and len(p) <= 3 and int(p) <= 255 for p in parts)


def _ipv6(s: str) -> bool:
    try:
        ipaddress.IPv6Address(s)
    except ValueError:
        return False
    return True


def _cidr(s: str) -> bool:
    addr, sep, bits = s.partition("/")
    if not sep or not bits.isdigit():
        return False
    if _ipv4(addr) and ":" not in addr:
        return int(bits) <= 32
    return _ipv6(addr) and int(bits) <= 128


def _uri(s: str) -> bool:
    # govalidator.IsRequestURI: url.ParseRequestURI succeeds (absolute URI or absolute path)
    if not s or " " in s:
        return False
    if s.startswith("/"):
        return True
    try:
        parts = urlsplit(s)
    except ValueError:
        return False
    return bool(parts.scheme) and bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*$", parts.scheme))


def _email(s: str) -> bool:
    return bool(_EMAIL.match(s.strip("<> "))) if s else False


def _calendar_date(m: re.Match) -> bool:
    """Groups 1-3 of ``m`` (year, month, day) name a day that exists."""
    try:
        date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return False
    return True


def _date(s: str) -> bool:
    m = _DATE.match(s)
    return m is not None and _calendar_date(m)


def _datetime(s: str) -> bool:
    m = _DATETIME.match(s)
    if m is None or not _calendar_date(m):
        return False
    h, mi, sec = int(m.group(4)), int(m.group(5)), int(m.group(6))
    return h < 24 and mi < 60 and sec < 60


_BASE64 = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$")


def _byte(s: str) -> bool:
    return bool(_BASE64.match(s))


def _isbn10(s: str) -> bool:
    s = s.replace("-", "").replace(" ", "")
    if not re.fullmatch(r"\d{9}[\dX]", s):
        return False
    total = sum((10 - i) * (10 if c == "X" else int(c)) for i, c in enumerate(s))
    return total % 11 == 0


def _isbn13(s: str) -> bool:
    s = s.replace("-", "").replace(" ", "")
    if not re.fullmatch(r"\d{13}", s):
        return False
    total = sum(int(c) * (1 if i % 2 == 0 else 3) for i, c in enumerate(s))
    return total % 10 == 0


def _creditcard(s: str) -> bool:
    digits = re.sub(r"[ -]", "", s)
    if not re.fullmatch(r"\d{12,19}", digits):
        return False
    total, alt = 0, False
    for c in reversed(digits):
        d = int(c)
        if alt:
            d *= 2
            if d > 9:
                d -= 9
        total += d
        alt = not alt
    return total % 10 == 0


FORMAT_CHECKS: dict[str, Callable[[str], bool]] = {
    "bsonobjectid": lambda s: bool(_BSON.match(s)),
    "uri": _uri,
    "email": _email,
    "hostname": _hostname,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "cidr": _cidr,
    "mac": lambda s: bool(_MAC.match(s)),
    "uuid": lambda s: bool(_UUID.match(s)),
    "uuid3": lambda s: bool(_UUID3.match(s)),
    "uuid4": lambda s: bool(_UUID4.match(s)),
    "uuid5": lambda s: bool(_UUID5.match(s)),
    "isbn": lambda s: _isbn10(s) or _isbn13(s),
    "isbn10": _isbn10,
    "isbn13": _isbn13,
    "creditcard": _creditcard,
    "ssn": lambda s: bool(_SSN.match(s)),
    "hexcolor": lambda s: bool(_HEXCOLOR.match(s)),
    "rgbcolor": lambda s: bool(_RGB.match(s)),
    "byte": _byte,
    "password": lambda s: True,
    "date": _date,
    "date-time": _datetime,
    "datetime": _datetime,
    "duration": lambda s: bool(_DURATION.match(s)),
}


# The formats custom resources are checked against; any other is ignored
# (upstream strips it before validating). Names compare without dashes.
SUPPORTED_FORMATS = frozenset({
    "bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac", "uuid", "uuid3", "uuid4",
    "uuid5", "isbn", "isbn10", "isbn13", "creditcard", "ssn", "hexcolor", "rgbcolor", "byte", "password",
    "date", "duration", "datetime",
})


def supported_format(fmt: str) -> str:
    """``fmt`` when custom resources are validated against it, else ``""``."""
    return fmt if fmt.replace("-", "") in SUPPORTED_FORMATS else ""


def check_format(fmt: str, value: str) -> bool:
    """True when ``value`` is valid for ``fmt`` (or ``fmt`` is not a checked format)."""
    check = FORMAT_CHECKS.get(fmt)
    return True if check is None else check(value)
