"""--history-bytes and --event-ttl parse as upstream's flags do (quantities, Go durations)."""

from __future__ import annotations

import click
import pytest

from kubeplane.cli.main import _ByteSize, _Duration


@pytest.mark.parametrize("text,seconds", [("1h", 3600), ("30m", 1800), ("1h30m", 5400), ("90s", 90),
                                          ("1.5h", 5400), ("250ms", 0.25), ("0", 0)])
def test_event_ttl_takes_go_durations(text: str, seconds: float) -> None:
    assert _Duration().convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["abc", "1x", "h", "-1h", "1h x"])
def test_event_ttl_rejects_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(click.BadParameter):
        _Duration().convert(text, None, None)


@pytest.mark.parametrize("text,n", [("256Mi", 256 * 1024 * 1024), ("1000", 1000), ("1G", 10**9)])
def test_history_bytes_takes_quantities(text: str, n: int) -> None:
    assert _ByteSize().convert(text, None, None) == n


@pytest.mark.parametrize("text", ["0", "lots", "-5"])
def test_history_bytes_rejects_nonpositive_and_garbage(text: str) -> None:
    with pytest.raises(click.BadParameter):
        _ByteSize().convert(text, None, None)
