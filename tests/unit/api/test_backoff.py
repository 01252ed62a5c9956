"""Per-key exponential back-off (client-go's flowcontrol.Backoff)."""

from __future__ import annotations

from kubeplane.api.backoff import Backoff


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_backoff_doubles_caps_and_resets_after_twice_the_maximum():
    c = Clock()
    b = Backoff(10.0, 300.0, clock=c)
    assert not b.in_backoff_since("k", c.t)
    b.next("k", c.t)
    assert b.get("k") == 10 and b.in_backoff_since("k", c.t)
    c.t += 10
    assert not b.in_backoff_since("k", c.t - 10)
    for want in (20, 40, 80, 160, 300, 300):
        b.next("k", c.t)
        assert b.get("k") == want
        c.t += want
    c.t += 601
    b.next("k", c.t)
    assert b.get("k") == 10
    assert b.ends("k") == c.t + 10


def test_backoff_since_update_and_gc():
    c = Clock()
    b = Backoff(1.0, 900.0, clock=c)
    assert not b.in_backoff_since_update("k", c())
    b.next("k", c())
    assert b.get("k") == 1.0 and b.in_backoff_since_update("k", c())
    c.t += 1.5
    assert not b.in_backoff_since_update("k", c())
    b.next("k", c())
    assert b.get("k") == 2.0
    for _ in range(20):
        b.next("k", c())
    assert b.get("k") == 900.0
    c.t += 1801
    b.gc(c())
    assert b.get("k") == 0.0
    b.next("k", c())
    c.t += 1801
    b.gc()   # the clock's time
    assert b.get("k") == 0.0
