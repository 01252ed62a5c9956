"""klog's text format for log lines."""

from __future__ import annotations

import logging
import os
import re
import time

from kubeplane.logs import KlogFormatter, level_for


def record(level: int, msg: str, created: float) -> logging.LogRecord:
    r = logging.LogRecord("kubeplane.x", level, "/src/kubeplane/scheduler/queue.py", 123, msg, (), None)
    r.created = created
    return r


def test_klog_line_layout():
    created = time.mktime((2026, 12, 1, 21, 22, 9, 0, 0, -1)) + 0.123456
    line = KlogFormatter().format(record(logging.INFO, "hello %s" % "world", created))
    assert line == f"I1201 21:22:09.123456 {os.getpid():7d} queue.py:123] hello world"
    assert re.fullmatch(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} [ \d]{7} \S+:\d+\] .*", line)


def test_severity_letters():
    f = KlogFormatter()
    letters = [f.format(record(lvl, "m", time.time()))[0]
               for lvl in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)]
    assert letters == ["I", "I", "W", "E", "F"]


def test_traceback_follows_the_line():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        r = logging.LogRecord("x", logging.ERROR, "/a/b.py", 7, "failed", (), sys.exc_info())
    text = KlogFormatter().format(r)
    first, rest = text.split("\n", 1)
    assert first.endswith("b.py:7] failed") and "ValueError: boom" in rest


def test_verbosity_levels():
    assert level_for(0) == logging.INFO
    assert level_for(3) == logging.INFO
    assert level_for(4) == logging.DEBUG
