"""The CertificateSigningRequest signer, after kube-controller-manager's
``csrsigning`` controller (pkg/controller/certificates/signer).

It signs approved requests for the built-in signers with one CA certificate
and key (kube-controller-manager's ``--cluster-signing-cert-file`` and
``--cluster-signing-key-file``; ``kubeplane up`` gives it the cluster CA):

* ``kubernetes.io/kube-apiserver-client``: client certificates; usages
  ``client auth`` plus optionally ``digital signature`` and ``key encipherment``;
* ``kubernetes.io/kube-apiserver-client-kubelet``: a kubelet's client
  certificate, ``O=system:nodes``, ``CN=system:node:<name>``, no subject
  alternative names;
* ``kubernetes.io/kubelet-serving``: a kubelet's serving certificate, the same
  subject with DNS or IP names.

A request that breaks its signer's rules gets a ``Failed`` condition
(reason ``SignerValidationFailure``) instead of a certificate. The lifetime
is ``spec.expirationSeconds`` when given (at least 10 minutes), capped by the
signer's maximum (``cert_ttl``, a year by default) and by the CA's own expiry;
NotBefore is backdated 5 minutes against clock skew, as upstream does.
"""

from __future__ import annotations

import datetime as _dt
import logging
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.api.validation.certificates import APPROVED, DENIED, FAILED, decode_bytes, parse_csr
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

CSRS = resource("certificatesigningrequests")

KUBE_APISERVER_CLIENT = "kubernetes.io/kube-apiserver-client"
KUBE_APISERVER_CLIENT_KUBELET = "kubernetes.io/kube-apiserver-client-kubelet"
KUBELET_SERVING = "kubernetes.io/kubelet-serving"
SIGNERS = (KUBE_APISERVER_CLIENT, KUBE_APISERVER_CLIENT_KUBELET, KUBELET_SERVING)

#: kube-controller-manager's --cluster-signing-duration default
DEFAULT_CERT_TTL = _dt.timedelta(days=365)
BACKDATE = _dt.timedelta(minutes=5)
#: below this lifetime the end is not backdated (5 minutes are ~1 % of 8 hours)
SHORT = _dt.timedelta(hours=8)
MIN_DURATION = _dt.timedelta(minutes=10)

_KUBELET_CLIENT_USAGES = ({"digital signature", "key encipherment", "client auth"},
                          {"digital signature", "client auth"})
_KUBELET_SERVING_USAGES = ({"digital signature", "key encipherment", "server auth"},
                           {"digital signature", "server auth"})


class SignerRefused(Exception):
    """The request breaks its signer's rules (the Failed condition's message)."""


def has_true_condition(csr: Obj, ctype: str) -> bool:
    """Whether the CSR has a condition ``ctype`` with status True (upstream's HasTrueCondition)."""
    conds = (csr.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == ctype and c.get("status") == "True" for c in conds)


def is_approved(csr: Obj) -> bool:
    """Approved and not denied (upstream's IsCertificateRequestApproved)."""
    return has_true_condition(csr, APPROVED) and not has_true_condition(csr, DENIED)


def _subject(req: Any) -> tuple[list[str], str]:
    from cryptography.x509.oid import NameOID

    orgs = [a.value for a in req.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    cns = req.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return orgs, (cns[0].value if cns else "")


def _sans(req: Any) -> dict[str, list]:
    from cryptography import x509

    try:
        ext = req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return {"dns": [], "ip": [], "email": [], "uri": []}
    return {"dns": ext.get_values_for_type(x509.DNSName), "ip": ext.get_values_for_type(x509.IPAddress),
            "email": ext.get_values_for_type(x509.RFC822Name),
            "uri": ext.get_values_for_type(x509.UniformResourceIdentifier)}


def _usage_list(required: set[str]) -> str:
    return "[" + " ".join(sorted(required)) + "]"


def check_kube_apiserver_client(req: Any, usages: list[str]) -> None:
    has_client_auth = False
    for u in usages:
        if u in ("digital signature", "key encipherment"):
            continue
        if u == "client auth":
            has_client_auth = True
            continue
        raise SignerRefused(f"invalid usage for client certificate: {u}")
    if not has_client_auth:
        raise SignerRefused("missing required usage for client certificate: client auth")


def check_kubelet_client(req: Any, usages: list[str]) -> None:
    """upstream's ValidateKubeletClientCSR."""
    orgs, cn = _subject(req)
    if orgs != ["system:nodes"]:
        raise SignerRefused("subject organization is not system:nodes")
    sans = _sans(req)
    for key, what in (("dns", "DNS"), ("email", "Email"), ("ip", "IP"), ("uri", "URI")):
        if sans[key]:
            raise SignerRefused(f"{what} subjectAltNames are not allowed")
    if not cn.startswith("system:node:"):
        raise SignerRefused("subject common name does not begin with system:node:")
    if set(usages) not in _KUBELET_CLIENT_USAGES:
        raise SignerRefused(f"usages did not match {_usage_list(_KUBELET_CLIENT_USAGES[0])}")


def check_kubelet_serving(req: Any, usages: list[str]) -> None:
    """upstream's ValidateKubeletServingCSR."""
    if set(usages) not in _KUBELET_SERVING_USAGES:
        raise SignerRefused(f"usages did not match {_usage_list(_KUBELET_SERVING_USAGES[0])}")
    orgs, cn = _subject(req)
    if orgs != ["system:nodes"]:
        raise SignerRefused("subject organization is not system:nodes")
    sans = _sans(req)
    if not sans["dns"] and not sans["ip"]:
        raise SignerRefused("DNS or IP subjectAltName is required")
    if sans["email"]:
        raise SignerRefused("Email subjectAltNames are not allowed")
    if sans["uri"]:
        raise SignerRefused("URI subjectAltNames are not allowed")
    if not cn.startswith("system:node:"):
        raise SignerRefused("subject common name does not begin with system:node:")


CHECKS: dict[str, Callable[[Any, list[str]], None]] = {
    KUBE_APISERVER_CLIENT: check_kube_apiserver_client,
    KUBE_APISERVER_CLIENT_KUBELET: check_kubelet_client,
    KUBELET_SERVING: check_kubelet_serving,
}

_KEY_USAGE_BITS = {
    "signing": "digital_signature", "digital signature": "digital_signature",
    "content commitment": "content_commitment", "key encipherment": "key_encipherment",
    "key agreement": "key_agreement", "data encipherment": "data_encipherment", "cert sign": "key_cert_sign",
    "crl sign": "crl_sign", "encipher only": "encipher_only", "decipher only": "decipher_only",
}


def _ext_usage_oids() -> dict[str, Any]:
    from cryptography.x509.oid import ExtendedKeyUsageOID as E, ObjectIdentifier

    return {
        "any": E.ANY_EXTENDED_KEY_USAGE, "server auth": E.SERVER_AUTH, "client auth": E.CLIENT_AUTH,
        "code signing": E.CODE_SIGNING, "email protection": E.EMAIL_PROTECTION, "s/mime": E.EMAIL_PROTECTION,
        "ipsec end system": ObjectIdentifier("1.3.6.1.5.5.7.3.5"),
        "ipsec tunnel": ObjectIdentifier("1.3.6.1.5.5.7.3.6"),
        "ipsec user": ObjectIdentifier("1.3.6.1.5.5.7.3.7"),
        "timestamping": E.TIME_STAMPING, "ocsp signing": E.OCSP_SIGNING,
        "microsoft sgc": ObjectIdentifier("1.3.6.1.4.1.311.10.3.3"),
        "netscape sgc": ObjectIdentifier("2.16.840.1.113730.4.1"),
    }


def requested_duration(cert_ttl: _dt.timedelta, expiration_seconds: Any) -> _dt.timedelta:
    """``expirationSeconds`` if it is below the signer's maximum, at least 10 minutes."""
    if not isinstance(expiration_seconds, int) or isinstance(expiration_seconds, bool):
        return cert_ttl
    asked = _dt.timedelta(seconds=expiration_seconds)
    return min(cert_ttl, max(asked, MIN_DURATION))


@dataclass
class CertificateAuthority:
    """A CA certificate and its private key (PEM)."""

    cert: Any
    key: Any

    @classmethod
    def from_pem(cls, cert_pem: bytes | str, key_pem: bytes | str) -> "CertificateAuthority":
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        cert_b = cert_pem.encode() if isinstance(cert_pem, str) else cert_pem
        key_b = key_pem.encode() if isinstance(key_pem, str) else key_pem
        cert = x509.load_pem_x509_certificate(cert_b)
        key = serialization.load_pem_private_key(key_b, password=None)
        return cls(cert, key)

    @classmethod
    def from_files(cls, cert_file: str, key_file: str) -> "CertificateAuthority":
        with open(cert_file, "rb") as f:
            cert = f.read()
        with open(key_file, "rb") as f:
            key = f.read()
        return cls.from_pem(cert, key)

    def sign(self, req: Any, usages: Iterable[str], ttl: _dt.timedelta,
             now: _dt.datetime | None = None) -> bytes:
        """A PEM certificate for ``req`` (upstream's PermissiveSigningPolicy:
        the request's subject and SANs, the given usages, its extensions dropped)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ed448, ed25519

        if not req.is_signature_valid:
            raise SignerRefused("unable to verify certificate request signature")
        usages = list(usages)
        ext_oids = _ext_usage_oids()
        unknown = [u for u in usages if u not in _KEY_USAGE_BITS and u not in ext_oids]
        if unknown:
            raise SignerRefused(f"unrecognized usage values: {unknown!r}")
        now = now or _dt.datetime.now(_dt.timezone.utc)
        ca_not_after = self.cert.not_valid_after_utc
        not_before = now - BACKDATE
        not_after = now + ttl if ttl < SHORT else now + ttl - BACKDATE
        if not_after >= ca_not_after:
            not_after = ca_not_after
        if not_before >= ca_not_after:
            raise SignerRefused(f"the signer has expired: NotAfter={ca_not_after}")
        if now >= ca_not_after:
            raise SignerRefused(f"refusing to sign a certificate that expired in the past: NotAfter={ca_not_after}")
        builder = (x509.CertificateBuilder()
                   .subject_name(req.subject)
                   .issuer_name(self.cert.subject)
                   .public_key(req.public_key())
                   .serial_number(secrets.randbits(128) or 1)
                   .not_valid_before(not_before)
                   .not_valid_after(not_after)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        bits = {_KEY_USAGE_BITS[u] for u in usages if u in _KEY_USAGE_BITS}
        if bits:
            names = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
                     "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
            flags = {n: n in bits for n in names}
            if not flags["key_agreement"]:
                flags["encipher_only"] = flags["decipher_only"] = False
            builder = builder.add_extension(x509.KeyUsage(**flags), critical=True)
        ext = []
        for u in usages:
            oid = ext_oids.get(u)
            if oid is not None and oid not in ext:
                ext.append(oid)
        if ext:
            builder = builder.add_extension(x509.ExtendedKeyUsage(ext), critical=False)
        try:
            san = req.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            builder = builder.add_extension(san.value, critical=san.critical)
        except x509.ExtensionNotFound:
            pass
        try:
            ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        except x509.ExtensionNotFound:
            pass
        algorithm = None if isinstance(self.key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)) \
            else hashes.SHA256()
        cert = builder.sign(self.key, algorithm)
        return cert.public_bytes(serialization.Encoding.PEM)


class CSRSigningController(Controller):
    """Issues certificates for approved requests of :data:`SIGNERS`."""

    def __init__(self, client: Client, ca: CertificateAuthority, factory: SharedInformerFactory | None = None, *,
                 cert_ttl: _dt.timedelta = DEFAULT_CERT_TTL, signers: Iterable[str] = SIGNERS,
                 clock: Callable[[], _dt.datetime] | None = None, name: str = "csrsigning-controller") -> None:
        super().__init__(name, client, factory)
        self.ca = ca
        self.cert_ttl = cert_ttl
        self.signers = frozenset(signers)
        self._clock = clock
        self.csrs = self.factory.informer_for(CSRS)
        self.work = self.add_queue("csr", self.sync)
        self.csrs.add_event_handler(self._enqueue, lambda _old, new: self._enqueue(new), None)

    def _enqueue(self, csr: Obj) -> None:
        if self._wants(csr):
            self.work.add((csr.get("metadata") or {}).get("name", ""))

    def _wants(self, csr: Obj) -> bool:
        spec = csr.get("spec") or {}
        status = csr.get("status") or {}
        return (spec.get("signerName") in self.signers and is_approved(csr) and not has_true_condition(csr, FAILED)
                and not status.get("certificate"))

    async def sync(self, name: str) -> None:
        csr = self.csrs.indexer.get_by_key(name)
        if csr is None or not self._wants(csr):
            return
        spec = csr.get("spec") or {}
        data = decode_bytes(spec.get("request"))
        try:
            req = parse_csr(data or b"")
        except ValueError as err:
            raise ValueError(f'unable to parse csr "{name}": {err}') from None
        usages = [u for u in spec.get("usages") or [] if isinstance(u, str)]
        try:
            CHECKS[spec["signerName"]](req, usages)
            now = self._clock() if self._clock else None
            pem = self.ca.sign(req, usages, requested_duration(self.cert_ttl, spec.get("expirationSeconds")), now)
        except SignerRefused as err:
            await self._fail(csr, str(err))
            return
        await self._update_status(csr, lambda status: status.__setitem__("certificate", _b64(pem)))
        log.info("signed certificate for CertificateSigningRequest %s (%s)", name, spec.get("signerName"))

    async def _fail(self, csr: Obj, message: str) -> None:
        from kubeplane.api.meta import now_text

        def add(status: Obj) -> None:
            now = now_text()
            status["conditions"] = [*(status.get("conditions") or []), {
                "type": FAILED, "status": "True", "reason": "SignerValidationFailure", "message": message,
                "lastUpdateTime": now, "lastTransitionTime": now}]

        await self._update_status(csr, add)

    async def _update_status(self, csr: Obj, change: Callable[[Obj], None]) -> None:
        new = {**csr, "status": dict(csr.get("status") or {})}
        change(new["status"])
        try:
            await self.client.update(CSRS, new, subresource="status")
        except StatusError as err:
            if err.code != 404:
                raise  # a conflict: retried with the newer object the informer brings


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()
