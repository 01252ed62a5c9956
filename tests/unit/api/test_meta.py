"""Metadata helpers: uids and the current time's text."""

from __future__ import annotations

import re
import time
import uuid

import kubeplane.api.meta as meta


def test_new_uid_is_a_random_version_4_uuid_in_text_form() -> None:
    seen = set()
    for _ in range(3 * 256 + 5):  # past several blocks of OS randomness
        u = meta.new_uid()
        parsed = uuid.UUID(u)
        assert str(parsed) == u and parsed.version == 4 and parsed.variant == uuid.RFC_4122
        seen.add(u)
    assert len(seen) == 3 * 256 + 5


def test_new_uid_bits_are_random_apart_from_version_and_variant() -> None:
    ors, ands = 0, (1 << 128) - 1
    for _ in range(2000):
        n = uuid.UUID(meta.new_uid()).int
        ors |= n
        ands &= n
    fixed = (0xF000 << 64) | (0xC000 << 48)
    assert ors | fixed == (1 << 128) - 1  # every free bit was 1 at least once
    assert ands & ~fixed == 0  # ... and 0 at least once
    assert (ands & fixed, ors & fixed) == ((0x4000 << 64) | (0x8000 << 48),) * 2


def test_now_text_is_the_current_second_as_format_time_writes_it() -> None:
    for _ in range(3):
        before = int(time.time())
        text = meta.now_text()
        after = int(time.time())
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text)
        assert text in {time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s)) for s in (before, after)}
        assert text <= meta.format_time(meta.utcnow()) <= time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                          time.gmtime(int(time.time())))
        # the two share the last second's text: another second in between changes nothing
        assert meta.format_time(meta._EPOCH) == "1970-01-01T00:00:00Z"
        assert meta.now_text() >= text
        time.sleep(0.4)


def test_new_uid_from_several_threads_never_repeats() -> None:
    import threading

    out: list[list[str]] = [[] for _ in range(4)]

    def take(i: int) -> None:
        out[i].extend(meta.new_uid() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [u for part in out for u in part]
    assert len(set(every)) == len(every) == 8000


def test_timestamps_as_seconds():
    import pytest

    from kubeplane.api.meta import format_timestamp, parse_timestamp
    base = parse_timestamp("2026-01-02T03:04:05Z")
    assert parse_timestamp("2026-01-02T03:04:05.123456789Z") == pytest.approx(base + 0.123456, abs=1e-6)
    assert parse_timestamp(" 2026-01-02T04:04:05+01:00\n") == parse_timestamp("2026-01-02T03:04:05Z")
    assert format_timestamp(parse_timestamp("2026-01-02T03:04:05.9Z")) == "2026-01-02T03:04:05Z"
