"""Reading CRI log files as the kubelet API serves them."""

from __future__ import annotations

import builtins
import random

import pytest

from kubeplane.api.meta import parse_timestamp
from kubeplane.node import server as server_mod
from kubeplane.node.server import (HTTPError, LogOptions, LogRenderer, log_options, parse_log_line, subresource_of,
                                   tail_offset)

LOG = (b"2026-01-02T03:04:05.000000001Z stdout F first\n"
       b"2026-01-02T03:04:06.5Z stderr P sec\n"
       b"2026-01-02T03:04:06.6Z stderr F ond\n"
       b"2026-01-02T03:04:07Z stdout F third\n"
       b"2026-01-02T03:04:08.25Z stdout P unfinished")


def render(opts: LogOptions, data: bytes = LOG) -> bytes:
    r = LogRenderer(opts)
    out = b""
    for line in data.split(b"\n"):
        e = parse_log_line(line)
        if e is not None:
            out += r.render(e)
    return out


def test_parse_lines_and_timestamps():
    e = parse_log_line(b"2026-01-02T03:04:05.123456789Z stderr P a b  c")
    assert (e.timestamp, e.stream, e.partial, e.content) == ("2026-01-02T03:04:05.123456789Z", "stderr", True, b"a b  c")
    assert parse_log_line(b"garbage") is None
    assert parse_log_line(b"2026-01-02T03:04:05Z other F x") is None
    assert parse_timestamp("2026-01-02T03:04:05.5Z") - parse_timestamp("2026-01-02T03:04:05Z") == pytest.approx(0.5)
    assert parse_timestamp("2026-01-02T04:04:05+01:00") == parse_timestamp("2026-01-02T03:04:05Z")


def test_render_joins_partials_and_prefixes_timestamps_once_per_line():
    assert render(LogOptions()) == b"first\nsecond\nthird\nunfinished"
    assert render(LogOptions(timestamps=True)) == (
        b"2026-01-02T03:04:05.000000001Z first\n2026-01-02T03:04:06.5Z second\n"
        b"2026-01-02T03:04:07Z third\n2026-01-02T03:04:08.25Z unfinished")
    assert render(LogOptions(limit_bytes=8)) == b"first\nse"
    assert render(LogOptions(since_time="2026-01-02T03:04:06.9Z")) == b"third\nunfinished"


def test_tail_counts_lines_not_entries(tmp_path):
    p = tmp_path / "0.log"
    p.write_bytes(LOG)
    assert LOG[tail_offset(str(p), 2):].startswith(b"2026-01-02T03:04:07Z stdout F third")
    assert LOG[tail_offset(str(p), 3):].startswith(b"2026-01-02T03:04:06.5Z stderr P sec")
    assert tail_offset(str(p), 100) == 0
    assert tail_offset(str(p), 0) == len(LOG)


def _tail_by_reading_all(data: bytes, lines: int) -> int:
    """What a tail is, by parsing the whole file forwards."""
    starts, line_start, pos = [], True, 0
    for raw in data.split(b"\n"):
        e = parse_log_line(raw) if raw else None
        if e is not None:
            if line_start:
                starts.append(pos)
            line_start = not e.partial
        pos += len(raw) + 1
    if lines == 0:
        return len(data)
    return starts[-lines] if len(starts) >= lines else 0


def test_tail_across_block_boundaries(tmp_path, monkeypatch):
    rnd = random.Random(7)
    p = tmp_path / "0.log"
    for trial in range(40):
        out = []
        for i in range(rnd.randint(0, 30)):
            kind = rnd.random()
            if kind < 0.1:
                out.append(b"garbage " * rnd.randint(0, 3))
            elif kind < 0.15:
                out.append(b"")
            else:
                tag = b"P" if kind < 0.5 else b"F"
                out.append(b"2026-01-02T03:04:%02dZ stdout %s %s" % (i % 60, tag, b"x" * rnd.randint(0, 40)))
        data = b"\n".join(out) + (b"\n" if rnd.random() < 0.7 else b"")
        p.write_bytes(data)
        for block in (1, 3, 17, 64 * 1024):
            monkeypatch.setattr(server_mod, "TAIL_BLOCK", block)
            for n in range(0, 35):
                assert tail_offset(str(p), n) == _tail_by_reading_all(data, n), (trial, block, n, data)


def test_tail_of_a_big_file_reads_its_end(tmp_path, monkeypatch):
    p = tmp_path / "0.log"
    entry = b"2026-01-02T03:04:05.123456789Z stdout F " + b"y" * 200 + b"\n"
    with open(p, "wb") as f:
        f.write(entry * (30 * 1024 * 1024 // len(entry)))
        f.write(b"2026-01-02T03:04:06Z stderr P par\n2026-01-02T03:04:06Z stderr F tial\n"
                b"2026-01-02T03:04:07Z stdout F last\n")
    read = []
    real_open = builtins.open

    def counting_open(*a, **kw):
        f = real_open(*a, **kw)
        raw_read = f.read

        def read_(n=-1):
            data = raw_read(n)
            read.append(len(data))
            return data
        f.read = read_
        return f

    monkeypatch.setattr(server_mod, "open", counting_open, raising=False)
    size = p.stat().st_size
    off = tail_offset(str(p), 2)
    assert off == size - len(b"2026-01-02T03:04:06Z stderr P par\n2026-01-02T03:04:06Z stderr F tial\n"
                             b"2026-01-02T03:04:07Z stdout F last\n")
    assert tail_offset(str(p), 1000) == size - 998 * len(entry) - (size - off)
    assert sum(read) <= 2 * 1000 * len(entry)


def test_log_options_validation():
    assert log_options({"follow": "true", "tailLines": "3"}) == LogOptions(follow=True, tail_lines=3)
    for q, text in (({"tailLines": "-1"}, "tailLines: Invalid value: -1: must be greater than or equal to 0"),
                    ({"limitBytes": "0"}, "limitBytes: Invalid value: 0: must be greater than 0"),
                    ({"sinceSeconds": "0"}, "sinceSeconds: Invalid value: 0: must be greater than 0"),
                    ({"sinceSeconds": "1", "sinceTime": "2026-01-01T00:00:00Z"}, "at most one of"),
                    ({"sinceTime": "yesterday"}, "sinceTime: Invalid value"),
                    ({"follow": "maybe"}, "invalid value 'maybe' for follow"),
                    ({"tailLines": "x"}, "not an integer")):
        with pytest.raises(HTTPError) as e:
            log_options(q)
        assert e.value.code == 400 and text in e.value.message


def test_paths_map_to_node_subresources_as_upstream():
    assert subresource_of("/stats/summary") == "stats"
    assert subresource_of("/metrics/cadvisor") == "metrics"
    assert subresource_of("/logs/") == "log"
    assert subresource_of("/healthz") == "healthz"
    assert subresource_of("/pods") == "pods"
    for p in ("/exec/a/b/c", "/attach/a/b/c", "/portForward/a/b", "/containerLogs/a/b/c", "/statsx"):
        assert subresource_of(p) == "proxy"
