"""Cron schedules as the CronJob API reads them (robfig/cron v3's standard parser).

:func:`parse_standard` accepts what upstream's ``cron.ParseStandard`` accepts:
five fields (minute, hour, day of month, month, day of week) with ``*``,
``?``, lists, ranges, steps and month/weekday names; the descriptors
``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
(``@midnight``), ``@hourly`` and ``@every <duration>``; and a leading
``TZ=<zone>`` / ``CRON_TZ=<zone>``. Errors carry upstream's wording, since
the API server returns them to the user as the field's message.

``Schedule.next(t)`` is the first activation strictly after ``t``. A schedule
without a zone of its own runs in the zone of the time it is given, as
upstream's does; a time zone is an IANA name (:func:`load_location`).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass

from kubeplane.api.duration import parse_duration
from kubeplane.api.gofmt import go_list

UTC = _dt.timezone.utc

STAR_BIT = 1 << 63


@dataclass(frozen=True, slots=True)
class _Bounds:
    low: int
    high: int
    names: dict[str, int] | None = None


_SECONDS = _Bounds(0, 59)
_MINUTES = _Bounds(0, 59)
_HOURS = _Bounds(0, 23)
_DOM = _Bounds(1, 31)
_MONTHS = _Bounds(1, 12, {m: i + 1 for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))})
_DOW = _Bounds(0, 6, {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))})


class CronError(ValueError):
    """A schedule the parser refuses; the text is upstream's."""


class UnknownTimeZone(ValueError):
    """Go's ``time.LoadLocation`` error for a name it cannot load."""


# ------------------------------------------------------------------ time zones


def local_zone() -> _dt.tzinfo:
    """This process's time zone (``$TZ``, else the system's), UTC if neither can be read."""
    import zoneinfo

    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        try:
            return zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            pass
    try:
        with open("/etc/localtime", "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key="Local")
    except (OSError, ValueError):
        return UTC


def load_location(name: str) -> _dt.tzinfo:
    """Go's ``time.LoadLocation``: ``""`` and ``UTC`` are UTC, ``Local`` is this
    process's zone, anything else an IANA name from the time zone database."""
    if name in ("", "UTC"):
        return UTC
    if name == "Local":
        return local_zone()
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise UnknownTimeZone(f"unknown time zone {name}") from None


# ------------------------------------------------------------- time arithmetic
# Go's time.Time arithmetic is absolute (Add) while its calendar operations
# (Date, AddDate) work on the wall clock of the location and normalise: these
# helpers give aware datetimes the same behaviour across DST changes.


def _add(t: _dt.datetime, seconds: int) -> _dt.datetime:
    return (t.astimezone(UTC) + _dt.timedelta(seconds=seconds)).astimezone(t.tzinfo)


def _date(year: int, month: int, day: int, hour: int, minute: int, second: int, loc: _dt.tzinfo) -> _dt.datetime:
    """``time.Date``: out-of-range months and days roll over."""
    year += (month - 1) // 12
    month = (month - 1) % 12 + 1
    base = _dt.datetime(year, month, 1) + _dt.timedelta(days=day - 1, hours=hour, minutes=minute, seconds=second)
    return base.replace(tzinfo=loc).astimezone(UTC).astimezone(loc)


# --------------------------------------------------------------------- schedules


class Schedule:
    """A parsed schedule: ``next(t)`` is the next activation after ``t``, or
    None when there is none within five years (a date that never occurs)."""

    def next(self, t: _dt.datetime) -> _dt.datetime | None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class SpecSchedule(Schedule):
    second: int
    minute: int
    hour: int
    dom: int
    month: int
    dow: int
    #: the schedule's own zone (``TZ=``); None: the zone of the time given
    location: _dt.tzinfo | None = None

    def _day_matches(self, t: _dt.datetime) -> bool:
        dom_match = bool((1 << t.day) & self.dom)
        dow_match = bool((1 << ((t.weekday() + 1) % 7)) & self.dow)
        if self.dom & STAR_BIT or self.dow & STAR_BIT:
            return dom_match and dow_match
        return dom_match or dow_match

    def next(self, t: _dt.datetime) -> _dt.datetime | None:
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        orig = t.tzinfo
        if self.location is not None:
            t = t.astimezone(self.location)
        loc = t.tzinfo
        # The earliest candidate is the next whole second.
        t = _add(t.replace(microsecond=0), 1)
        added = False
        year_limit = t.year + 5
        while True:
            if t.year > year_limit:
                return None
            wrapped = False
            while not (1 << t.month) & self.month:
                if not added:
                    added = True
                    t = _date(t.year, t.month, 1, 0, 0, 0, loc)
                t = _date(t.year, t.month + 1, t.day, t.hour, t.minute, t.second, loc)
                if t.month == 1:
                    wrapped = True
                    break
            if wrapped:
                continue
            while not self._day_matches(t):
                if not added:
                    added = True
                    t = _date(t.year, t.month, t.day, 0, 0, 0, loc)
                t = _date(t.year, t.month, t.day + 1, t.hour, t.minute, t.second, loc)
                # Midnight may not exist on a DST change: get back to it.
                if t.hour != 0:
                    t = _add(t, (24 - t.hour) * 3600 if t.hour > 12 else -t.hour * 3600)
                if t.day == 1:
                    wrapped = True
                    break
            if wrapped:
                continue
            while not (1 << t.hour) & self.hour:
                if not added:
                    added = True
                    t = _date(t.year, t.month, t.day, t.hour, 0, 0, loc)
                t = _add(t, 3600)
                if t.hour == 0:
                    wrapped = True
                    break
            if wrapped:
                continue
            while not (1 << t.minute) & self.minute:
                if not added:
                    added = True
                    t = t.replace(second=0)
                t = _add(t, 60)
                if t.minute == 0:
                    wrapped = True
                    break
            if wrapped:
                continue
            while not (1 << t.second) & self.second:
                if not added:
                    added = True
                t = _add(t, 1)
                if t.second == 0:
                    wrapped = True
                    break
            if wrapped:
                continue
            return t.astimezone(orig)


@dataclass(frozen=True, slots=True)
class ConstantDelaySchedule(Schedule):
    """``@every <duration>``: whole seconds, at least one."""

    delay: int

    def next(self, t: _dt.datetime) -> _dt.datetime:
        return _add(t.replace(microsecond=0), self.delay)


# ------------------------------------------------------------------------ parser


def _bits(low: int, high: int, step: int) -> int:
    if step == 1:
        return ~(-1 << (high + 1)) & (-1 << low)
    out = 0
    for i in range(low, high + 1, step):
        out |= 1 << i
    return out


def _all(b: _Bounds) -> int:
    return _bits(b.low, b.high, 1) | STAR_BIT


_GO_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = (1 << 63) - 1


def _must_parse_int(expr: str) -> int:
    """strconv.Atoi, then non-negative."""
    if not _GO_INT.fullmatch(expr):
        raise CronError(f'failed to parse int from {expr}: strconv.Atoi: parsing "{expr}": invalid syntax')
    num = int(expr)
    if not -_INT64_MAX - 1 <= num <= _INT64_MAX:
        raise CronError(f'failed to parse int from {expr}: strconv.Atoi: parsing "{expr}": value out of range')
    if num < 0:
        raise CronError(f"negative number ({num}) not allowed: {expr}")
    return num


def _parse_int_or_name(expr: str, names: dict[str, int] | None) -> int:
    if names is not None and expr.lower() in names:
        return names[expr.lower()]
    return _must_parse_int(expr)


def _get_range(expr: str, b: _Bounds) -> int:
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    single = len(low_and_high) == 1
    extra = 0
    if low_and_high[0] in ("*", "?"):
        start, end = b.low, b.high
        extra = STAR_BIT
    else:
        start = _parse_int_or_name(low_and_high[0], b.names)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _parse_int_or_name(low_and_high[1], b.names)
        else:
            raise CronError(f"too many hyphens: {expr}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _must_parse_int(range_and_step[1])
        # "N/step" means "N-max/step"
        if single:
            end = b.high
        if step > 1:
            extra = 0
    else:
        raise CronError(f"too many slashes: {expr}")
    if start < b.low:
        raise CronError(f"beginning of range ({start}) below minimum ({b.low}): {expr}")
    if end > b.high:
        raise CronError(f"end of range ({end}) above maximum ({b.high}): {expr}")
    if start > end:
        raise CronError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise CronError(f"step of range should be a positive number: {expr}")
    return _bits(start, end, step) | extra


def _get_field(text: str, b: _Bounds) -> int:
    bits = 0
    for expr in (p for p in text.split(",") if p):
        bits |= _get_range(expr, b)
    return bits


def _descriptor(spec: str, loc: _dt.tzinfo | None) -> Schedule:
    one = lambda b: 1 << b.low  # noqa: E731 - the lowest value of a field
    if spec in ("@yearly", "@annually"):
        return SpecSchedule(one(_SECONDS), one(_MINUTES), one(_HOURS), one(_DOM), one(_MONTHS), _all(_DOW), loc)
    if spec == "@monthly":
        return SpecSchedule(one(_SECONDS), one(_MINUTES), one(_HOURS), one(_DOM), _all(_MONTHS), _all(_DOW), loc)
    if spec == "@weekly":
        return SpecSchedule(one(_SECONDS), one(_MINUTES), one(_HOURS), _all(_DOM), _all(_MONTHS), one(_DOW), loc)
    if spec in ("@daily", "@midnight"):
        return SpecSchedule(one(_SECONDS), one(_MINUTES), one(_HOURS), _all(_DOM), _all(_MONTHS), _all(_DOW), loc)
    if spec == "@hourly":
        return SpecSchedule(one(_SECONDS), one(_MINUTES), _all(_HOURS), _all(_DOM), _all(_MONTHS), _all(_DOW), loc)
    every = "@every "
    if spec.startswith(every):
        try:
            seconds = parse_duration(spec[len(every):])
        except ValueError as err:
            raise CronError(f"failed to parse duration {spec}: {err}") from None
        return ConstantDelaySchedule(max(int(seconds), 1))
    raise CronError(f"unrecognized descriptor: {spec}")


def parse_standard(spec: str) -> Schedule:
    """A schedule in upstream's standard syntax; :class:`CronError` otherwise."""
    if not spec:
        raise CronError("empty spec string")
    loc: _dt.tzinfo | None = None
    if spec.startswith("TZ=") or spec.startswith("CRON_TZ="):
        i = spec.find(" ")
        eq = spec.find("=")
        if i < 0:
            # upstream slices spec[eq+1:-1] and panics; the panic is reported
            raise CronError("invalid schedule format: runtime error: slice bounds out of range [:-1]")
        name = spec[eq + 1:i]
        try:
            loc = load_location(name)
        except UnknownTimeZone as err:
            raise CronError(f"provided bad location {name}: {err}") from None
        spec = spec[i:].strip()
    if spec.startswith("@"):
        return _descriptor(spec, loc)
    fields = spec.split()
    if len(fields) != 5:
        raise CronError(f"expected exactly 5 fields, found {len(fields)}: {go_list(fields)}")
    minute = _get_field(fields[0], _MINUTES)
    hour = _get_field(fields[1], _HOURS)
    dom = _get_field(fields[2], _DOM)
    month = _get_field(fields[3], _MONTHS)
    dow = _get_field(fields[4], _DOW)
    return SpecSchedule(1 << 0, minute, hour, dom, month, dow, loc)


def parse_schedule(spec: str) -> Schedule:
    """:func:`parse_standard`, as upstream calls it for CronJobs (a panic in
    the parser is an error too, already folded in above)."""
    return parse_standard(spec)


__all__ = [
    "ConstantDelaySchedule", "CronError", "Schedule", "SpecSchedule", "UnknownTimeZone", "load_location",
    "local_zone", "parse_schedule", "parse_standard",
]
