"""Admission webhooks served by the test process (envtest's WebhookInstallOptions).

::

    from kubeplane.testing import Cluster, WebhookInstallOptions

    def deny_bad(request):          # an AdmissionRequest dict
        if request["object"]["metadata"].get("labels", {}).get("bad"):
            return {"allowed": False, "status": {"code": 403, "message": "bad label"}}
        return {"allowed": True, "patch": [{"op": "add", "path": "/metadata/annotations", "value": {"seen": "1"}}]}

    with Cluster() as c, WebhookInstallOptions("webhooks.yaml", handler=deny_bad).installed(c) as wh:
        ...  # every request the configurations match reaches deny_bad over HTTPS

The configurations (objects, YAML text or files, as :meth:`Cluster.apply`
takes them) get their ``clientConfig`` pointed at ``https://HOST:PORT/PATH``
(the path of the configuration's ``service.path`` or ``url``, ``/`` if none)
with the ``caBundle`` of a CA generated for the run; the serving certificate
(ECDSA P-256, for ``127.0.0.1``, ``localhost`` and ``host``) is written to
:attr:`WebhookInstallOptions.cert_dir` for a server of your own (``cert_file``,
``key_file``, :meth:`server_ssl_context`), or a ``handler`` (one callable, or a
dict path -> callable; sync or async) is served for you on the cluster's event
loop. A handler gets the review's ``request`` and returns the ``response``
(``uid`` is filled in; a ``patch`` given as a list is encoded as a JSONPatch).
``uninstall`` (or leaving ``installed``) deletes the configurations and stops
the server.
"""

from __future__ import annotations

import base64
import datetime
import inspect
import ipaddress
import os
import socket
import ssl
import tempfile
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Iterator, Union

import orjson

from kubeplane.api.meta import deep_copy
from kubeplane.testing._manifests import load_documents

if TYPE_CHECKING:
    from kubeplane.testing._cluster import Cluster

Handler = Callable[[dict], Union[dict, Awaitable[dict]]]

_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
_GROUP = "admissionregistration.k8s.io/v1"


def generate_certificates(hosts: list[str], days: int = 7) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, serving key) in PEM: a fresh CA
    and a certificate it signed for ``hosts`` (IP addresses or DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubeplane-testing-webhook-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class WebhookInstallOptions:
    """Webhook configurations pointed at a server in the test process, with
    certificates generated for it (see the module documentation)."""

    def __init__(self, manifests: Any = None, *, mutating: list[dict] | None = None,
                 validating: list[dict] | None = None, host: str = "127.0.0.1", port: int = 0,
                 handler: Handler | dict[str, Handler] | None = None,
                 cert_dir: str | os.PathLike[str] | None = None) -> None:
        docs: list[dict] = []
        if manifests is not None:
            docs += [d for d, _ in load_documents(manifests)]
        for kind, extra in (("MutatingWebhookConfiguration", mutating), ("ValidatingWebhookConfiguration",
                                                                          validating)):
            for d in extra or []:
                d = dict(d)
                d.setdefault("apiVersion", _GROUP)
                d.setdefault("kind", kind)
                docs.append(d)
        for d in docs:
            if d.get("kind") not in _KINDS:
                raise ValueError(f"not a webhook configuration: {d.get('kind')} {d.get('metadata', {}).get('name')}")
        self.configurations_in = docs
        self.host = host
        self.port = port or _free_port(host)
        self.handlers: dict[str, Handler] = ({} if handler is None else
                                             dict(handler) if isinstance(handler, dict) else {"": handler})
        self._own_dir = cert_dir is None
        self.cert_dir = Path(cert_dir) if cert_dir is not None else Path(tempfile.mkdtemp(prefix="kubeplane-wh-"))
        self.ca_pem, cert_pem, key_pem = generate_certificates([host, "127.0.0.1", "localhost"])
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        self.cert_file = self.cert_dir / "tls.crt"
        self.key_file = self.cert_dir / "tls.key"
        self.ca_file = self.cert_dir / "ca.crt"
        self.cert_file.write_bytes(cert_pem)
        self.key_file.write_bytes(key_pem)
        os.chmod(self.key_file, 0o600)
        self.ca_file.write_bytes(self.ca_pem)
        self._runner: Any = None
        self._installed: list[tuple[str, str]] = []

    # -- configuration ----------------------------------------------------------

    def url(self, path: str = "/") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}{path if path.startswith('/') else '/' + path}"

    def configurations(self) -> list[dict]:
        """Copies of the configurations with every clientConfig pointed here."""
        ca = base64.b64encode(self.ca_pem).decode()
        out = []
        for doc in self.configurations_in:
            doc = deep_copy(doc)
            for hook in doc.get("webhooks") or []:
                cc = hook.get("clientConfig") if isinstance(hook.get("clientConfig"), dict) else {}
                path = "/"
                if isinstance(cc.get("service"), dict):
                    path = cc["service"].get("path") or "/"
                elif isinstance(cc.get("url"), str):
                    from urllib.parse import urlsplit

                    path = urlsplit(cc["url"]).path or "/"
                hook["clientConfig"] = {"url": self.url(path), "caBundle": ca}
            out.append(doc)
        return out

    def server_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx

    # -- the server for handlers --------------------------------------------------

    def _handler_for(self, path: str) -> Handler | None:
        if path in self.handlers:
            return self.handlers[path]
        return self.handlers.get("")

    async def _start_server(self) -> None:
        if not self.handlers or self._runner is not None:
            return
        from aiohttp import web

        async def serve(request: web.Request) -> web.Response:
            handler = self._handler_for(request.path)
            if handler is None:
                return web.Response(status=404, text=f"no webhook handler for {request.path}")
            review = orjson.loads(await request.read())
            req = review.get("request") or {}
            result = handler(req)
            if inspect.isawaitable(result):
                result = await result
            response = dict(result or {})
            response["uid"] = req.get("uid")
            patch = response.get("patch")
            if isinstance(patch, list):
                response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
                response.setdefault("patchType", "JSONPatch")
            return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                      "response": response}, dumps=lambda o: orjson.dumps(o).decode())

        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", serve)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port, ssl_context=self.server_ssl_context()).start()
        self._runner = runner

    async def _stop_server(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -- install / uninstall ---------------------------------------------------------

    async def _install(self, cluster: "Cluster") -> list[dict]:
        await self._start_server()
        objs = await cluster.apply_async(self.configurations())
        self._installed = [(o["kind"], o["metadata"]["name"]) for o in objs]
        return objs

    async def _uninstall(self, cluster: "Cluster") -> None:
        try:
            for kind, name in self._installed:
                plural = kind.lower() + "s"
                await cluster.delete_async(f"{plural}.admissionregistration.k8s.io", name)
            self._installed = []
        finally:
            await self._stop_server()
            if self._own_dir:
                for f in (self.cert_file, self.key_file, self.ca_file):
                    f.unlink(missing_ok=True)
                try:
                    self.cert_dir.rmdir()
                except OSError:
                    pass

    def install(self, cluster: "Cluster") -> list[dict]:
        """Start the handler server (if any) and create the configurations;
        in effect for the cluster's next request. Returns them as stored."""
        return cluster._call(self._install(cluster), "install")

    async def install_async(self, cluster: "Cluster") -> list[dict]:
        return await cluster._acall(self._install(cluster))

    def uninstall(self, cluster: "Cluster") -> None:
        cluster._call(self._uninstall(cluster), "uninstall")

    async def uninstall_async(self, cluster: "Cluster") -> None:
        await cluster._acall(self._uninstall(cluster))

    @contextmanager
    def installed(self, cluster: "Cluster") -> Iterator["WebhookInstallOptions"]:
        self.install(cluster)
        try:
            yield self
        finally:
            self.uninstall(cluster)

    @asynccontextmanager
    async def installed_async(self, cluster: "Cluster") -> AsyncIterator["WebhookInstallOptions"]:
        await self.install_async(cluster)
        try:
            yield self
        finally:
            await self.uninstall_async(cluster)


__all__ = ["WebhookInstallOptions", "generate_certificates"]
