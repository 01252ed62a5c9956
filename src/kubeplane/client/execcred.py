"""Exec credential plugins (``users[].user.exec`` in a kubeconfig), as client-go runs them.

The plugin is a program that prints a ``client.authentication.k8s.io``
``ExecCredential`` (v1 or v1beta1) with a bearer token or a client
certificate and key. It is run when credentials are first needed, its answer
is cached until ``status.expirationTimestamp`` (forever without one), and it
is run again when the API server answers 401 to the credentials it gave.

The plugin gets ``KUBERNETES_EXEC_INFO``: an ExecCredential whose ``spec``
says whether it may interact with the user (``interactiveMode``: ``Never``,
``IfAvailable`` - when standard input is a terminal -, ``Always`` - which
fails without a terminal) and, with ``provideClusterInfo``, the cluster.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from kubeplane.api.meta import parse_timestamp

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
SUPPORTED_VERSIONS = (V1, V1BETA1)
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")

#: a non-interactive plugin that has not answered by then is killed
PLUGIN_TIMEOUT = 60.0
#: the most of a plugin's output that is read
MAX_OUTPUT = 1 << 20


class ExecCredentialError(RuntimeError):
    """The plugin could not be run or gave no usable credentials."""


@dataclass(frozen=True)
class ExecConfig:
    """A kubeconfig ``exec`` stanza, validated."""

    command: str
    api_version: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    install_hint: str = ""
    provide_cluster_info: bool = False
    interactive_mode: str = "IfAvailable"
    #: the ExecCredential ``spec.cluster`` (only with provide_cluster_info)
    cluster: dict[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def from_kubeconfig(cls, raw: Any, user: str) -> "ExecConfig":
        """Validate the stanza as client-go does; errors name the user."""
        from kubeplane.client.kubeconfig import KubeconfigError

        where = f'exec plugin of user "{user}"'
        if not isinstance(raw, dict):
            raise KubeconfigError(f"{where}: exec must be a mapping")
        command = raw.get("command")
        if not command or not isinstance(command, str):
            raise KubeconfigError(f"{where}: command must be specified to use exec authentication plugin")
        api_version = raw.get("apiVersion")
        if not api_version:
            raise KubeconfigError(f"{where}: apiVersion must be specified to use exec authentication plugin")
        if api_version not in SUPPORTED_VERSIONS:
            raise KubeconfigError(f'{where}: exec plugin: invalid apiVersion "{api_version}" '
                                  f"(supported: {', '.join(SUPPORTED_VERSIONS)})")
        mode = raw.get("interactiveMode")
        if not mode:
            if api_version == V1:
                raise KubeconfigError(f"{where}: interactiveMode must be specified to use exec authentication "
                                      f"plugin with apiVersion {V1}")
            mode = "IfAvailable"
        if mode not in INTERACTIVE_MODES:
            raise KubeconfigError(f'{where}: invalid interactiveMode "{mode}": valid values are '
                                  + ", ".join(INTERACTIVE_MODES))
        args = raw.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise KubeconfigError(f"{where}: args must be a list of strings")
        env: list[tuple[str, str]] = []
        for i, e in enumerate(raw.get("env") or []):
            if not isinstance(e, dict) or not e.get("name"):
                raise KubeconfigError(f"{where}: env[{i}] must have a name")
            env.append((str(e["name"]), "" if e.get("value") is None else str(e["value"])))
        return cls(command=command, api_version=api_version, args=tuple(args), env=tuple(env),
                   install_hint=str(raw.get("installHint") or ""),
                   provide_cluster_info=bool(raw.get("provideClusterInfo", False)), interactive_mode=mode)


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    client_cert: bytes | None = None  # PEM
    client_key: bytes | None = None  # PEM
    expires: float | None = None  # epoch seconds

    def valid(self, now: float) -> bool:
        return self.expires is None or now < self.expires


class ExecCredentialProvider:
    """Runs one plugin and caches what it answered (one run at a time)."""

    def __init__(self, config: ExecConfig, *, stdin_is_terminal: bool | None = None,
                 timeout: float = PLUGIN_TIMEOUT) -> None:
        self.config = config
        self._stdin_tty = stdin_is_terminal
        self.timeout = timeout
        self._creds: Credentials | None = None
        self._lock = asyncio.Lock()
        #: how many times the plugin ran (for tests and debugging)
        self.runs = 0

    def _interactive(self) -> bool:
        tty = self._stdin_tty
        if tty is None:
            try:
                tty = sys.stdin is not None and sys.stdin.isatty()
            except (ValueError, OSError):
                tty = False
        mode = self.config.interactive_mode
        if mode == "Never":
            return False
        if mode == "Always" and not tty:
            raise ExecCredentialError(
                "getting credentials: exec plugin cannot support interactive mode: standard input is not a terminal")
        return tty

    async def get(self) -> Credentials:
        """Cached credentials, or the plugin's fresh answer."""
        creds = self._creds
        if creds is not None and creds.valid(time.time()):
            return creds
        async with self._lock:
            creds = self._creds
            if creds is not None and creds.valid(time.time()):
                return creds
            self._creds = await self._run()
            return self._creds

    def invalidate(self, used: Credentials) -> None:
        """The API server refused ``used`` (401): the next :meth:`get` runs the plugin again."""
        if self._creds is used:
            self._creds = None

    async def _run(self) -> Credentials:
        cfg = self.config
        interactive = self._interactive()
        info: dict[str, Any] = {"apiVersion": cfg.api_version, "kind": "ExecCredential",
                                "spec": {"interactive": interactive}}
        if cfg.provide_cluster_info and cfg.cluster is not None:
            info["spec"]["cluster"] = cfg.cluster
        env = dict(os.environ)
        env.update(cfg.env)
        env["KUBERNETES_EXEC_INFO"] = orjson.dumps(info).decode()
        self.runs += 1
        try:
            proc = await asyncio.create_subprocess_exec(
                cfg.command, *cfg.args, env=env,
                stdin=None if interactive else asyncio.subprocess.DEVNULL,
                # stderr is the user's, as in client-go: the plugin's messages and prompts reach them
                stdout=asyncio.subprocess.PIPE, stderr=None)
        except FileNotFoundError:
            hint = f"\n\n{cfg.install_hint}" if cfg.install_hint else ""
            raise ExecCredentialError(
                f'getting credentials: exec: executable {cfg.command} not found{hint}') from None
        except OSError as exc:
            raise ExecCredentialError(f"getting credentials: exec: {exc.strerror or exc}") from None
        try:
            if interactive:
                out, _ = await proc.communicate()
            else:
                out, _ = await asyncio.wait_for(proc.communicate(), self.timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise ExecCredentialError(f"getting credentials: exec: executable {cfg.command} did not answer "
                                      f"within {self.timeout:g}s") from None
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if proc.returncode != 0:
            raise ExecCredentialError(f"getting credentials: exec: executable {cfg.command} failed with exit code "
                                      f"{proc.returncode}")
        return self._decode(out[:MAX_OUTPUT])

    def _decode(self, out: bytes) -> Credentials:
        cfg = self.config
        try:
            doc = orjson.loads(out)
        except orjson.JSONDecodeError as exc:
            raise ExecCredentialError(f"getting credentials: decoding stdout: {exc}") from None
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
            raise ExecCredentialError("getting credentials: decoding stdout: not an ExecCredential")
        if doc.get("apiVersion") != cfg.api_version:
            raise ExecCredentialError(f'getting credentials: exec plugin is configured to use API version '
                                      f'{cfg.api_version}, plugin returned version {doc.get("apiVersion")}')
        status = doc.get("status")
        if not isinstance(status, dict):
            raise ExecCredentialError("getting credentials: exec plugin didn't return a status field")
        token = status.get("token") or None
        cert = status.get("clientCertificateData") or None
        key = status.get("clientKeyData") or None
        if token is None and (cert is None or key is None):
            raise ExecCredentialError("getting credentials: exec plugin didn't return a token or cert/key pair")
        if (cert is None) != (key is None):
            raise ExecCredentialError("getting credentials: exec plugin returned only "
                                      + ("clientCertificateData" if cert else "clientKeyData"))
        expires = None
        if status.get("expirationTimestamp"):
            try:
                expires = parse_timestamp(str(status["expirationTimestamp"]))
            except ValueError:
                raise ExecCredentialError("getting credentials: invalid expirationTimestamp "
                                          f"{status['expirationTimestamp']!r}") from None
        return Credentials(token=str(token) if token else None,
                           client_cert=str(cert).encode() if cert else None,
                           client_key=str(key).encode() if key else None, expires=expires)


def cluster_info(server: str, ca_data: bytes | None, insecure: bool, tls_server_name: str | None,
                 extension: Any = None) -> dict[str, Any]:
    """The ExecCredential ``spec.cluster`` of a kubeconfig cluster."""
    out: dict[str, Any] = {"server": server}
    if tls_server_name:
        out["tls-server-name"] = tls_server_name
    if insecure:
        out["insecure-skip-tls-verify"] = True
    if ca_data:
        out["certificate-authority-data"] = base64.b64encode(ca_data).decode()
    if extension is not None:
        out["config"] = extension
    return out


__all__ = ["Credentials", "ExecConfig", "ExecCredentialError", "ExecCredentialProvider", "SUPPORTED_VERSIONS",
           "cluster_info"]
