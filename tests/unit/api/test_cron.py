"""Cron schedules: robfig/cron v3's standard parser and its Next(), as CronJobs use them."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.cron import ConstantDelaySchedule, CronError, UnknownTimeZone, load_location, parse_standard

UTC = dt.timezone.utc
NY = load_location("America/New_York")


def at(*args: int, tz: dt.tzinfo = UTC) -> dt.datetime:
    return dt.datetime(*args, tzinfo=tz)


def times(spec: str, start: dt.datetime, n: int) -> list[dt.datetime]:
    sched = parse_standard(spec)
    out, t = [], start
    for _ in range(n):
        t = sched.next(t)
        out.append(t)
    return out


@pytest.mark.parametrize("spec, start, expected", [
    ("*/15 * * * *", at(2024, 1, 1, 0, 7), [at(2024, 1, 1, 0, 15), at(2024, 1, 1, 0, 30), at(2024, 1, 1, 0, 45)]),
    # an exact match is not "next": the next activation is strictly after
    ("0 * * * *", at(2024, 1, 1, 5, 0), [at(2024, 1, 1, 6), at(2024, 1, 1, 7), at(2024, 1, 1, 8)]),
    # weekdays at 09:00: Friday 2024-01-05 is followed by Monday the 8th
    ("0 9 * * 1-5", at(2024, 1, 5, 10), [at(2024, 1, 8, 9), at(2024, 1, 9, 9), at(2024, 1, 10, 9)]),
    ("0 9 * * MON-FRI", at(2024, 1, 5, 10), [at(2024, 1, 8, 9), at(2024, 1, 9, 9), at(2024, 1, 10, 9)]),
    # names are case-insensitive; a list of months
    ("30 2 1 jan,Jul *", at(2024, 2, 1), [at(2024, 7, 1, 2, 30), at(2025, 1, 1, 2, 30), at(2025, 7, 1, 2, 30)]),
    # day of month OR day of week when both are restricted: the 13th or any Friday
    ("0 0 13 * 5", at(2024, 9, 1), [at(2024, 9, 6), at(2024, 9, 13), at(2024, 9, 20)]),
    # "N/step" runs from N to the field's maximum
    ("5/20 * * * *", at(2024, 1, 1, 0, 0), [at(2024, 1, 1, 0, 5), at(2024, 1, 1, 0, 25), at(2024, 1, 1, 0, 45)]),
    ("10-20/5 3 * * *", at(2024, 1, 1), [at(2024, 1, 1, 3, 10), at(2024, 1, 1, 3, 15), at(2024, 1, 1, 3, 20)]),
    ("? ? 29 2 *", at(2023, 3, 1), [at(2024, 2, 29, 0, 0), at(2024, 2, 29, 0, 1), at(2024, 2, 29, 0, 2)]),
    ("@yearly", at(2024, 6, 1), [at(2025, 1, 1), at(2026, 1, 1), at(2027, 1, 1)]),
    ("@annually", at(2024, 6, 1), [at(2025, 1, 1), at(2026, 1, 1), at(2027, 1, 1)]),
    ("@monthly", at(2024, 1, 31), [at(2024, 2, 1), at(2024, 3, 1), at(2024, 4, 1)]),
    # 2024-01-03 is a Wednesday: Sundays follow
    ("@weekly", at(2024, 1, 3), [at(2024, 1, 7), at(2024, 1, 14), at(2024, 1, 21)]),
    ("@daily", at(2024, 12, 31, 12), [at(2025, 1, 1), at(2025, 1, 2), at(2025, 1, 3)]),
    ("@midnight", at(2024, 12, 31, 12), [at(2025, 1, 1), at(2025, 1, 2), at(2025, 1, 3)]),
    ("@hourly", at(2024, 1, 1, 23, 30), [at(2024, 1, 2, 0), at(2024, 1, 2, 1), at(2024, 1, 2, 2)]),
])
def test_next_activations(spec: str, start: dt.datetime, expected: list[dt.datetime]) -> None:
    assert times(spec, start, 3) == expected


def test_every_is_a_constant_delay_in_whole_seconds() -> None:
    sched = parse_standard("@every 1m30s")
    assert sched == ConstantDelaySchedule(90)
    assert sched.next(at(2024, 1, 1, 0, 0, 10)) == at(2024, 1, 1, 0, 1, 40)
    # sub-second parts of the start are dropped; less than a second is one second
    assert sched.next(dt.datetime(2024, 1, 1, 0, 0, 10, 500000, tzinfo=UTC)) == at(2024, 1, 1, 0, 1, 40)
    assert parse_standard("@every 10ms") == ConstantDelaySchedule(1)


def test_schedule_without_zone_runs_in_the_zone_of_the_time_given() -> None:
    sched = parse_standard("0 9 * * *")
    got = sched.next(at(2024, 1, 1, 12, tz=NY))
    assert got == at(2024, 1, 2, 9, tz=NY)
    assert got.utcoffset() == dt.timedelta(hours=-5)


def test_tz_prefix_gives_the_schedule_its_own_zone_and_the_answer_keeps_the_callers() -> None:
    sched = parse_standard("TZ=America/New_York 0 9 * * *")
    got = sched.next(at(2024, 7, 1, 0))
    assert got == at(2024, 7, 1, 13)  # 09:00 EDT
    assert got.tzinfo is UTC
    assert parse_standard("CRON_TZ=UTC 0 9 * * *").next(at(2024, 7, 1, 0)) == at(2024, 7, 1, 9)


def test_daylight_saving_changes() -> None:
    # 2024-03-10 02:30 does not exist in New York: that day is skipped, as upstream does
    assert times("30 2 * * *", at(2024, 3, 9, 12, tz=NY), 2) == [at(2024, 3, 11, 2, 30, tz=NY),
                                                                  at(2024, 3, 12, 2, 30, tz=NY)]
    # hourly across the spring-forward hour: 01:00 EST is followed by 03:00 EDT, one hour later
    first, second = times("0 * * * *", at(2024, 3, 10, 0, 30, tz=NY), 2)
    assert (first.hour, second.hour) == (1, 3)
    assert second.astimezone(UTC) - first.astimezone(UTC) == dt.timedelta(hours=1)
    # the fall-back day keeps a daily job at 09:00 local time
    assert times("0 9 * * *", at(2024, 11, 2, 12, tz=NY), 2) == [at(2024, 11, 3, 9, tz=NY), at(2024, 11, 4, 9, tz=NY)]
    assert times("0 9 * * *", at(2024, 11, 2, 12, tz=NY), 1)[0].utcoffset() == dt.timedelta(hours=-5)


def test_a_date_that_never_comes_has_no_next_time() -> None:
    assert parse_standard("59 23 31 2 *").next(at(2024, 1, 1)) is None
    assert parse_standard("0 0 31 4,6,9,11 *").next(at(2024, 1, 1)) is None


@pytest.mark.parametrize("spec, message", [
    ("", "empty spec string"),
    ("* * *", "expected exactly 5 fields, found 3: [* * *]"),
    ("* * * * * *", "expected exactly 5 fields, found 6: [* * * * * *]"),
    ("61 * * * *", "end of range (61) above maximum (59): 61"),
    ("* 24 * * *", "end of range (24) above maximum (23): 24"),
    ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
    ("* * * 13 *", "end of range (13) above maximum (12): 13"),
    ("* * * * 7", "end of range (7) above maximum (6): 7"),
    ("a * * * *", 'failed to parse int from a: strconv.Atoi: parsing "a": invalid syntax'),
    ("-1 * * * *", 'failed to parse int from : strconv.Atoi: parsing "": invalid syntax'),
    ("*/0 * * * *", "step of range should be a positive number: */0"),
    ("5-1 * * * *", "beginning of range (5) beyond end of range (1): 5-1"),
    ("1-2-3 * * * *", "too many hyphens: 1-2-3"),
    ("1/2/3 * * * *", "too many slashes: 1/2/3"),
    ("* * * foo *", 'failed to parse int from foo: strconv.Atoi: parsing "foo": invalid syntax'),
    ("@fortnightly", "unrecognized descriptor: @fortnightly"),
    ("@every", "unrecognized descriptor: @every"),
    ("@every soon", 'failed to parse duration @every soon: time: invalid duration "soon"'),
    ("TZ=0", "invalid schedule format: runtime error: slice bounds out of range [:-1]"),
    ("TZ=Mars/Olympus 0 * * * *", "provided bad location Mars/Olympus: unknown time zone Mars/Olympus"),
])
def test_errors_carry_upstreams_wording(spec: str, message: str) -> None:
    with pytest.raises(CronError) as err:
        parse_standard(spec)
    assert str(err.value) == message


def test_load_location() -> None:
    assert load_location("") is UTC
    assert load_location("UTC") is UTC
    assert load_location("Europe/Paris").utcoffset(dt.datetime(2024, 7, 1)) == dt.timedelta(hours=2)
    with pytest.raises(UnknownTimeZone, match="^unknown time zone Nowhere/Land$"):
        load_location("Nowhere/Land")
