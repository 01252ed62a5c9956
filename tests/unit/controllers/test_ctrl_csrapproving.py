"""The CSR approving controller: kubelet client requests of bootstrap tokens
(nodeclient) and of nodes renewing their own (selfnodeclient) are approved
after a SubjectAccessReview against the bootstrap policy; anyone else's, and
requests that are not kubelet client certificates, are left pending."""

from __future__ import annotations

import asyncio
import base64

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from helpers import eventually
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.bootstrappolicy import reconcile
from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
from kubeplane.auth.user import UserInfo, acting_as
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.csrapproving import CSRApprovingController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CSRS = resource("certificatesigningrequests")
BOOTSTRAPPER = UserInfo("system:bootstrap:abcdef", groups=(
    "system:bootstrappers", "system:bootstrappers:kubeplane:default-node-token", "system:authenticated"))
NODE = UserInfo("system:node:n1", groups=("system:nodes", "system:authenticated"))
ALICE = UserInfo("alice", groups=("system:authenticated",))


def request(cn="system:node:n1", org="system:nodes") -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    req = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, org), x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
    return base64.b64encode(req.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)).decode()


@pytest.fixture
async def env():
    store = MemoryStore()
    cache = PolicyCache(store)
    await cache.start()
    registry = Registry(store, CATALOGUE, authorizer=RBACAuthorizer(cache))
    await reconcile(registry)
    assert await cache.wait_for_revision(store.revision)
    client = InProcessClient(registry)
    ctrl = CSRApprovingController(client)
    await ctrl.start()
    yield client
    await ctrl.stop()
    await client.close()
    await registry.close()
    await cache.stop()
    await store.close()


async def submit(client, user, name, pem, signer="kubernetes.io/kube-apiserver-client-kubelet",
                 usages=("digital signature", "client auth")):
    with acting_as(user):
        return await client.create(CSRS, {"metadata": {"name": name}, "spec": {
            "request": pem, "signerName": signer, "usages": list(usages)}})


def approved(csr):
    return [c for c in (csr.get("status") or {}).get("conditions") or [] if c["type"] == "Approved"]


def approved_csr(client, name):
    async def check():
        csr = await client.get(CSRS, name)
        return csr if approved(csr) else None
    return eventually(check, what=f"{name} approved")


async def test_a_bootstrap_token_gets_its_node_client_certificate_approved(env):
    client = env
    await submit(client, BOOTSTRAPPER, "boot", request())
    csr = await approved_csr(client, "boot")
    cond = approved(csr)[0]
    assert (cond["status"], cond["reason"]) == ("True", "AutoApproved")
    assert cond["message"] == "Auto approving kubelet client certificate after SubjectAccessReview."


async def test_a_node_renewing_its_own(env):
    client = env
    await submit(client, NODE, "renew", request())
    csr = await approved_csr(client, "renew")
    assert approved(csr)[0]["message"] == "Auto approving self kubelet client certificate after SubjectAccessReview."


async def test_left_pending(env):
    client = env
    await submit(client, ALICE, "alice", request())  # not allowed nodeclient
    with pytest.raises(Exception, match="can only create a node CSR with CN=system:node:n1"):
        await submit(client, NODE, "other-node", request("system:node:n2"))  # NodeRestriction: its own only
    await submit(client, BOOTSTRAPPER, "wrong-org", request(org="admins"))
    await submit(client, BOOTSTRAPPER, "serving", request(), usages=("digital signature", "server auth"))
    await submit(client, BOOTSTRAPPER, "boot", request())  # a sync point: the one that is approved
    await approved_csr(client, "boot")
    await asyncio.sleep(0.1)
    for name in ("alice", "wrong-org", "serving"):
        assert approved(await client.get(CSRS, name)) == [], name
