"""Kubeconfig files: read the connection settings of a context, write a minimal one.

Reading follows kubectl's rules where they matter to a client: ``KUBECONFIG``
may list several files (first definition of a name wins, as does the first
``current-context``), relative file paths are relative to the file that names
them, and ``*-data`` fields carry base64-encoded PEM.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeplane.client.execcred import ExecConfig

def _yaml() -> tuple[Any, Any, Any]:
    """PyYAML and its safe loader and dumper (the C ones unless PyYAML was
    built without libyaml), imported when a kubeconfig is first read."""
    import yaml

    try:
        return yaml, yaml.CSafeLoader, yaml.CSafeDumper
    except AttributeError:  # PyYAML built without libyaml
        return yaml, yaml.SafeLoader, yaml.SafeDumper


class KubeconfigError(ValueError):
    """The kubeconfig is missing, malformed or does not define the wanted context."""


@dataclass(frozen=True)
class ClientConfig:
    """Everything needed to reach one API server as one user."""

    server: str
    token: str | None = None
    username: str | None = None
    password: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    client_cert_data: bytes | None = None  # PEM
    client_key_data: bytes | None = None  # PEM
    ca_file: str | None = None
    ca_data: bytes | None = None  # PEM
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    namespace: str = "default"
    #: a credential plugin (``user.exec``); it takes precedence over a static token
    exec_config: "ExecConfig | None" = None
    #: ``user.tokenFile`` (``token`` holds what it said when loaded); clients
    #: read it again as it changes (rotated ServiceAccount tokens)
    token_file: str | None = None

    @property
    def is_tls(self) -> bool:
        return self.server.lower().startswith("https://")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``https`` servers, ``None`` for plain ``http``."""
        if not self.is_tls:
            return None
        if self.insecure_skip_tls_verify:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data is not None or self.ca_file is not None:
            # A cluster CA replaces the system roots, as in client-go.
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            if self.ca_data is not None:
                ctx.load_verify_locations(cadata=self.ca_data.decode())
            else:
                ctx.load_verify_locations(cafile=self.ca_file)
        else:
            ctx = ssl.create_default_context()
        if self.client_cert_file or self.client_cert_data:
            self._load_client_cert(ctx)
        return ctx

    def _load_client_cert(self, ctx: ssl.SSLContext) -> None:
        # The ssl module only loads certificate chains from files: inline data
        # goes through private temporary files that are removed right away.
        temps: list[str] = []
        try:
            cert = self.client_cert_file
            key = self.client_key_file
            if self.client_cert_data is not None:
                cert = _private_temp(self.client_cert_data, temps)
            if self.client_key_data is not None:
                key = _private_temp(self.client_key_data, temps)
            assert cert is not None
            ctx.load_cert_chain(cert, key)
        finally:
            for path in temps:
                os.unlink(path)

    def auth_headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.username is not None:
            raw = f"{self.username}:{self.password or ''}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        return {}


def _private_temp(data: bytes, created: list[str]) -> str:
    fd, path = tempfile.mkstemp(prefix="kubeplane-", suffix=".pem")
    created.append(path)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def default_kubeconfig_paths() -> list[str]:
    """``$KUBECONFIG`` (a path list) or ``~/.kube/config``."""
    env = os.environ.get("KUBECONFIG")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    return [str(Path.home() / ".kube" / "config")]


def _read_file(path: str) -> dict[str, Any]:
    yaml, loader, _ = _yaml()
    try:
        with open(path, "rb") as f:
            doc = yaml.load(f, Loader=loader)
    except FileNotFoundError:
        raise KubeconfigError(f"kubeconfig {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path} is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path} is not a mapping")
    base = os.path.dirname(os.path.abspath(path))
    _resolve_paths(doc, base)
    return doc


_PATH_FIELDS = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


def _resolve_paths(doc: dict[str, Any], base: str) -> None:
    for section, (inner, fields) in _PATH_FIELDS.items():
        for entry in doc.get(section) or []:
            body = (entry or {}).get(inner) or {}
            for field in fields:
                value = body.get(field)
                if value and isinstance(value, str) and not os.path.isabs(value):
                    body[field] = os.path.join(base, value)
            # An exec command with a path separator is relative to the file, as in
            # client-go; a bare name is looked up on PATH.
            plugin = body.get("exec") if section == "users" else None
            if isinstance(plugin, dict):
                command = plugin.get("command")
                if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
                    plugin["command"] = os.path.normpath(os.path.join(base, command))


def _merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": None}
    for doc in docs:
        for section in ("clusters", "users", "contexts"):
            for entry in doc.get(section) or []:
                name = (entry or {}).get("name")
                if name is not None and name not in merged[section]:
                    merged[section][name] = entry
        if merged["current-context"] is None and doc.get("current-context"):
            merged["current-context"] = doc["current-context"]
    return merged


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=False)
    except (ValueError, TypeError) as exc:
        raise KubeconfigError(f"{what} is not valid base64: {exc}") from None


def load_kubeconfig(path: str | None = None, context: str | None = None) -> ClientConfig:
    """The :class:`ClientConfig` of ``context`` (default: the current context)."""
    paths = [path] if path else default_kubeconfig_paths()
    existing = [p for p in paths if path or os.path.exists(p)]
    if not existing:
        raise KubeconfigError(f"no kubeconfig found (looked in {', '.join(paths)})")
    merged = _merge([_read_file(p) for p in existing])

    ctx_name = context or merged["current-context"]
    if not ctx_name:
        raise KubeconfigError("kubeconfig has no current-context and none was given")
    ctx_entry = merged["contexts"].get(ctx_name)
    if ctx_entry is None:
        raise KubeconfigError(f'context "{ctx_name}" not found in kubeconfig')
    ctx = ctx_entry.get("context") or {}

    cluster_entry = merged["clusters"].get(ctx.get("cluster"))
    if cluster_entry is None:
        raise KubeconfigError(f'cluster "{ctx.get("cluster")}" of context "{ctx_name}" not found')
    cluster = cluster_entry.get("cluster") or {}
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f'cluster "{ctx.get("cluster")}" has no server')

    user: dict[str, Any] = {}
    if ctx.get("user"):
        user_entry = merged["users"].get(ctx["user"])
        if user_entry is None:
            raise KubeconfigError(f'user "{ctx["user"]}" of context "{ctx_name}" not found')
        user = user_entry.get("user") or {}

    token = user.get("token")
    if not token and user.get("tokenFile"):
        with open(user["tokenFile"], encoding="utf-8") as f:
            token = f.read().strip()

    ca_data = _b64(cluster["certificate-authority-data"], "certificate-authority-data") \
        if cluster.get("certificate-authority-data") else None
    exec_config = None
    if user.get("exec") is not None:
        exec_config = _exec_config(user["exec"], ctx["user"], str(server), cluster, ca_data)

    return ClientConfig(
        server=str(server).rstrip("/"),
        token=token or None,
        username=user.get("username"),
        password=user.get("password"),
        client_cert_file=user.get("client-certificate"),
        client_key_file=user.get("client-key"),
        client_cert_data=_b64(user["client-certificate-data"], "client-certificate-data")
        if user.get("client-certificate-data") else None,
        client_key_data=_b64(user["client-key-data"], "client-key-data")
        if user.get("client-key-data") else None,
        ca_file=cluster.get("certificate-authority"),
        ca_data=ca_data,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        tls_server_name=cluster.get("tls-server-name"),
        namespace=ctx.get("namespace") or "default",
        exec_config=exec_config,
        token_file=user.get("tokenFile") if not user.get("token") else None,
    )


def _exec_config(raw: Any, user: str, server: str, cluster: dict[str, Any], ca_data: bytes | None) -> "ExecConfig":
    import dataclasses

    from kubeplane.client.execcred import ExecConfig, cluster_info

    cfg = ExecConfig.from_kubeconfig(raw, user)
    if not cfg.provide_cluster_info:
        return cfg
    if ca_data is None and cluster.get("certificate-authority"):
        try:
            with open(cluster["certificate-authority"], "rb") as f:
                ca_data = f.read()
        except OSError as exc:
            raise KubeconfigError(f"cannot read certificate-authority {cluster['certificate-authority']}: "
                                  f"{exc.strerror or exc}") from None
    extension = None
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
            extension = ext.get("extension")
    info = cluster_info(server, ca_data, bool(cluster.get("insecure-skip-tls-verify", False)),
                        cluster.get("tls-server-name"), extension)
    return dataclasses.replace(cfg, cluster=info)


def is_kubeplane_kubeconfig(path: str, name: str = "kubeplane") -> bool:
    """Whether ``path`` is a kubeconfig as :func:`write_kubeconfig` writes them
    (one cluster, user and context named ``name``), not a user's own file."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return False
    yaml, loader, _ = _yaml()
    try:
        doc = yaml.load(text, Loader=loader)
    except yaml.YAMLError:
        return False
    if not isinstance(doc, dict) or doc.get("current-context") != name:
        return False
    sections = [doc.get(s) for s in ("clusters", "users", "contexts")]
    return all(isinstance(s, list) and len(s) == 1 and isinstance(s[0], dict) and s[0].get("name") == name
               for s in sections)


def write_kubeconfig(path: str, server: str, name: str = "kubeplane", *, ca_data: bytes | None = None,
                     client_cert_data: bytes | None = None, client_key_data: bytes | None = None,
                     token: str | None = None, durable: bool = True) -> None:
    """Write a kubeconfig with one cluster (its CA, PEM, inline), one user
    (client certificate and key, PEM, or a token; none: no credentials) and
    one context (namespace ``default``), replacing ``path`` atomically
    (``durable``: synced to disk first)."""
    cluster: dict[str, Any] = {"server": server}
    if ca_data:
        cluster["certificate-authority-data"] = base64.b64encode(ca_data).decode()
    user: dict[str, Any] = {}
    if client_cert_data and client_key_data:
        user["client-certificate-data"] = base64.b64encode(client_cert_data).decode()
        user["client-key-data"] = base64.b64encode(client_key_data).decode()
    if token:
        user["token"] = token
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}
        ],
        "current-context": name,
    }
    text = _plain_yaml(doc)
    if text is None:
        yaml, _, dumper = _yaml()
        text = yaml.dump(doc, Dumper=dumper, default_flow_style=False, sort_keys=False)
    from kubeplane.auth.pki import write_private

    write_private(path, text.encode("utf-8"), durable, dir_mode=0o777, prefix=".kubeconfig-")


#: strings PyYAML writes as they are (plain) and reads back as strings:
#: a letter first, no space, no ':' last; the words it reads as booleans or
#: null excepted (:data:`_YAML_WORDS`)
_PLAIN = None
_YAML_WORDS = frozenset(w for b in ("yes", "no", "true", "false", "on", "off", "null")
                        for w in (b, b.capitalize(), b.upper()))


def _plain_yaml(doc: dict) -> str | None:
    """``yaml.dump(doc, default_flow_style=False, sort_keys=False)`` of a
    kubeconfig document without PyYAML (whose import is a tenth of an API
    server's start): the same text for mappings, lists of mappings and
    strings written plain; None for anything else (the caller dumps with
    PyYAML then)."""
    global _PLAIN
    if _PLAIN is None:
        import re

        _PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9._/:+=-]*(?<!:)")
    out: list[str] = []

    def mapping(m: dict, pad: str, first: str | None) -> bool:
        for i, (k, v) in enumerate(m.items()):
            if not (isinstance(k, str) and _PLAIN.fullmatch(k) and k not in _YAML_WORDS):
                return False
            lead = first if (i == 0 and first is not None) else pad
            if isinstance(v, str):
                if not (_PLAIN.fullmatch(v) and v not in _YAML_WORDS):
                    return False
                out.append(f"{lead}{k}: {v}\n")
            elif isinstance(v, dict):
                if not v:
                    out.append(f"{lead}{k}: {{}}\n")
                else:
                    out.append(f"{lead}{k}:\n")
                    if not mapping(v, pad + "  ", None):
                        return False
            elif isinstance(v, list):
                if not v:
                    out.append(f"{lead}{k}: []\n")
                    continue
                out.append(f"{lead}{k}:\n")
                for item in v:
                    if not (isinstance(item, dict) and item):
                        return False
                    if not mapping(item, pad + "  ", pad + "- "):
                        return False
            else:
                return False
        return True

    return "".join(out) if isinstance(doc, dict) and doc and mapping(doc, "", None) else None
