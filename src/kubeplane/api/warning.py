"""Warnings for the client of the request being served (upstream's
``k8s.io/apiserver/pkg/warning``): code anywhere below the HTTP front end
(admission webhooks, ValidatingAdmissionPolicy) calls :func:`add_warning`;
the front end collects them for the request (:func:`collecting`) and sends
each as a ``Warning: 299 - "..."`` header, on success and failure alike.

Outside any collecting request (controllers in this process, tests) a
warning has no client to go to and is dropped.

As upstream's recorder (``endpoints/filters/warning.go``), a text is kept
once, and the headers are bounded: up to 4 Ki characters of warnings are sent
whole; past that, every warning (those already kept, replayed, and those that
follow) is cut to 256 characters, until 4 Ki characters of cut warnings are
out, after which further warnings are dropped.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator

#: upstream's truncateAtTotalRunes and truncateItemRunes
TRUNCATE_AT_TOTAL = 4 * 1024
TRUNCATE_ITEM = 256


class _Recorder:
    __slots__ = ("out", "_seen", "_ordered", "_written", "_truncating")

    def __init__(self) -> None:
        self.out: list[str] = []  # the texts to send, in order
        self._seen: set[str] = set()
        self._ordered: list[str] = []
        self._written = 0
        self._truncating = False

    def add(self, text: str) -> None:
        if not text or (self._truncating and self._written >= TRUNCATE_AT_TOTAL) or text in self._seen:
            return
        self._seen.add(text)
        self._ordered.append(text)
        if self._truncating:
            text = text[:TRUNCATE_ITEM]
        if self._truncating or self._written + len(text) <= TRUNCATE_AT_TOTAL:
            self._written += len(text)
            self.out.append(text)
            return
        # over the limit: start again with every warning so far cut short
        self._truncating = True
        self._written = 0
        self.out.clear()
        for kept in self._ordered:
            kept = kept[:TRUNCATE_ITEM]
            self._written += len(kept)
            self.out.append(kept)


_recorder: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("kubeplane_warnings", default=None)


def add_warning(text: str) -> None:
    """Record ``text`` for the current request's client (no-op outside a request)."""
    recorder = _recorder.get()
    if recorder is not None:
        recorder.add(text)


@contextmanager
def collecting() -> Iterator[list[str]]:
    """``with collecting() as warnings:`` gathers the warnings added in the block
    (and in tasks it starts); ``warnings`` holds the texts to send."""
    recorder = _Recorder()
    token = _recorder.set(recorder)
    try:
        yield recorder.out
    finally:
        _recorder.reset(token)
