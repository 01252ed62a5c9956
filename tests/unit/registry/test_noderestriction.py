"""NodeRestriction admission through the registry: a node writes its own
Node (labels in the kubelet's set, taints untouched), its own Lease, status
and deletion of its pods only, mirror pods only, tokens bound to its pods,
its own kubelet CSRs; other users are not restricted."""

from __future__ import annotations

import base64

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.auth.user import UserInfo, acting_as
from kubeplane.registry.admission import AdmissionChain, NamespaceLifecycle
from kubeplane.registry.noderestriction import NodeRestriction, forbidden_labels, is_kubelet_label
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

NODES = resource("nodes")
PODS = resource("pods")
LEASES = resource("leases")
CSRS = resource("certificatesigningrequests")
N1 = UserInfo("system:node:n1", groups=("system:nodes", "system:authenticated"))


@pytest.fixture
async def registry():
    store = MemoryStore()
    reg = Registry(store, CATALOGUE, admission=AdmissionChain([NamespaceLifecycle(store), NodeRestriction(store)]))
    await ensure_default_namespaces(reg)
    yield reg
    await reg.close()
    await store.close()


def node(name, **labels):
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod(name, node_name, **md):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **md},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "busybox"}]}}


def forbidden(exc_info) -> str:
    assert exc_info.value.code == 403, exc_info.value
    return exc_info.value.message


def test_kubelet_labels():
    assert is_kubelet_label("kubernetes.io/hostname") and is_kubelet_label("node.kubernetes.io/instance-type")
    assert is_kubelet_label("kubelet.kubernetes.io/anything") and is_kubelet_label("x.node.kubernetes.io/y")
    assert not is_kubelet_label("node-role.kubernetes.io/control-plane")
    assert forbidden_labels({"node-restriction.kubernetes.io/pci", "team", "example.k8s.io/x"}, "UPDATE") == [
        "example.k8s.io/x", "node-restriction.kubernetes.io/pci"]
    assert forbidden_labels({"node-role.kubernetes.io/worker"}, "CREATE") == []


async def test_its_own_node_with_allowed_labels(registry):
    with acting_as(N1):
        await registry.create(NODES, node("n1", **{"kubernetes.io/hostname": "n1", "team": "x"}))
        with pytest.raises(StatusError) as e:
            await registry.create(NODES, node("n2"))
        assert forbidden(e) == 'nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2"'
        with pytest.raises(StatusError) as e:
            await registry.patch(NODES, "n1", {"metadata": {"labels": {"node-restriction.kubernetes.io/a": "1"}}})
        assert forbidden(e) == ('nodes "n1" is forbidden: is not allowed to modify labels: '
                                'node-restriction.kubernetes.io/a')
        with pytest.raises(StatusError) as e:
            await registry.patch(NODES, "n1", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
        assert forbidden(e) == 'nodes "n1" is forbidden: node "n1" is not allowed to modify taints'
        await registry.patch(NODES, "n1", {"status": {"capacity": {"cpu": "2"}}}, subresource="status")
    # an administrator is not restricted
    await registry.patch(NODES, "n1", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
    await registry.delete(NODES, "n1")
    with pytest.raises(StatusError) as e, acting_as(N1):
        await registry.create(NODES, node("n1", **{"node-role.kubernetes.io/control-plane": ""}))
    assert "not allowed to set the following labels: node-role.kubernetes.io/control-plane" in forbidden(e)


async def test_pods_bound_to_it_only(registry):
    await registry.create(PODS, pod("mine", "n1"), "default")
    await registry.create(PODS, pod("theirs", "n2"), "default")
    with acting_as(N1):
        await registry.patch(PODS, "mine", {"status": {"phase": "Running"}}, "default", subresource="status")
        with pytest.raises(StatusError) as e:
            await registry.patch(PODS, "theirs", {"status": {"phase": "Running"}}, "default", subresource="status")
        assert forbidden(e) == ('pods "theirs" is forbidden: node "n1" can only update pod status for pods with '
                                'spec.nodeName set to itself')
        with pytest.raises(StatusError) as e:
            await registry.delete(PODS, "theirs", "default")
        assert forbidden(e) == ('pods "theirs" is forbidden: node "n1" can only delete pods with spec.nodeName '
                                'set to itself')
        await registry.delete(PODS, "mine", "default", grace_period_seconds=0)
        with pytest.raises(StatusError) as e:
            await registry.create(PODS, pod("new", "n1"), "default")
        assert forbidden(e) == ('pods "new" is forbidden: pod does not have "kubernetes.io/config.mirror" '
                                'annotation, node "n1" can only create mirror pods')
        with pytest.raises(StatusError) as e:
            await registry.create(PODS, pod("m", "n1", annotations={"kubernetes.io/config.mirror": "x"}), "default")
        assert forbidden(e) == ('pods "m" is forbidden: node "n1" can only create pods with an owner reference '
                                'set to itself')


async def test_its_own_lease_in_the_node_lease_namespace(registry):
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "n1"},
             "spec": {"holderIdentity": "n1"}}
    with acting_as(N1):
        await registry.create(LEASES, lease, "kube-node-lease")
        with pytest.raises(StatusError) as e:
            await registry.create(LEASES, {**lease, "metadata": {"name": "n2"}}, "kube-node-lease")
        assert forbidden(e) == ('leases.coordination.k8s.io "n2" is forbidden: can only access node lease with '
                                'the same name as the requesting node')
        with pytest.raises(StatusError) as e:
            await registry.create(LEASES, lease, "default")
        assert 'can only access leases in the "kube-node-lease" system namespace' in forbidden(e)


def _csr_pem(cn: str) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    req = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
        x509.NameAttribute(NameOID.COMMON_NAME, cn)])).sign(key, hashes.SHA256())
    return base64.b64encode(req.public_bytes(serialization.Encoding.PEM)).decode()


async def test_kubelet_csrs_for_itself_only(registry):
    def csr(name, cn):
        return {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": name},
                "spec": {"request": _csr_pem(cn), "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                         "usages": ["digital signature", "client auth"]}}

    with acting_as(N1):
        await registry.create(CSRS, csr("ok", "system:node:n1"))
        with pytest.raises(StatusError) as e:
            await registry.create(CSRS, csr("bad", "system:node:n2"))
        assert forbidden(e) == ('certificatesigningrequests.certificates.k8s.io "bad" is forbidden: can only '
                                'create a node CSR with CN=system:node:n1')
