"""The admission chain: upstream's plugin names and phases, and room for more plugins."""

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.registry.admission import (
    CREATE,
    AdmissionChain,
    AdmissionPlugin,
    Attributes,
    DefaultStorageClass,
    NamespaceLifecycle,
    default_chain,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CMS = resource("configmaps")
NAMESPACES = resource("namespaces")
PVCS = resource("persistentvolumeclaims")
CLASSES = resource("storageclasses")


class Labeller(AdmissionPlugin):
    """Mutates ConfigMaps on create, then refuses one the validating phase sees unlabelled."""

    name = "Labeller"

    def __init__(self):
        self.seen = []

    def handles(self, operation, res):
        return operation == CREATE and res.key == CMS.key

    async def admit(self, attrs: Attributes):
        self.seen.append(("admit", attrs.name, attrs.namespace))
        attrs.obj["metadata"].setdefault("labels", {})["admitted"] = "yes"

    async def validate(self, attrs: Attributes):
        self.seen.append(("validate", attrs.name))
        if attrs.name == "refused":
            raise StatusError(403, "Forbidden", "refused by Labeller")


def test_default_chain_has_upstreams_plugins_in_order():
    chain = default_chain(MemoryStore())
    assert [p.name for p in chain.plugins] == [
        "NamespaceLifecycle", "LimitRanger", "NodeRestriction", "Priority", "DefaultTolerationSeconds",
        "DefaultStorageClass", "CertificateSubjectRestriction", "DefaultIngressClass", "MutatingAdmissionWebhook",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionWebhook", "ResourceQuota"]
    assert isinstance(chain.plugins[0], NamespaceLifecycle) and isinstance(chain.plugins[5], DefaultStorageClass)
    # the API server's chain: ServiceAccount between them, as in upstream's list
    with_sa = default_chain(MemoryStore(), service_accounts=True)
    assert [p.name for p in with_sa.plugins] == [
        "NamespaceLifecycle", "LimitRanger", "ServiceAccount", "NodeRestriction", "Priority", "DefaultTolerationSeconds",
        "DefaultStorageClass", "CertificateSubjectRestriction", "DefaultIngressClass", "MutatingAdmissionWebhook",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionWebhook", "ResourceQuota"]
    # upstream's --disable-admission-plugins
    assert [p.name for p in default_chain(MemoryStore(), disabled=("Priority", "ResourceQuota",
                                                                   "NodeRestriction")).plugins][:3] == [
        "NamespaceLifecycle", "LimitRanger", "DefaultTolerationSeconds"]


@pytest.fixture
async def registry_with_labeller():
    store = MemoryStore()
    labeller = Labeller()
    registry = Registry(store, CATALOGUE, admission=AdmissionChain([*default_chain(store).plugins, labeller]))
    await ensure_default_namespaces(registry)
    yield registry, labeller
    await registry.close()
    await store.close()


async def test_a_new_plugin_joins_both_phases(registry_with_labeller):
    registry, labeller = registry_with_labeller
    cm = await registry.create(CMS, {"metadata": {"name": "c"}}, "default")
    assert cm["metadata"]["labels"] == {"admitted": "yes"}
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, {"metadata": {"name": "refused"}}, "default")
    assert exc.value.code == 403
    assert labeller.seen == [("admit", "c", "default"), ("validate", "c"),
                             ("admit", "refused", "default"), ("validate", "refused")]
    await registry.create(resource("secrets"), {"metadata": {"name": "s"}}, "default")
    assert len(labeller.seen) == 4  # handles() decides per resource: not called for Secrets


async def test_default_plugins_still_apply(registry_with_labeller):
    registry, _ = registry_with_labeller
    await registry.create(CLASSES, {"metadata": {"name": "fast", "annotations": {
        "storageclass.kubernetes.io/is-default-class": "true"}}, "provisioner": "example.com/p"})
    pvc = await registry.create(PVCS, {"metadata": {"name": "p"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}, "default")
    assert pvc["spec"]["storageClassName"] == "fast"
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, {"metadata": {"name": "c"}}, "missing")
    assert exc.value.code == 404
    with pytest.raises(StatusError) as exc:
        await registry.delete(NAMESPACES, "kube-system")
    assert exc.value.code == 403 and "may not be deleted" in exc.value.message
