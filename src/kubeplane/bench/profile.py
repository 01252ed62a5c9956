"""Where a benchmark's CPU time goes: cProfile over the measured phase.

``kubeplane bench WORKLOAD --profile DIR`` profiles each process over the
measured phase only (with ``--split``: ``api.prof`` for the process that
holds the registry and creates the workload's pods, ``scheduler.prof`` for
the scheduler and controllers; in one process ``bench.prof``) and reports
:func:`breakdown` of each file: the share of the profiled time spent in each
part of kubeplane (:data:`CATEGORIES`).

Every function's own time is counted once. Functions that belong to no part
(built-ins such as ``orjson.dumps`` or ``dict.copy``, the standard library
outside the event loop, numpy) are charged to their callers, in proportion to
the time each caller spent in them, until a caller with a part is reached; so
``orjson.loads`` called by the wire client counts as the client's and
``copy.deepcopy`` called by the registry as the registry's. cProfile slows
the profiled code by about a half to a whole again, so throughput from a
profiled run means little; the shares are what it is for. cProfile times by
the clock, so the time a process sat blocked in the event loop's poll is its
idle time: it is reported apart, and the shares are of the rest.
"""

from __future__ import annotations

import os
import pstats
import sys
from collections import defaultdict
from typing import Any

#: (part, module name prefixes), first match wins
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("CEL", ("kubeplane.dra.cel", "cel_expr_python")),
    ("validation", ("kubeplane.api.validation", "kubeplane.api.strings", "kubeplane.dra.validation")),
    ("DRA plugin and allocator", ("kubeplane.dra", "kubeplane.scheduler.plugins.dynamicresources",
                                  "kubeplane.scheduler.assumecache")),
    ("volume binding", ("kubeplane.scheduler.plugins.volumebinding",)),
    ("scheduler: framework, queue, cache, other plugins", ("kubeplane.scheduler",)),
    ("controllers", ("kubeplane.controllers",)),
    ("API: wire server", ("kubeplane.client.wireserver",)),
    ("client: wire, informers", ("kubeplane.client",)),
    ("API: managed fields", ("kubeplane.api.apply", "kubeplane.api.meta")),
    ("API: registry, storage, watch", ("kubeplane.registry", "kubeplane.storage")),
    ("benchmark driver", ("kubeplane.bench",)),
    ("event loop, sockets", ("asyncio", "selectors", "socket")),
    ("kubeplane, other", ("kubeplane",)),
)

#: the part of time that reached no caller with a part (profiler roots, cycles)
UNATTRIBUTED = "unattributed"
#: time blocked in the event loop's poll: the process was idle (cProfile times by the clock)
IDLE = "idle (waiting in poll)"
_POLLS = frozenset({"<method 'poll' of 'select.epoll' objects>", "<method 'poll' of 'select.poll' objects>",
                    "<built-in method select.select>", "<method 'control' of 'select.kqueue' objects>"})

_ROOTS = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}, key=len, reverse=True)
_STDLIB = os.path.realpath(os.path.dirname(os.__file__))


def module_of(filename: str) -> str | None:
    """The dotted module name of a profiled file, None for built-ins (``~``)
    and files outside the import path."""
    if not filename.endswith(".py"):
        return None
    path = os.path.realpath(filename)
    # A kubeplane source tree other than the installed one (a second checkout).
    marker = os.sep + "kubeplane" + os.sep
    if marker in path:
        rel = "kubeplane" + os.sep + path.rsplit(marker, 1)[1]
    else:
        rel = next((path[len(r) + 1:] for r in _ROOTS if path.startswith(r + os.sep)), None)
        if rel is None:
            return None
    mod = rel[:-3].replace(os.sep, ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def category_of(module: str | None) -> str | None:
    if module is None:
        return None
    for name, prefixes in CATEGORIES:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    return None


def breakdown(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of own time per part (see the module docstring), largest first;
    the values add up to the profile's total time."""
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    part: dict[Any, str | None] = {f: IDLE if f[0] == "~" and f[2] in _POLLS else category_of(module_of(f[0]))
                                   for f in table}
    out: dict[str, float] = defaultdict(float)
    pending: dict[Any, float] = defaultdict(float)
    for f, (_cc, _nc, tt, _ct, _callers) in table.items():
        if part[f] is not None:
            out[part[f]] += tt  # type: ignore[index]
        elif tt:
            pending[f] += tt
    # Charge unowned time up the call graph, by the time each caller spent in
    # the function; recursion among unowned functions ends after a bound.
    for _ in range(64):
        if not pending:
            break
        moved: dict[Any, float] = defaultdict(float)
        for f, secs in pending.items():
            callers = table[f][4]
            weights = {c: edge[3] for c, edge in callers.items() if c != f and edge[3] > 0}
            total = sum(weights.values())
            if not total:
                out[UNATTRIBUTED] += secs
                continue
            for c, w in weights.items():
                share = secs * w / total
                if part.get(c) is not None:
                    out[part[c]] += share  # type: ignore[index]
                elif c in table:
                    moved[c] += share
                else:
                    out[UNATTRIBUTED] += share
        pending = moved
    for secs in pending.values():
        out[UNATTRIBUTED] += secs
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def shares(path: str) -> tuple[dict[str, float], float]:
    """:func:`breakdown` of a profile file as percentages of the time the process
    was busy (all but :data:`IDLE`), rounded to 0.1; and the idle share of the
    whole profiled time."""
    parts = breakdown(pstats.Stats(path))
    idle = parts.pop(IDLE, 0.0)
    busy = sum(parts.values())
    return ({k: round(100.0 * v / (busy or 1.0), 1) for k, v in parts.items()},
            round(100.0 * idle / ((busy + idle) or 1.0), 1))


def format_shares(name: str, parts: dict[str, float], idle: float) -> str:
    width = max((len(k) for k in parts), default=0)
    lines = [f"{name}: share of the busy time (idle {idle:.1f} % of the measured phase)"]
    lines += [f"  {k:<{width}}  {v:5.1f} %" for k, v in parts.items()]
    return "\n".join(lines)
