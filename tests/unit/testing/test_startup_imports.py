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
#: cipher); nor, until a YAML body, a CronJob, SQLite storage, a custom
#: resource's scale or a wait arrive: PyYAML (the kubeconfig is written
#: without it), the cron parser and zoneinfo, sqlite3, the JSONPath
#: evaluator, the wait conditions
LATER = ("kubeplane.admission.cel", "kubeplane.registry.matchconditions", "kubeplane.dra.cel",
         "cel_expr_python", "cryptography.hazmat.primitives.serialization", "yaml", "zoneinfo", "sqlite3",
         "kubeplane.storage.sqlite", "kubeplane.api.jsonpath", "kubeplane.api.cron", "kubeplane.testing._wait")

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


def test_throw_away_clusters_share_one_pki_and_a_kept_data_directory_has_its_own(tmp_path, monkeypatch) -> None:
    import os

    import kubeplane.testing
    from kubeplane.testing._cluster import PKI_DIR_ENV

    shared = tmp_path / "shared"
    monkeypatch.setenv(PKI_DIR_ENV, str(shared))
    with kubeplane.testing.Cluster() as c:
        assert c._server.config.pki_dir == str(shared)
        first = (shared / "ca.crt").read_bytes()
    with kubeplane.testing.Cluster(storage="sqlite") as c:
        assert c._server.config.pki_dir == str(shared)
    assert (shared / "ca.crt").read_bytes() == first
    assert oct(os.stat(shared).st_mode & 0o777) == "0o700"
    with kubeplane.testing.Cluster(storage="sqlite", data_dir=tmp_path / "d") as c:
        assert c._server.config.pki_dir == str(tmp_path / "d" / "pki")
        assert c._server.config.durable_pki is True
    assert (tmp_path / "d" / "pki" / "ca.crt").read_bytes() != first


def test_an_unusable_shared_pki_directory_falls_back_to_the_clusters_own(tmp_path, monkeypatch) -> None:
    import kubeplane.testing
    from kubeplane.testing._cluster import PKI_DIR_ENV

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(PKI_DIR_ENV, str(blocker / "pki"))
    with kubeplane.testing.Cluster() as c:
        assert c._server.config.pki_dir.endswith("/data/pki")
        assert c._server.config.durable_pki is False
        from kubernetes import client

        assert client.VersionApi(c.api_client()).get_code().git_version


CHILD_CACHED = r"""
import sys
import kubeplane.testing
with kubeplane.testing.Cluster() as c:
    from kubernetes import client
    names = [n.metadata.name for n in client.CoreV1Api(c.api_client()).list_namespace().items]
    print("cryptography:" + str(any(m.split(".")[0] == "cryptography" for m in sys.modules)) + " " + ",".join(names))
"""


def test_a_cluster_on_a_made_pki_starts_and_serves_without_the_cryptography_library(tmp_path) -> None:
    import os

    from kubeplane.testing._cluster import PKI_DIR_ENV

    env = {**os.environ, PKI_DIR_ENV: str(tmp_path / "shared")}
    runs = [subprocess.run([sys.executable, "-c", CHILD_CACHED], capture_output=True, text=True, timeout=60,
                           env=env) for _ in range(2)]
    for out in runs:
        assert out.returncode == 0, out.stderr
    # the first makes the certificates; the second authenticates the admin by
    # its client certificate and lists the namespaces without the library
    assert runs[0].stdout.split()[-2:] == ["cryptography:True", "default,kube-node-lease,kube-public,kube-system"]
    assert runs[1].stdout.split()[-2:] == ["cryptography:False", "default,kube-node-lease,kube-public,kube-system"]


def test_the_collector_is_paused_while_a_cluster_starts_and_resumed_after(monkeypatch) -> None:
    import gc

    import kubeplane.testing
    from kubeplane.apiserver.app import APIServer

    seen: list[bool] = []
    start = APIServer.start

    async def recording_start(self):
        seen.append(gc.isenabled())
        return await start(self)

    monkeypatch.setattr(APIServer, "start", recording_start)
    assert gc.isenabled()
    with kubeplane.testing.Cluster() as c:
        assert gc.isenabled()
        assert c.get("namespaces", "default")["metadata"]["name"] == "default"
    assert seen == [False]
    # a start that fails resumes it too
    try:
        with kubeplane.testing.Cluster(manifests="kind: Nope\napiVersion: v9\nmetadata: {name: x}\n"):
            raise AssertionError("started")
    except Exception as exc:  # noqa: BLE001 - whichever error the manifest gets
        assert "started" not in str(exc)
    assert gc.isenabled()
    # and a collector the program disabled stays disabled
    gc.disable()
    try:
        with kubeplane.testing.Cluster():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
