"""pytest fixtures for testing against a kubeplane cluster.

Installed with kubeplane (entry point ``pytest11``: ``kubeplane``), so any
project's tests can ask for them:

- ``kube_cluster``: one :class:`kubeplane.testing.Cluster` for the whole
  session, started when a test first asks for it;
- ``kube_namespace``: a fresh namespace for one test (its name), deleted after it;
- ``kube_config_file``: the cluster's kubeconfig file path.

Options (command line first, then the ini file, then the default)::

    --kube-storage=memory|sqlite         kube_storage = memory
    --kube-nodes=N                       kube_nodes = 0
    --kube-scheduler/--no-kube-scheduler kube_scheduler = false
    --kube-controllers/--no-kube-controllers  kube_controllers = false
    --kube-manifests=PATH (repeatable)   kube_manifests = (one path a line, relative to the ini file)
    --kube-crds=PATH (repeatable)        kube_crds = (CRD files or directories, Established before tests)

This module imports nothing of kubeplane until a fixture runs, so loading
the plugin costs a pytest run nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import pytest

if TYPE_CHECKING:
    from kubeplane.testing import Cluster

_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
               "off": False}
#: how long a test's namespace may take to go away before teardown warns
NAMESPACE_DELETE_TIMEOUT = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kubeplane", "kubeplane test cluster (kube_cluster fixture)")
    group.addoption("--kube-storage", choices=("memory", "sqlite"), default=None,
                    help="storage of the kube_cluster API server (ini: kube_storage; default memory)")
    group.addoption("--kube-nodes", type=int, default=None, metavar="N",
                    help="simulated nodes in kube_cluster (ini: kube_nodes; default 0)")
    group.addoption("--kube-scheduler", action=argparse.BooleanOptionalAction, default=None,
                    help="run the scheduler in kube_cluster (ini: kube_scheduler; default off)")
    group.addoption("--kube-controllers", action=argparse.BooleanOptionalAction, default=None,
                    help="run the controllers in kube_cluster (ini: kube_controllers; default off)")
    group.addoption("--kube-manifests", action="append", default=None, metavar="PATH",
                    help="apply these files or directories when kube_cluster starts (ini: kube_manifests)")
    group.addoption("--kube-crds", action="append", default=None, metavar="PATH",
                    help="CRD files or directories installed (Established) when kube_cluster starts "
                         "(ini: kube_crds)")
    parser.addini("kube_crds", "CRD files or directories installed when kube_cluster starts", type="paths",
                  default=[])
    parser.addini("kube_storage", "storage of the kube_cluster API server: memory or sqlite", default="memory")
    parser.addini("kube_nodes", "simulated nodes in kube_cluster", default="0")
    parser.addini("kube_scheduler", "run the scheduler in kube_cluster", type="bool", default=False)
    parser.addini("kube_controllers", "run the controllers in kube_cluster", type="bool", default=False)
    parser.addini("kube_manifests", "files or directories applied when kube_cluster starts", type="paths",
                  default=[])


def _ini_bool(config: pytest.Config, name: str) -> bool:
    value = config.getini(name)
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in _BOOL_WORDS:
        raise pytest.UsageError(f"{name} must be true or false, not {value!r}")
    return _BOOL_WORDS[word]


def cluster_options(config: pytest.Config) -> dict[str, Any]:
    """The keyword arguments of ``kube_cluster``'s Cluster."""
    storage = config.getoption("kube_storage") or str(config.getini("kube_storage")).strip() or "memory"
    if storage not in ("memory", "sqlite"):
        raise pytest.UsageError(f"kube_storage must be memory or sqlite, not {storage!r}")
    nodes = config.getoption("kube_nodes")
    if nodes is None:
        raw = str(config.getini("kube_nodes")).strip() or "0"
        try:
            nodes = int(raw)
        except ValueError:
            raise pytest.UsageError(f"kube_nodes must be a number, not {raw!r}") from None
    if nodes < 0:
        raise pytest.UsageError(f"the number of kube nodes cannot be negative ({nodes})")
    scheduler = config.getoption("kube_scheduler")
    controllers = config.getoption("kube_controllers")
    manifests = config.getoption("kube_manifests")
    if manifests is None:
        manifests = [os.fspath(p) for p in config.getini("kube_manifests")]
    crds = config.getoption("kube_crds")
    if crds is None:
        crds = [os.fspath(p) for p in config.getini("kube_crds")]
    return {
        "crds": [os.path.abspath(c) for c in crds] or None,
        "storage": storage,
        "nodes": nodes,
        "scheduler": _ini_bool(config, "kube_scheduler") if scheduler is None else scheduler,
        "controllers": _ini_bool(config, "kube_controllers") if controllers is None else controllers,
        "manifests": [os.path.abspath(m) for m in manifests] or None,
    }


@pytest.fixture(scope="session")
def kube_cluster(pytestconfig: pytest.Config) -> Iterator["Cluster"]:
    """A kubeplane cluster for the whole test session (see the module's options)."""
    from kubeplane.testing import Cluster

    with Cluster(**cluster_options(pytestconfig)) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kube_config_file(kube_cluster: "Cluster") -> str:
    """The path of a kubeconfig file for ``kube_cluster``."""
    return kube_cluster.kubeconfig


def namespace_name(test_name: str) -> str:
    """A namespace name for a test: its name made DNS-1123-safe and short, and a random suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:48].strip("-") or "test"
    return f"{base}-{secrets.token_hex(3)}"


@pytest.fixture
def kube_namespace(kube_cluster: "Cluster", request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace in ``kube_cluster`` for this test; its name. Deleted
    after the test, with everything in it (teardown waits until it is gone,
    and warns if that takes longer than NAMESPACE_DELETE_TIMEOUT seconds)."""
    name = namespace_name(request.node.name)
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": name, "labels": {"kubeplane.io/test": "true"}}})
    try:
        yield name
    finally:
        kube_cluster.delete("namespaces", name)
        try:
            kube_cluster.wait_for("namespaces", name, delete=True, timeout=NAMESPACE_DELETE_TIMEOUT)
        except TimeoutError as err:
            warnings.warn(f"namespace {name} is not gone yet: {err}", stacklevel=1)
