"""The pytest plugin's CRD option: kube_crds (ini) / --kube-crds installs
CustomResourceDefinitions, Established, before the first test runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: apples.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: apples, kind: Apple}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"""

TESTS = '''
def test_the_crd_is_served(kube_cluster, kube_namespace):
    crd = kube_cluster.get("crd", "apples.example.com")
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
    kube_cluster.apply({"apiVersion": "example.com/v1", "kind": "Apple", "metadata": {"name": "a"}},
                       namespace=kube_namespace)
    assert kube_cluster.get("apples", "a", namespace=kube_namespace)["metadata"]["name"] == "a"
'''


def test_kube_crds_from_the_ini_file(tmp_path):
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "apples.yaml").write_text(CRD)
    (tmp_path / "pytest.ini").write_text(textwrap.dedent("""\
        [pytest]
        kube_crds = crds
        """))
    (tmp_path / "test_crds.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:kubeplane",
                          "-p", "kubeplane.testing.pytest_plugin", "-q", "test_crds.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
