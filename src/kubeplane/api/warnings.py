"""Warnings for the client of the request being served (upstream's
``warning.AddWarning``): admission webhooks and policies add them anywhere
below the front end, which sends them as ``Warning: 299`` headers.

The front end opens a recorder per request (:func:`recording`); outside one,
:func:`add_warning` drops the text. As upstream's recorder, a text is kept
once, and the count and size are bounded.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator

#: upstream truncates each warning to 4 KiB and keeps at most 256 KiB in all
MAX_WARNING_LENGTH = 4 * 1024
MAX_TOTAL_LENGTH = 256 * 1024

_sink: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("kubeplane_warnings", default=None)


def add_warning(text: str) -> None:
    """Record ``text`` for the current request's client (no-op outside a request)."""
    sink = _sink.get()
    if sink is None or not text:
        return
    text = text[:MAX_WARNING_LENGTH]
    if text in sink:
        return
    if sum(len(w) for w in sink) + len(text) > MAX_TOTAL_LENGTH:
        return
    sink.append(text)


@contextmanager
def recording() -> Iterator[list[str]]:
    """``with recording() as warnings:`` collects what the block (and tasks it
    starts) add."""
    sink: list[str] = []
    token = _sink.set(sink)
    try:
        yield sink
    finally:
        _sink.reset(token)
