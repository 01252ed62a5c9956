"""What a simulated node says its pods use: the usage model behind the
resource metrics API (see :mod:`kubeplane.registry.metrics` for the path).

A running pod uses what its containers request (cpu and memory), unless the
pod is annotated ``kubeplane.io/usage`` with e.g. ``cpu=250m,memory=64Mi``:
then that is the pod's total, shared among its containers in proportion to
what each requests (evenly when none requests the resource). Tests and demos
change a pod's usage by annotating it; the node reports the change with its
next Lease renewal, which comes early (once the node's pods have not changed
for ``report_delay``) when what the node would report differs from what it
last reported early.

A sample stands for the ``window`` before its timestamp, so the first sample
that shows a pod is taken more than a window after the pod started (the
delay is longer than the window): the HPA controller, as upstream, does not
trust a cpu sample of a new pod whose window began before the pod was ready.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import math
import time
from fractions import Fraction
from typing import Any, Awaitable, Callable

from kubeplane.api.quantity import format_quantity, parse_quantity
from kubeplane.api.usage import RESOURCES, usage_report

log = logging.getLogger(__name__)

Obj = dict[str, Any]

#: the pod annotation that overrides the model (the pod's total usage)
POD_USAGE_ANNOTATION = "kubeplane.io/usage"


def parse_usage(text: str) -> dict[str, Fraction]:
    """``cpu=250m,memory=64Mi`` -> quantities; ValueError names what is wrong."""
    out: dict[str, Fraction] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"{item!r} is not <resource>=<quantity>")
        if name not in RESOURCES:
            raise ValueError(f"unknown resource {name!r} (one of: {', '.join(RESOURCES)})")
        try:
            q = parse_quantity(value.strip())
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        if q < 0:
            raise ValueError(f"{name}: usage must not be negative")
        out[name] = q
    return out


def _requests(container: Obj) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    requests = ((container.get("resources") or {}).get("requests") or {})
    for name in RESOURCES:
        if name in requests:
            try:
                out[name] = parse_quantity(requests[name])
            except ValueError:
                pass
    return out


def _format(name: str, value: Fraction) -> str:
    if name == "cpu":
        return format_quantity(Fraction(math.ceil(value * 10**9), 10**9), "DecimalSI")
    return format_quantity(Fraction(math.ceil(value)), "BinarySI")


def pod_usage(pod: Obj) -> list[tuple[str, dict[str, str]]]:
    """(container, usage) for every container the pod runs (sidecars included)."""
    spec = pod.get("spec") or {}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    containers += [c for c in spec.get("initContainers") or []
                   if isinstance(c, dict) and c.get("restartPolicy") == "Always"]
    requests = [_requests(c) for c in containers]
    total: dict[str, Fraction] = {}
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(POD_USAGE_ANNOTATION)
    if isinstance(text, str):
        try:
            total = parse_usage(text)
        except ValueError as err:
            log.warning("pod %s/%s: ignoring %s=%r: %s", (pod.get("metadata") or {}).get("namespace"),
                        (pod.get("metadata") or {}).get("name"), POD_USAGE_ANNOTATION, text, err)
    out: list[tuple[str, dict[str, str]]] = []
    for c, req in zip(containers, requests):
        usage: dict[str, str] = {}
        for name in RESOURCES:
            if name in total:
                asked = sum((r.get(name, Fraction(0)) for r in requests), Fraction(0))
                share = req.get(name, Fraction(0)) / asked if asked else Fraction(1, len(containers))
                usage[name] = _format(name, total[name] * share)
            else:
                usage[name] = _format(name, req.get(name, Fraction(0)))
        out.append((str(c.get("name", "")), usage))
    return out


def running(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and not (pod.get("metadata") or {}).get("deletionTimestamp")


def node_content(pods: list[Obj]) -> tuple[dict[str, str], list[Obj]]:
    """The node's usage (the sum of its pods') and one entry per running pod."""
    totals = {name: Fraction(0) for name in RESOURCES}
    entries: list[Obj] = []
    for pod in sorted((p for p in pods if running(p)),
                      key=lambda p: ((p.get("metadata") or {}).get("namespace", ""),
                                     (p.get("metadata") or {}).get("name", ""))):
        md = pod.get("metadata") or {}
        containers = pod_usage(pod)
        for _name, usage in containers:
            for name in RESOURCES:
                totals[name] += parse_quantity(usage[name])
        entries.append({"namespace": md.get("namespace", ""), "name": md.get("name", ""), "uid": md.get("uid", ""),
                        "containers": [{"name": n, "usage": u} for n, u in containers]})
    return {name: _format(name, v) for name, v in totals.items()}, entries


class UsageReports:
    """Per node: the report its next Lease renewal carries, and an early
    renewal when what it would report changed."""

    def __init__(self, pods_on: Callable[[str], list[Obj]], renew: Callable[[str], Awaitable[None]], *,
                 window_seconds: float = 1.0, report_delay: float = 1.25,
                 clock: Callable[[], _dt.datetime] | None = None) -> None:
        from kubeplane.api.meta import utcnow

        self.pods_on = pods_on
        self.renew = renew
        self.window_seconds = window_seconds
        self.report_delay = report_delay
        self.clock = clock or utcnow
        self._last: dict[str, tuple[dict[str, str], list[Obj]]] = {}
        self._dirty: set[str] = set()
        self._touched_at: dict[str, float] = {}
        self._wake = asyncio.Event()

    def annotation(self, node: str) -> str:
        """The report for ``node`` as of now."""
        content = node_content(self.pods_on(node))
        return usage_report(self.clock(), self.window_seconds, content[0], content[1])

    def touched(self, node: str) -> None:
        """A pod on ``node`` changed: its usage may have."""
        self._dirty.add(node)
        self._touched_at[node] = time.monotonic()
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                # a node is reported once its pods have been quiet for report_delay
                now = time.monotonic()
                due = sorted(n for n in self._dirty if now - self._touched_at.get(n, 0.0) >= self.report_delay)
                if not due:
                    first = min(self._touched_at.get(n, 0.0) for n in self._dirty)
                    await asyncio.sleep(max(first + self.report_delay - now, 0.01))
                    continue
                for node in due:
                    self._dirty.discard(node)
                    content = node_content(self.pods_on(node))
                    # compared with what the last early report said (a heartbeat in
                    # between may have sent the change, but inside its window)
                    if content == self._last.get(node):
                        continue
                    self._last[node] = content
                    try:
                        await self.renew(node)
                    except Exception as err:  # noqa: BLE001 - the next heartbeat reports again
                        log.debug("usage report of %s failed: %s", node, err)
