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
"""

from kubeplane.testing._cluster import Cluster, resolve_resource
from kubeplane.testing._manifests import ManifestError, load_documents
from kubeplane.testing._wait import JsonPath, WaitTimeout

__all__ = ["Cluster", "JsonPath", "ManifestError", "WaitTimeout", "load_documents", "resolve_resource"]
