"""Joining a node with a bootstrap token (the client side of kubeadm's token
discovery and of the kubelet's TLS bootstrap).

1. Discovery: ``kube-public/cluster-info`` is read without trusting the
   server yet (no TLS verification, no credentials); its kubeconfig names the
   cluster CA. It is believed when the detached JWS of the token
   (``jws-kubeconfig-<token-id>``, HS256 keyed by the token secret) verifies,
   and, when CA hashes are given (``--ca-cert-hash sha256:...``), when the CA's
   public key has one of them.
2. TLS bootstrap: with that CA and the token, a CertificateSigningRequest for
   ``kubernetes.io/kube-apiserver-client-kubelet`` (``CN=system:node:<name>``,
   ``O=system:nodes``, an ECDSA P-256 key) is created; the cluster approves
   and signs it.
3. The node's kubeconfig is written with the certificate, its key and the CA.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Sequence

import yaml

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.auth import bootstraptoken as bt

CONFIGMAPS = resource("configmaps")
CSRS = resource("certificatesigningrequests")
KUBELET_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"


class JoinError(Exception):
    """The join cannot go on (the message says why, in one line)."""


def _client(server: str, **kw):
    from kubeplane.client.http import HttpClient
    from kubeplane.client.kubeconfig import ClientConfig

    return HttpClient(ClientConfig(server=server, **kw))


def ca_from_cluster_info(cm: dict, token: str, ca_cert_hashes: Sequence[str] = ()) -> bytes | None:
    """The CA certificate (PEM) of a trusted cluster-info ConfigMap; None when
    it is not signed for this token (yet). JoinError when it can never be trusted."""
    parsed = bt.parse_token(token)
    if parsed is None:
        raise JoinError(f'the bootstrap token "{token}" was not of the form "[a-z0-9]{{6}}.[a-z0-9]{{16}}"')
    tid, secret = parsed
    data = cm.get("data") or {}
    content = data.get(bt.KUBECONFIG_KEY)
    if not isinstance(content, str):
        raise JoinError(f"there is no {bt.KUBECONFIG_KEY} in the {bt.CLUSTER_INFO} ConfigMap")
    jws = data.get(bt.JWS_KEY_PREFIX + tid)
    if not isinstance(jws, str):
        return None
    if not bt.verify_detached_jws(jws, content, tid, secret):
        raise JoinError(f"failed to verify JWS signature of received cluster info object, can't trust this API "
                        f"Server")
    try:
        doc = yaml.safe_load(content)
        cluster = doc["clusters"][0]["cluster"]
        ca = base64.b64decode(cluster["certificate-authority-data"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError):
        raise JoinError(f"the kubeconfig of the {bt.CLUSTER_INFO} ConfigMap is not valid") from None
    if ca_cert_hashes and not bt.matches_ca_hash(ca, list(ca_cert_hashes)):
        raise JoinError("cluster CA found in cluster-info ConfigMap is invalid: none of the public keys "
                        f"\"{', '.join(ca_cert_hashes)}\" are pinned")
    return ca


async def discover(server: str, token: str, ca_cert_hashes: Sequence[str] = (), *, timeout: float = 300.0,
                   interval: float = 1.0) -> bytes:
    """The cluster CA, by token discovery (retried until the signature is there)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    client = _client(server, insecure_skip_tls_verify=True)
    try:
        while True:
            try:
                cm = await client.get(CONFIGMAPS, bt.CLUSTER_INFO, bt.CLUSTER_INFO_NAMESPACE)
                ca = ca_from_cluster_info(cm, token, ca_cert_hashes)
                if ca is not None:
                    return ca
                # as kubeadm: the bootstrap signer may not have signed for a new token yet
                last = (f"could not find a JWS signature in the {bt.CLUSTER_INFO} ConfigMap for token ID "
                        f"\"{token.split('.')[0]}\": the token id is invalid for this cluster or it has expired "
                        f"(\"kubeplane token create\" on the control plane makes a new one)")
            except StatusError as err:
                last = err.message
            except (OSError, asyncio.TimeoutError) as err:
                last = str(err) or type(err).__name__
            if time.monotonic() >= deadline:
                raise JoinError(f"could not discover the cluster at {server}: {last}")
            await asyncio.sleep(interval)
    finally:
        await client.close()


def make_csr(node_name: str) -> tuple[bytes, bytes]:
    """(CSR PEM, private key PEM) for ``system:node:<node_name>``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    req = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")]))
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return req.public_bytes(serialization.Encoding.PEM), key_pem


async def request_certificate(server: str, token: str, ca_pem: bytes, node_name: str, *, timeout: float = 300.0,
                              interval: float = 0.5) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of the node, through a CSR made with the token."""
    csr_pem, key_pem = make_csr(node_name)
    client = _client(server, token=token, ca_data=ca_pem)
    try:
        try:
            created = await client.create(CSRS, {
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"generateName": "node-csr-"},
                "spec": {"request": base64.b64encode(csr_pem).decode(), "signerName": KUBELET_CLIENT_SIGNER,
                         "usages": ["digital signature", "client auth"]}})
        except StatusError as err:
            raise JoinError(f"cannot create the certificate signing request: {err.message}") from None
        name = created["metadata"]["name"]
        deadline = time.monotonic() + timeout
        while True:
            csr = await client.get(CSRS, name)
            status = csr.get("status") or {}
            for cond in status.get("conditions") or []:
                if cond.get("type") in ("Denied", "Failed") and cond.get("status") == "True":
                    raise JoinError(f"certificate signing request {name} is {cond['type'].lower()}: "
                                    f"{cond.get('message') or cond.get('reason') or ''}".rstrip(": "))
            if status.get("certificate"):
                return base64.b64decode(status["certificate"]), key_pem
            if time.monotonic() >= deadline:
                raise JoinError(f"timed out waiting for the certificate of signing request {name} (is it approved?)")
            await asyncio.sleep(interval)
    finally:
        await client.close()


async def join(server: str, token: str, node_name: str, kubeconfig_path: str, *,
               ca_cert_hashes: Sequence[str] = (), ca_cert_hash: str | None = None, timeout: float = 300.0,
               discovery_timeout: float | None = None) -> str:
    """Discovery, TLS bootstrap and the node's kubeconfig at ``kubeconfig_path``
    (mode 0600). ``ca_cert_hash``: one pin, the same as ``ca_cert_hashes=[it]``.
    ``discovery_timeout`` (default ``timeout``): how long discovery waits for a
    cluster-info signed for the token; ``timeout``: how long the certificate may take."""
    from kubeplane.client.kubeconfig import write_kubeconfig

    if ca_cert_hash:
        ca_cert_hashes = [*ca_cert_hashes, ca_cert_hash]

    if bt.parse_token(token) is None:
        raise JoinError(f'the bootstrap token "{token}" was not of the form "[a-z0-9]{{6}}.[a-z0-9]{{16}}"')
    for h in ca_cert_hashes:
        if not h.lower().startswith("sha256:") or len(h) != 7 + 64:
            raise JoinError(f'invalid --ca-cert-hash "{h}": the format is sha256:<64 hex digits>')
    ca = await discover(server, token, ca_cert_hashes, timeout=timeout if discovery_timeout is None
                        else discovery_timeout)
    cert, key = await request_certificate(server, token, ca, node_name, timeout=timeout)
    write_kubeconfig(kubeconfig_path, server, ca_data=ca, client_cert_data=cert, client_key_data=key)
    return kubeconfig_path


__all__ = ["JoinError", "ca_from_cluster_info", "discover", "join", "make_csr", "request_certificate"]
