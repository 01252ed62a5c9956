"""The API server's TLS material and authenticators, from its configuration.

By default everything comes from ``<data dir>/pki`` (made on first start,
reused afterwards, as kubeadm's layout): ``ca.crt``/``ca.key`` (the cluster
CA, which also verifies client certificates), ``apiserver.crt``/``.key``
(serving, for the listen address, ``localhost``, ``127.0.0.1``, ``::1`` and
the ``kubernetes.default`` names), ``admin.crt``/``.key`` (``kubeplane-admin``
in ``system:masters``, for the kubeconfig), the components' client
certificates, and ``sa.key`` (the ServiceAccount token signing key).
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubeplane.auth import pki
from kubeplane.auth.authenticator import (DEFAULT_ISSUER, RequestAuthenticator, ServiceAccountTokenAuthenticator,
                                          TokenFileAuthenticator, X509Authenticator)
from kubeplane.auth.serviceaccount import TokenIssuer
from kubeplane.auth.user import KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, SYSTEM_MASTERS

if TYPE_CHECKING:
    from kubeplane.apiserver.app import APIServerConfig
    from kubeplane.registry.registry import Registry

log = logging.getLogger("kubeplane.apiserver")

#: the components' client certificates and kubeconfigs: file stem, user, groups
COMPONENTS = (
    ("scheduler", KUBE_SCHEDULER, ()),
    ("controller-manager", KUBE_CONTROLLER_MANAGER, ()),
)


#: the admin's client certificate: file stem, user, groups
ADMIN_CLIENT = ("admin", pki.ADMIN_USER, (SYSTEM_MASTERS,))
#: the API server's client certificate to the kubelets (as kubeadm's
#: apiserver-kubelet-client): file stem, user, groups
KUBELET_CLIENT = ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", (SYSTEM_MASTERS,))


def object_getter(registry: "Registry"):
    from kubeplane.api.errors import StatusError
    from kubeplane.api.resources import resource

    async def get(plural: str, name: str, namespace: str | None) -> dict | None:
        try:
            return await registry.get(resource(plural), name, namespace)
        except StatusError as err:
            if err.code == 404:
                return None
            raise

    return get


@dataclass
class Security:
    ssl_context: ssl.SSLContext
    authenticator: RequestAuthenticator
    issuer: TokenIssuer | None
    #: the CA clients verify the server with (PEM)
    server_ca_pem: bytes
    #: the generated PKI (None when every file was given)
    pki: pki.PKI | None

    @classmethod
    def load(cls, cfg: "APIServerConfig", host: str, registry: "Registry") -> "Security":
        from kubeplane.startup import StartupError

        try:
            return cls._load(cfg, host, registry)
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot set up TLS and authentication: {exc}") from None

    @classmethod
    def _load(cls, cfg: "APIServerConfig", host: str, registry: "Registry") -> "Security":
        directory = cfg.pki_dir or os.path.join(cfg.data_dir, "pki")
        own = pki.ensure_pki(directory, durable=cfg.durable_pki)
        if cfg.tls_cert_file or cfg.tls_private_key_file:
            if not (cfg.tls_cert_file and cfg.tls_private_key_file):
                raise ValueError("--tls-cert-file and --tls-private-key-file go together")
            crt, key = cfg.tls_cert_file, cfg.tls_private_key_file
            with open(crt, "rb") as f:
                from cryptography import x509

                chain = x509.load_pem_x509_certificates(f.read())
            # What the kubeconfig's certificate-authority-data can be: the CA of
            # the data directory if it signed the given certificate, the
            # certificate itself if self-signed, the top of a given chain;
            # otherwise none (clients then use their system roots).
            leaf = chain[0]
            if _issued_by(leaf, own.ca_cert):
                server_ca = own.ca_pem
            elif _issued_by(leaf, leaf):
                server_ca = pki.cert_pem(leaf)
            elif len(chain) > 1:
                server_ca = pki.cert_pem(chain[-1])
            else:
                server_ca = b""
        else:
            crt, key = own.serving_pair(pki.serving_names(host, *public_names(cfg, host)))
            server_ca = own.ca_pem
        client_ca = cfg.client_ca_file or own.ca_file
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(crt, key)
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.set_alpn_protocols(["http/1.1"])

        a = cfg.authentication
        issuers = tuple(a.service_account_issuers) or (DEFAULT_ISSUER,)
        audiences = tuple(a.api_audiences) or (issuers[0],)
        from kubeplane.auth import jwt

        signing_key: Any
        if a.service_account_signing_key_file:
            signing_key = pki.load_key(a.service_account_signing_key_file)
        else:
            # the PKI's own key, read when the first token is signed or checked
            signing_key = _loaded_once(own.service_account_signing_key_file())
        verify_keys: Any = []
        for path in a.service_account_key_files:
            verify_keys.extend(jwt.load_public_keys(path))
        if not a.service_account_key_files:
            verify_keys = ([signing_key.public_key()] if not callable(signing_key)
                           else lambda: [signing_key().public_key()])
        tokens: list[Any] = []
        if a.token_auth_file:
            tokens.append(TokenFileAuthenticator.from_file(a.token_auth_file))
        tokens.append(ServiceAccountTokenAuthenticator(verify_keys, object_getter(registry), issuers=issuers,
                                                       api_audiences=audiences))
        if a.bootstrap_tokens:
            from kubeplane.auth.bootstraptoken import BootstrapTokenAuthenticator

            tokens.append(BootstrapTokenAuthenticator(object_getter(registry)))
        authenticator = RequestAuthenticator(X509Authenticator(), tokens, anonymous=a.anonymous,
                                             api_audiences=audiences)
        issuer = TokenIssuer(signing_key, issuers[0])
        return cls(ctx, authenticator, issuer, server_ca, own)

    def admin_credentials(self) -> dict[str, Any]:
        assert self.pki is not None
        cert, key = self.pki.client_pair(*ADMIN_CLIENT)
        return {"ca_data": self.server_ca_pem or None, "client_cert_data": cert, "client_key_data": key}

    def component_credentials(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> dict[str, Any]:
        assert self.pki is not None
        cert, key = self.pki.client_pair(stem, user, groups)
        return {"ca_data": self.server_ca_pem or None, "client_cert_data": cert, "client_key_data": key}

    def kubelet_client_files(self) -> tuple[str, str] | None:
        """``apiserver-kubelet-client.crt``/``.key`` (made on first use), or None without a PKI."""
        if self.pki is None:
            return None
        stem = KUBELET_CLIENT[0]
        self.pki.client_pair(*KUBELET_CLIENT)
        return self.pki.path(stem + ".crt"), self.pki.path(stem + ".key")

    def write_component_kubeconfigs(self, url: str) -> None:
        """``<pki>/../<component>.kubeconfig`` for ``kubeplane scheduler`` and
        ``kubeplane controllers`` run apart (as kubeadm's scheduler.conf and
        controller-manager.conf)."""
        from kubeplane.client.kubeconfig import write_kubeconfig

        assert self.pki is not None
        base = os.path.dirname(self.pki.directory)
        for stem, user, groups in COMPONENTS:
            write_kubeconfig(os.path.join(base, f"{stem}.kubeconfig"), url,
                             **self.component_credentials(stem, user, groups))


def _loaded_once(path: str):
    """A function that reads the private key at ``path`` on its first call
    and returns that key from then on."""
    key: list[Any] = []

    def load() -> Any:
        if not key:
            key.append(pki.load_key(path))
        return key[0]

    return load


def public_names(cfg: "APIServerConfig", host: str) -> tuple[str, ...]:
    """The address clients elsewhere reach the server at, which its serving
    certificate covers too: ``--advertise-address``, or, when it listens on
    every address, the host's address (the one the ``kubernetes`` endpoints and
    cluster-info name)."""
    from kubeplane.apiserver.kubernetesservice import advertise_address

    if cfg.advertise_address:
        return (cfg.advertise_address,)
    if host in ("0.0.0.0", "::"):
        public = advertise_address(None, host)
        return (public,) if public else ()
    return ()


def _issued_by(cert, issuer) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, Exception):  # noqa: BLE001 - any failure: not its issuer
        return False


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
