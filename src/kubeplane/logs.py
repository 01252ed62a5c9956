"""Logging as upstream components do it: klog's text format and ``-v=N`` verbosity.

A line is ``Lmmdd hh:mm:ss.uuuuuu threadid file:line] message``: the
severity letter (I, W, E, F), month and day, the time with microseconds,
the process id right-aligned to 7 columns (klog prints a thread id there;
Python's threads share the process id, which is what an operator greps for),
the source file and line, then the message.

Verbosity follows klog's conventions: 0 (the default) logs what an operator
needs; 4 and above add the debug-level detail that upstream components log
at ``V(4)`` and beyond.
"""

from __future__ import annotations

import logging
import os
import sys
import time

#: the verbosity from which debug records are logged
DEBUG_VERBOSITY = 4


def _severity(levelno: int) -> str:
    if levelno >= logging.CRITICAL:
        return "F"
    if levelno >= logging.ERROR:
        return "E"
    if levelno >= logging.WARNING:
        return "W"
    return "I"


class KlogFormatter(logging.Formatter):
    """Formats records as klog's text lines; tracebacks follow on their own lines."""

    def __init__(self) -> None:
        super().__init__()
        self._pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        micros = int((record.created - int(record.created)) * 1_000_000)
        head = (f"{_severity(record.levelno)}{t.tm_mon:02d}{t.tm_mday:02d} "
                f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d} "
                f"{self._pid:7d} {record.filename}:{record.lineno}] ")
        text = head + record.getMessage()
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = text + "\n" + record.exc_text
        if record.stack_info:
            text = text + "\n" + self.formatStack(record.stack_info)
        return text


def level_for(verbosity: int) -> int:
    """The Python logging level of a klog verbosity."""
    return logging.DEBUG if verbosity >= DEBUG_VERBOSITY else logging.INFO


def setup(verbosity: int = 0) -> None:
    """Route every log record to stderr in klog's format at ``verbosity``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KlogFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_for(verbosity))
    # aiohttp's access log is off; its own chatter stays at warnings unless asked for.
    if verbosity < DEBUG_VERBOSITY:
        logging.getLogger("asyncio").setLevel(logging.WARNING)


__all__ = ["DEBUG_VERBOSITY", "KlogFormatter", "level_for", "setup"]
