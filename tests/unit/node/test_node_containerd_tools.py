"""The node's handling of containerd's files: the log tail read for error messages."""

from __future__ import annotations

import builtins

from kubeplane.node import containerd as ctd_mod
from kubeplane.node.containerd import TAIL_LOG_BYTES, ManagedContainerd


def _managed(tmp_path) -> ManagedContainerd:
    return ManagedContainerd(str(tmp_path), sandbox_image="pause", cni_bin_dir=str(tmp_path),
                             restrict_oom_score_adj=False)


def test_tail_log_reads_only_the_end(tmp_path, monkeypatch):
    ctd = _managed(tmp_path)
    line = b"time=x level=info msg=" + b"y" * 100 + b"\n"
    with open(ctd.paths.log, "wb") as f:
        for _ in range(20 * 1024 * 1024 // len(line)):
            f.write(line)
        f.write(b"one\ntwo\nthree\n")
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, *a):
            return self.f.seek(*a)

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(ctd_mod, "open", lambda *a, **kw: Counting(builtins.open(*a, **kw)),
                        raising=False)
    assert ctd.tail_log(3) == "one | two | three"
    assert sum(read) <= TAIL_LOG_BYTES
    # the first line of the block read is cut: never returned even when asked for much
    got = ctd.tail_log(10_000).split(" | ")
    assert got[-3:] == ["one", "two", "three"]
    assert all(g == line.rstrip(b"\n").decode() for g in got[:-3])
    assert len(got) < TAIL_LOG_BYTES // len(line) + 4


def test_tail_log_small_and_missing(tmp_path):
    ctd = _managed(tmp_path)
    assert ctd.tail_log() == ""
    with open(ctd.paths.log, "wb") as f:
        f.write(b"a\nb\n")
    assert ctd.tail_log() == "a | b"
