"""What a memory-storage Cluster imports to start: modules needed only later
(the Prometheus client, for the first /metrics scrape) stay out of the
start-up, which is mostly import time in a fresh process."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import sys
import kubeplane.testing
with kubeplane.testing.Cluster() as c:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "prometheus_client")
    print("loaded:" + ",".join(loaded))
"""


def test_an_api_server_cluster_starts_without_the_prometheus_client() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "loaded:"


def test_metrics_are_still_exposed_once_scraped() -> None:
    from kubeplane.apiserver.metrics import APIServerMetrics

    m = APIServerMetrics()
    m.observe_request(("GET", "", "v1", "pods", "", "namespace", ""), 200, 0.01)
    body, content_type = m.exposition()
    assert content_type.startswith("text/plain")
    assert b"apiserver_request_total" in body
