"""Certificates and keys of a cluster: its CA, the API server's serving
certificate, client certificates of the admin and the components, and the
ServiceAccount token signing key.

As kubeadm lays them out, under ``<data dir>/pki``: made on first start and
reused afterwards (a serving certificate that lacks one of the names the
server now answers on is issued again). Keys are ECDSA P-256: making one
costs well under a millisecond, so a throw-away cluster's whole PKI is made
in a few milliseconds.
"""

from __future__ import annotations

import base64
import datetime as _dt
import ipaddress
import os
import tempfile

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

# cryptography is imported where a certificate or key is made or read, not
# with this module: a PKI made before is used from its files alone (the API
# server's TLS context reads them itself), which keeps a start that makes
# nothing free of the import.


#: the names every serving certificate covers, besides the listen address
DEFAULT_SERVING_NAMES = ("localhost", "127.0.0.1", "::1", "kubernetes", "kubernetes.default",
                         "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
CA_DAYS = 3650
CERT_DAYS = 365
#: a certificate closer than this to its end is issued again at start
RENEW_BEFORE = _dt.timedelta(days=30)

ADMIN_USER = "kubeplane-admin"


def new_key() -> "ec.EllipticCurvePrivateKey":
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


#: the DER of a P-256 key's PKCS#8 PrivateKeyInfo up to its 32-byte private
#: value (RFC 5915 ECPrivateKey, version 1, inside RFC 5208's structure with
#: the id-ecPublicKey/prime256v1 algorithm), and from there to the public point
_P256_PKCS8_HEAD = bytes.fromhex("308187020100301306072a8648ce3d020106082a8648ce3d030107046d306b0201010420")
_P256_PKCS8_MID = bytes.fromhex("a144034200")


def key_pem(key) -> bytes:
    """The unencrypted PKCS#8 PEM of ``key``. A P-256 key's is laid out here:
    cryptography's ``private_bytes`` imports its whole ``serialization``
    package (SSH keys, every cipher) on first use, a tenth of a throw-away
    cluster's start-up."""
    from cryptography.hazmat.primitives._serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
    from cryptography.hazmat.primitives.asymmetric import ec

    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        point = key.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        der = _P256_PKCS8_HEAD + key.private_numbers().private_value.to_bytes(32, "big") + _P256_PKCS8_MID + point
        b64 = base64.b64encode(der).decode()
        lines = [b64[i:i + 64] for i in range(0, len(b64), 64)]
        return ("-----BEGIN PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END PRIVATE KEY-----\n").encode()
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def cert_pem(cert: "x509.Certificate") -> bytes:
    # the enums where cryptography defines them: its ``serialization``
    # package also imports the SSH key format and, through it, every cipher
    from cryptography.hazmat.primitives._serialization import Encoding

    return cert.public_bytes(Encoding.PEM)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> "x509.Name":
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def make_ca(cn: str = "kubeplane-ca", days: int = CA_DAYS) -> tuple["x509.Certificate", "ec.EllipticCurvePrivateKey"]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = new_key()
    now = _now()
    name = _name(cn)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca_cert: "x509.Certificate", ca_key, cn: str, *, orgs: tuple[str, ...] = (), server_names: tuple[str, ...] = (),
          client: bool = True, days: int = CERT_DAYS, key=None) -> tuple["x509.Certificate", object]:
    """A leaf certificate signed by the CA: for a client (``cn`` the user name,
    ``orgs`` its groups, as upstream's x509 authenticator reads them) or, with
    ``server_names`` (DNS names and IP addresses), for serving."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = key or new_key()
    now = _now()
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    b = (x509.CertificateBuilder().subject_name(_name(cn, orgs)).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - _dt.timedelta(minutes=5))
         .not_valid_after(min(now + _dt.timedelta(days=days), ca_cert.not_valid_after_utc))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                      data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                      crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    try:
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
            ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value)
        b = b.add_extension(aki, critical=False)
    except x509.ExtensionNotFound:
        pass
    if server_names:
        b = b.add_extension(x509.SubjectAlternativeName(_general_names(server_names)), critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def _general_names(names: tuple[str, ...]) -> list["x509.GeneralName"]:
    from cryptography import x509

    out: list[x509.GeneralName] = []
    seen = set()
    for n in names:
        if not n or n in seen:
            continue
        seen.add(n)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def serving_names(host: str, *extra: str) -> tuple[str, ...]:
    """The listen host (unless it is a wildcard address; then the host name),
    ``extra`` names (the advertised address) and the defaults."""
    names = [*(e for e in extra if e), *DEFAULT_SERVING_NAMES]
    if host and host not in ("0.0.0.0", "::"):
        names.insert(0, host)
    else:
        import socket

        names.insert(0, socket.gethostname())
    return tuple(dict.fromkeys(names))


def covers(cert: "x509.Certificate", names: tuple[str, ...]) -> bool:
    """Whether ``cert``'s SANs include every one of ``names``."""
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(v) for v in san.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    for n in names:
        try:
            n = str(ipaddress.ip_address(n))
        except ValueError:
            pass
        if n not in have:
            return False
    return True


def load_cert(path: str) -> "x509.Certificate":
    from cryptography import x509

    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


def load_certs(path: str) -> list["x509.Certificate"]:
    from cryptography import x509

    with open(path, "rb") as f:
        return x509.load_pem_x509_certificates(f.read())


def load_key(path: str):
    from cryptography.hazmat.primitives import serialization

    with open(path, "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None)


def write_private(path: str, data: bytes, durable: bool = True, *, dir_mode: int = 0o700,
                  prefix: str = ".pki-") -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only
    (``dir_mode`` for a directory that has to be made); ``durable``: on disk
    (fsync) before it replaces the old file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _fresh(cert: "x509.Certificate") -> bool:
    return cert.not_valid_after_utc - _now() > RENEW_BEFORE


#: the leaf files' record of what they hold (``<stem>.meta``, JSON, written
#: with them): who they name, for which CA, until when. A start finds in it
#: whether the leaf still fits without parsing the certificate.
_META = ".meta"


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _canonical(names: tuple[str, ...]) -> list[str]:
    out = []
    for n in names:
        try:
            n = str(ipaddress.ip_address(n))
        except ValueError:
            pass
        out.append(n)
    return out


class PKI:
    """The files of one cluster's PKI (paths); the CA's certificate and key
    are read when a certificate has to be made or checked."""

    def __init__(self, directory: str, ca_cert: Any = None, ca_key: Any = None, durable: bool = True) -> None:
        self.directory = directory
        self._ca_cert = ca_cert
        self._ca_key = ca_key
        #: files made are synced to disk (not for a throw-away directory)
        self.durable = durable
        self._ca_pem: bytes | None = None

    @property
    def ca_file(self) -> str:
        return os.path.join(self.directory, "ca.crt")

    @property
    def ca_cert(self) -> "x509.Certificate":
        if self._ca_cert is None:
            self._ca_cert = load_cert(self.ca_file)
        return self._ca_cert

    @property
    def ca_key(self) -> Any:
        if self._ca_key is None:
            self._ca_key = load_key(self.path("ca.key"))
        return self._ca_key

    @property
    def ca_pem(self) -> bytes:
        if self._ca_pem is None:
            if self._ca_cert is not None:
                self._ca_pem = cert_pem(self._ca_cert)
            else:
                with open(self.ca_file, "rb") as f:
                    self._ca_pem = f.read()
        return self._ca_pem

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def serving_pair(self, names: tuple[str, ...]) -> tuple[str, str]:
        """``apiserver.crt``/``apiserver.key``, issued again when they do not
        cover ``names``, are about to expire or are not the CA's."""
        crt, key = self.path("apiserver.crt"), self.path("apiserver.key")
        if self._recorded("apiserver", names=names):
            return crt, key
        if not self._valid(crt, key, names):
            cert, k = issue(self.ca_cert, self.ca_key, "kube-apiserver", server_names=names, client=False)
            write_private(key, key_pem(k), self.durable)
            write_private(crt, cert_pem(cert), self.durable)
        self._record("apiserver", names=names)
        return crt, key

    def client_pair(self, stem: str, cn: str, orgs: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
        """``<stem>.crt``/``<stem>.key``, a client certificate for ``cn`` in
        ``orgs``: made once, reused while valid. Returns the PEM data."""
        crt, key = self.path(stem + ".crt"), self.path(stem + ".key")
        recorded = self._recorded(stem, cn=cn, orgs=orgs)
        if recorded or self._valid(crt, key, None, cn, orgs):
            try:
                with open(crt, "rb") as f1, open(key, "rb") as f2:
                    cp, kp = f1.read(), f2.read()
            except OSError:
                pass
            else:
                if not recorded:
                    self._record(stem, cn=cn, orgs=orgs)
                return cp, kp
        cert, k = issue(self.ca_cert, self.ca_key, cn, orgs=orgs)
        cp, kp = cert_pem(cert), key_pem(k)
        write_private(key, kp, self.durable)
        write_private(crt, cp, self.durable)
        self._record(stem, cn=cn, orgs=orgs)
        return cp, kp

    def _recorded(self, stem: str, *, names: tuple[str, ...] | None = None, cn: str | None = None,
                  orgs: tuple[str, ...] = ()) -> bool:
        """Whether ``<stem>.meta`` says the leaf is the CA's, fresh and for
        these names (or this user), its files present."""
        import orjson

        try:
            with open(self.path(stem + _META), "rb") as f:
                meta = orjson.loads(f.read())
            os.stat(self.path(stem + ".key"))
            with open(self.path(stem + ".crt"), "rb") as f:
                leaf = f.read()
            not_after = _dt.datetime.fromisoformat(meta["notAfter"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if not isinstance(meta, dict) or meta.get("ca") != _digest(self.ca_pem) or meta.get("crt") != _digest(leaf):
            return False
        if not_after - _now() <= RENEW_BEFORE:
            return False
        if names is not None and not set(_canonical(names)) <= set(meta.get("names") or ()):
            return False
        if cn is not None and (meta.get("cn") != cn or meta.get("orgs") != list(orgs)):
            return False
        return True

    def _record(self, stem: str, *, names: tuple[str, ...] | None = None, cn: str | None = None,
                orgs: tuple[str, ...] = ()) -> None:
        import orjson

        try:
            with open(self.path(stem + ".crt"), "rb") as f:
                leaf = f.read()
            cert = load_cert(self.path(stem + ".crt"))
        except (OSError, ValueError):
            return
        meta: dict[str, Any] = {"ca": _digest(self.ca_pem), "crt": _digest(leaf),
                                "notAfter": cert.not_valid_after_utc.isoformat()}
        if names is not None:
            meta["names"] = _canonical(names)
        if cn is not None:
            meta["cn"], meta["orgs"] = cn, list(orgs)
        write_private(self.path(stem + _META), orjson.dumps(meta), self.durable)

    def _valid(self, crt: str, key: str, names: tuple[str, ...] | None, cn: str | None = None,
               orgs: tuple[str, ...] = ()) -> bool:
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            cert = load_cert(crt)
            os.stat(key)
        except (OSError, ValueError):
            return False
        if cert.issuer != self.ca_cert.subject or not _fresh(cert):
            return False
        try:
            self.ca_cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                                             ec.ECDSA(cert.signature_hash_algorithm))
        except Exception:  # noqa: BLE001 - any failure: not ours
            return False
        if names is not None and not covers(cert, names):
            return False
        if cn is not None and cert.subject != _name(cn, orgs):
            return False
        return True

    def service_account_signing_key_file(self) -> str:
        """``sa.key``, the ServiceAccount token signing key (ES256), made once."""
        path = self.path("sa.key")
        if not os.path.exists(path):
            write_private(path, key_pem(new_key()), self.durable)
        return path

    def service_account_signing_key(self) -> tuple[str, object]:
        """``sa.key`` (made once) and the key itself."""
        path = self.service_account_signing_key_file()
        return path, load_key(path)


def ensure_self_signed_pair(crt: str, key: str, host: str, names: tuple[str, ...]) -> tuple[str, str]:
    """The serving pair at ``crt``/``key`` while its certificate covers ``names``, else a new
    one for them, signed by a CA made for it alone (client-go's ``GenerateSelfSignedCertKey``,
    what the kubelet does without ``--tls-cert-file``; the subject is ``host@<unix time>``)."""
    import time

    if os.path.exists(crt) and os.path.exists(key):
        try:
            if covers(load_cert(crt), names):
                return crt, key
        except (OSError, ValueError):
            pass
    ca_cert, ca_key = make_ca(f"{host}-ca@{int(time.time())}")
    cert, leaf_key = issue(ca_cert, ca_key, f"{host}@{int(time.time())}", server_names=names, client=False)
    write_private(key, key_pem(leaf_key))
    write_private(crt, cert_pem(cert) + cert_pem(ca_cert))
    return crt, key


def ensure_pki(directory: str, durable: bool = True) -> PKI:
    """The CA in ``directory``, made there when there is none (its files
    are read when needed). ``durable=False`` skips syncing the files made
    to disk: for a directory thrown away with the process (a test's
    cluster), where a lost write costs nothing."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    crt, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key")
    if os.path.exists(crt) and os.path.exists(key):
        return PKI(directory, durable=durable)
    cert, k = make_ca()
    write_private(key, key_pem(k), durable)
    write_private(crt, cert_pem(cert), durable)
    return PKI(directory, cert, k, durable)
