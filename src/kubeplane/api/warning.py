"""Warnings for the client of the request being served (upstream's
``k8s.io/apiserver/pkg/warning``): code anywhere below the HTTP front end
calls :func:`add_warning`; the front end collects them for the request
(:func:`collecting`) and sends each as a ``Warning: 299 - "..."`` header.

Outside any collecting request (controllers in this process, tests) a
warning has no client to go to and is dropped.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator

#: upstream's limits: at most 4 KiB per warning text, 1 MiB of warnings in all
MAX_WARNING_LENGTH = 4 * 1024
MAX_TOTAL = 1024 * 1024

_sink: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("kubeplane_warnings", default=None)


def add_warning(text: str) -> None:
    sink = _sink.get()
    if sink is None or not text:
        return
    if len(text) > MAX_WARNING_LENGTH:
        text = text[: MAX_WARNING_LENGTH - 3] + "..."
    if text in sink or sum(len(w) for w in sink) + len(text) > MAX_TOTAL:
        return
    sink.append(text)


@contextmanager
def collecting() -> Iterator[list[str]]:
    """``with collecting() as warnings:`` gathers the warnings added in the block
    (and in tasks it starts)."""
    sink: list[str] = []
    token = _sink.set(sink)
    try:
        yield sink
    finally:
        _sink.reset(token)
