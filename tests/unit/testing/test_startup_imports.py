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

#: modules a cluster without policies, webhook configurations, DRA objects or
#: key files to read does not need: the admission CEL environment, the
#: webhooks' matchConditions library, the DRA selectors' CEL (so the CEL
#: library at all), cryptography's serialization package (SSH keys, every
#: cipher)
LATER = ("kubeplane.admission.cel", "kubeplane.registry.matchconditions", "kubeplane.dra.cel",
         "cel_expr_python", "cryptography.hazmat.primitives.serialization")

CHILD_LATER = r"""
import sys
import kubeplane.testing
with kubeplane.testing.Cluster() as c:
    print("loaded:" + ",".join(m for m in sys.argv[1].split(",") if m in sys.modules))
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


def test_an_api_server_cluster_starts_without_cel_or_key_loading() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD_LATER, ",".join(LATER)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "loaded:"


def test_a_written_key_reads_back_as_the_key() -> None:
    from cryptography.hazmat.primitives import serialization

    from kubeplane.auth import pki

    for _ in range(50):
        key = pki.new_key()
        pem = pki.key_pem(key)
        assert pem == key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
        back = serialization.load_pem_private_key(pem, password=None)
        assert back.private_numbers() == key.private_numbers()


def test_only_a_given_data_directory_gets_a_durable_pki(tmp_path) -> None:
    import kubeplane.testing

    with kubeplane.testing.Cluster() as c:
        assert c._server.config.durable_pki is False
    with kubeplane.testing.Cluster(storage="sqlite", data_dir=tmp_path / "d") as c:
        assert c._server.config.durable_pki is True
