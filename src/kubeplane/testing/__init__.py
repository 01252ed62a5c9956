"""kubeplane as a test fixture: a real Kubernetes API server in this process.

::

    from kubeplane.testing import Cluster

    with Cluster(scheduler=True, controllers=True, nodes=3) as c:
        c.apply("deploy.yaml")
        c.wait_for("deployments", "web", condition="Available")
        subprocess.run(["kubectl", "--kubeconfig", c.kubeconfig, "get", "pods"])

``async with Cluster() as c:`` runs it in the caller's event loop instead.
The pytest plugin (:mod:`kubeplane.testing.pytest_plugin`, loaded through
the ``pytest11`` entry point) offers the fixtures ``kube_cluster``,
``kube_namespace`` and ``kube_config_file``.

The names are loaded on first use, so that loading the pytest plugin (a
module of this package) costs a pytest run that uses no fixture nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeplane.testing._cluster import Cluster, resolve_resource, testing_pki_dir
    from kubeplane.testing._manifests import ManifestError, load_documents
    from kubeplane.testing._wait import JsonPath, WaitTimeout
    from kubeplane.testing._webhooks import WebhookInstallOptions, generate_certificates

_EXPORTS = {
    "Cluster": "kubeplane.testing._cluster",
    "resolve_resource": "kubeplane.testing._cluster",
    "testing_pki_dir": "kubeplane.testing._cluster",
    "ManifestError": "kubeplane.testing._manifests",
    "load_documents": "kubeplane.testing._manifests",
    "JsonPath": "kubeplane.testing._wait",
    "WaitTimeout": "kubeplane.testing._wait",
    "WebhookInstallOptions": "kubeplane.testing._webhooks",
    "generate_certificates": "kubeplane.testing._webhooks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kubeplane.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
