"""The pytest plugin, loaded for real through its ``pytest11`` entry point by a
separate pytest run over a test module that uses only the fixtures."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from conftest import KUBECTL

REPO = Path(__file__).resolve().parents[2]

FIXTURE_TESTS = '''
import ast
import os
import subprocess
import sys
import threading

import pytest

from kubeplane.api.errors import StatusError

KUBECTL = {kubectl!r}
SEEN = {{}}


def test_nothing_starts_for_a_test_without_the_fixtures():
    assert not any(t.name == "kubeplane-testing" for t in threading.enumerate())
    assert "kubeplane.apiserver.app" not in sys.modules
    assert "kubernetes" not in sys.modules


def test_options_from_the_ini_file_and_the_command_line(kube_cluster):
    assert kube_cluster.storage == "sqlite"  # --kube-storage over kube_storage = memory
    assert (kube_cluster.nodes, kube_cluster.scheduler, kube_cluster.controllers) == (2, True, True)
    # kube_manifests, relative to the ini file, was applied at start.
    assert kube_cluster.get("configmaps", "from-ini")["data"] == {{"a": "b"}}


def test_kubectl_in_a_fresh_namespace(kube_config_file, kube_namespace, tmp_path):
    SEEN["first"] = kube_namespace
    assert kube_namespace.startswith("test-kubectl-in-a-fresh-namespace-")
    env = dict(os.environ, HOME=str(tmp_path))
    deploy = """
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec: {{containers: [{{name: c, image: nginx}}]}}
"""
    out = subprocess.run([KUBECTL, "--kubeconfig", kube_config_file, "-n", kube_namespace, "apply", "-f", "-"],
                         input=deploy, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([KUBECTL, "--kubeconfig", kube_config_file, "-n", kube_namespace, "wait",
                          "--for=condition=Available", "deployment/web", "--timeout=30s"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_cluster_is_shared_and_namespaces_are_not(kube_cluster, kube_namespace):
    first = SEEN["first"]
    assert kube_namespace != first
    with pytest.raises(StatusError) as err:
        kube_cluster.get("namespaces", first)
    assert err.value.code == 404  # deleted, with its Deployment, after the test
    kube_cluster.apply(
        "apiVersion: apps/v1\\nkind: Deployment\\nmetadata: {{name: api}}\\nspec:\\n  replicas: 2\\n"
        "  selector: {{matchLabels: {{app: api}}}}\\n  template:\\n    metadata: {{labels: {{app: api}}}}\\n"
        "    spec: {{containers: [{{name: c, image: i}}]}}\\n", namespace=kube_namespace)
    pods = kube_cluster.wait_for("pods", namespace=kube_namespace, label_selector="app=api",
                                 jsonpath="{{.status.phase}}=Running", timeout=30)
    assert len(pods) == 2


async def test_async_tests_use_the_session_cluster(kube_cluster, kube_namespace):
    await kube_cluster.apply_async("apiVersion: v1\\nkind: ConfigMap\\nmetadata: {{name: x}}\\n",
                                   namespace=kube_namespace)
    got = await kube_cluster.wait_for_async("configmap/x", namespace=kube_namespace)
    assert got["metadata"]["namespace"] == kube_namespace
'''


def entry_point_site(tmp: Path) -> Path:
    """A directory holding distribution metadata with the entry points that
    pyproject.toml declares, as ``pip install`` writes it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"]["pytest11"]
    site = tmp / "site"
    dist = site / "kubeplane-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kubeplane\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items()))
    return site


def run_pytest(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(entry_point_site(tmp) if not (tmp / "site").exists() else tmp / "site"),
                                         str(REPO / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=300)


def test_fixture_only_module_runs_through_the_entry_point(tmp_path):
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-ini, namespace: default}\ndata: {a: b}\n")
    (tmp_path / "pytest.ini").write_text(textwrap.dedent("""\
        [pytest]
        asyncio_mode = auto
        kube_storage = memory
        kube_nodes = 2
        kube_scheduler = true
        kube_controllers = true
        kube_manifests = manifests
        """))
    (tmp_path / "test_with_fixtures.py").write_text(FIXTURE_TESTS.format(kubectl=KUBECTL))
    run = run_pytest(tmp_path, "-q", "--kube-storage=sqlite", "test_with_fixtures.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "5 passed" in run.stdout, run.stdout


def test_options_are_the_plugins_and_off_without_it(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    shown = run_pytest(tmp_path, "--help")
    assert shown.returncode == 0, shown.stderr
    for flag in ("--kube-storage", "--kube-nodes", "--kube-scheduler", "--no-kube-scheduler",
                 "--kube-controllers", "--kube-manifests"):
        assert flag in shown.stdout
    hidden = run_pytest(tmp_path, "-p", "no:kubeplane", "--help")
    assert hidden.returncode == 0 and "--kube-storage" not in hidden.stdout


def test_bad_options_are_usage_errors(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nkube_nodes = many\n")
    (tmp_path / "test_x.py").write_text("def test_x(kube_cluster):\n    pass\n")
    run = run_pytest(tmp_path, "-q", "test_x.py")
    assert run.returncode != 0 and "kube_nodes must be a number, not 'many'" in run.stdout + run.stderr


def imported_after(code: str) -> list[str]:
    """The kubeplane modules (and heavy dependencies) a fresh interpreter has after ``code``."""
    probe = (f"import sys; {code}; print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('kubeplane', 'aiohttp', 'kubernetes', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"),
                                                                          os.environ.get("PYTHONPATH", "")])))
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout)


def test_loading_the_plugin_imports_nothing_heavy():
    assert imported_after("import kubeplane.testing.pytest_plugin") == \
        ["kubeplane", "kubeplane.testing", "kubeplane.testing.pytest_plugin"]
    # The package's names load on use; the official client only in api_client().
    loaded = imported_after("from kubeplane.testing import Cluster")
    assert "kubeplane.testing._cluster" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("aiohttp", "kubernetes", "numpy")
                or m.startswith(("kubeplane.apiserver", "kubeplane.registry", "kubeplane.scheduler"))]


@pytest.mark.parametrize("test_name, prefix", [
    ("test_x[a/b-1]", "test-x-a-b-1-"),
    ("T" * 80, "t" * 48 + "-"),
    ("___", "test-"),
])
def test_namespace_names_are_valid(test_name, prefix):
    import re

    from kubeplane.testing.pytest_plugin import namespace_name

    name = namespace_name(test_name)
    assert name.startswith(prefix) and len(name) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)


def test_the_readme_example_runs(tmp_path):
    """The README's pytest example and ini file, as a user would copy them."""
    import re

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Testing against kubeplane from Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    ini = re.search(r"```ini\n(.*?)```", section, re.S).group(1)
    assert "def test_web_deployment(kube_cluster, kube_namespace, kube_config_file)" in code
    (tmp_path / "pytest.ini").write_text(ini)
    (tmp_path / "test_web.py").write_text(code)
    run = run_pytest(tmp_path, "-q", "test_web.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
