"""client-go's work-queue metrics, computed when scraped."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubeplane.controllers.base import WorkQueue, WorkQueueCollector


def values(registry: CollectorRegistry, name: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.name == name and s.labels.get("name", "").startswith("wqtest-"):
                out[s.labels["name"]] = s.value
    return out


async def test_depth_adds_retries_and_running_work():
    reg = CollectorRegistry()
    reg.register(WorkQueueCollector())
    q = WorkQueue("wqtest-a", base_delay=0.001)
    for key in ("x", "y", "x"):  # the second x is deduplicated
        q.add(key)
    assert values(reg, "workqueue_depth") == {"wqtest-a": 2}
    assert values(reg, "workqueue_adds_total") == {"wqtest-a": 2}
    key = await q.get()
    await asyncio.sleep(0.02)
    assert values(reg, "workqueue_longest_running_processor_seconds")["wqtest-a"] >= 0.02
    q.add_rate_limited(key)
    q.done(key)
    assert values(reg, "workqueue_retries_total") == {"wqtest-a": 1}
    assert values(reg, "workqueue_longest_running_processor_seconds") == {"wqtest-a": 0}
    # durations: x waited in the queue, then was worked on for 20 ms or more
    assert values(reg, "workqueue_queue_duration_seconds_count") == {"wqtest-a": 1}
    assert values(reg, "workqueue_work_duration_seconds_count") == {"wqtest-a": 1}
    assert values(reg, "workqueue_work_duration_seconds_sum")["wqtest-a"] >= 0.02
    q.shut_down()
    assert values(reg, "workqueue_depth") == {}
