"""Where a profile's time goes: parts by module, unowned time charged to callers."""

from __future__ import annotations

import cProfile
import copy
import pstats

from kubeplane.api.quantity import parse_quantity
from kubeplane.bench.profile import CATEGORIES, IDLE, UNATTRIBUTED, breakdown, category_of, module_of, shares


def test_modules_and_parts() -> None:
    import asyncio.events

    import kubeplane.dra.cel as cel
    import kubeplane.registry.registry as reg

    assert module_of(reg.__file__) == "kubeplane.registry.registry"
    assert module_of(asyncio.events.__file__) == "asyncio.events"
    assert module_of("~") is None
    assert category_of(module_of(cel.__file__)) == "CEL"
    assert category_of("kubeplane.dra.validation") == "validation"
    assert category_of("kubeplane.dra.allocator") == "DRA plugin and allocator"
    assert category_of("kubeplane.client.wireserver") == "API: wire server"
    assert category_of("kubeplane.client.wire") == "client: wire, informers"
    assert category_of("kubeplane.api.apply") == "API: managed fields"
    assert category_of("kubeplane.schedulerx") is not None  # a kubeplane module still has a part
    assert category_of("kubeplane.schedulerx") == "kubeplane, other"
    assert category_of("copy") is None and category_of("numpy.core") is None
    assert len({name for name, _ in CATEGORIES}) == len(CATEGORIES)


def _work() -> None:
    # time in kubeplane code, in a built-in (sorted) and in the standard library (deepcopy)
    for _ in range(300):
        parse_quantity("1500m")
        copy.deepcopy({"a": [1, 2, {"b": "c"}]})
        sorted(range(50), key=lambda i: -i)


def test_breakdown_counts_all_time_once_and_charges_callers() -> None:
    prof = cProfile.Profile()
    prof.enable()
    _work()
    prof.disable()
    stats = pstats.Stats(prof)
    parts = breakdown(stats)
    total = sum(tt for _cc, _nc, tt, _ct, _c in stats.stats.values())  # type: ignore[attr-defined]
    assert abs(sum(parts.values()) - total) < 1e-9 * max(1, len(stats.stats))  # type: ignore[attr-defined]
    # the quantity parser is kubeplane's (own part); deepcopy and sorted are charged
    # to this test's function, which has no part, and so on up: unattributed
    own_kubeplane = sum(v[2] for f, v in stats.stats.items()  # type: ignore[attr-defined]
                        if (module_of(f[0]) or "").startswith("kubeplane."))
    # ... and Fraction (the standard library), which it calls, is charged to it
    assert parts["kubeplane, other"] > own_kubeplane > 0
    assert parts.get(UNATTRIBUTED, 0) > 0
    assert list(parts.values()) == sorted(parts.values(), reverse=True)


def test_time_blocked_in_poll_is_idle_and_left_out_of_the_shares(tmp_path) -> None:
    import asyncio

    async def mostly_waiting() -> None:
        for _ in range(5):
            _work()
            await asyncio.sleep(0.05)

    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(mostly_waiting())
    prof.disable()
    parts = breakdown(pstats.Stats(prof))
    assert parts[IDLE] >= 0.2  # five sleeps of 50 ms in the selector's poll
    path = tmp_path / "p.prof"
    prof.dump_stats(str(path))
    busy, idle = shares(str(path))
    assert IDLE not in busy and abs(sum(busy.values()) - 100.0) < 1.0
    assert idle == round(100.0 * parts[IDLE] / sum(parts.values()), 1) and idle > 20.0
    assert busy["event loop, sockets"] < 100.0
