"""``--encryption-provider-config``: upstream's EncryptionConfiguration file.

::

    apiVersion: apiserver.config.k8s.io/v1
    kind: EncryptionConfiguration
    resources:
      - resources: [secrets]            # also configmaps, deployments.apps, *.apps, *. (core), *.*
        providers:
          - aesgcm: {keys: [{name: key2, secret: <base64 of 16, 24 or 32 bytes>}]}
          - aescbc: {keys: [{name: key1, secret: <base64 of 16, 24 or 32 bytes>}]}
          - secretbox: {keys: [{name: key0, secret: <base64 of 32 bytes>}]}
          - identity: {}

The file is validated as upstream validates it (same field paths and
messages); a resource takes the providers of every entry naming it, in file
order; a resource is looked up exactly, then by ``*.<group>``, then ``*.*``.
Resources that are not named are written as they are and cannot read an
encrypted value. KMS providers need a plugin this project does not run:
they are refused.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any


from kubeplane.api import errors
from kubeplane.storage.transformer import (
    IDENTITY,
    Provider,
    ValueTransformer,
    aes_provider,
    identity_provider,
    secretbox_provider,
)

API_VERSION = "apiserver.config.k8s.io/v1"
KIND = "EncryptionConfiguration"

AES_KEY_SIZES = (16, 24, 32)
SECRETBOX_KEY_SIZES = (32,)
PROVIDER_KINDS = ("kms", "aesgcm", "aescbc", "secretbox", "identity")

_MORE_THAN_ONE = "more than one provider specified in a single element, should split into different list elements"
_NO_PROVIDER = "provider does not contain any of the expected providers: KMS, AESGCM, AESCBC, Secretbox, Identity"
_EVENTS_GROUP = ("'*.events.k8s.io' objects are stored using the 'events' API group in etcd. "
                 "Use 'events' instead in the config file")
_EXTENSIONS_GROUP = "'extensions' group has been removed and cannot be used for encryption"
_STAR_RESOURCE = "use '*.' to encrypt all the resources from core API group or *.* to encrypt all resources"
_OVERLAP = ("using overlapping resources such as 'secrets' and '*.' in the same resource list is not allowed "
            "as they will be masked")
_NON_REST = "resources which do not have REST API/s cannot be encrypted"
_CAPITALS = "resource name should not contain capital letters"
_ACROSS_GROUPS = "encrypting the same resource across groups is not supported"
_DUPLICATE = "the same resource cannot be specified multiple times"


class EncryptionConfigError(ValueError):
    """The file cannot be used; the message is upstream's."""


def parse_group_resource(text: str) -> tuple[str, str]:
    """upstream's schema.ParseGroupResource: ``secrets`` -> ("", "secrets"),
    ``deployments.apps`` -> ("apps", "deployments"), ``*.`` -> ("", "*")."""
    resource, dot, group = text.partition(".")
    return (group, resource) if dot else ("", text)


def _go_ints(sizes: tuple[int, ...]) -> str:
    return "[" + " ".join(str(s) for s in sizes) + "]"


def _line(cause: errors.Cause) -> str:
    return f"{cause.field}: {cause.message}"


def _aggregate(causes: list[errors.Cause]) -> str:
    lines: list[str] = []
    for c in causes:
        if _line(c) not in lines:
            lines.append(_line(c))
    return lines[0] if len(lines) == 1 else "[" + ", ".join(lines) + "]"


def _validate_resources(resources: list[Any], path: str) -> list[errors.Cause]:
    causes: list[errors.Cause] = []
    if len(resources) >= 2:
        parsed = [parse_group_resource(str(r)) for r in resources]
        duplicate = overlap = False
        for i, a in enumerate(parsed):
            for j, b in enumerate(parsed):
                if i == j:
                    continue
                if a == b and not duplicate:
                    duplicate = True
                    continue
                if overlap:
                    continue
                if a == ("*", "*") or (a[0] == b[0] and "*" in (a[1], b[1])):
                    overlap = True
        if duplicate:
            causes.append(errors.invalid_value(path, resources, _DUPLICATE))
        if overlap:
            causes.append(errors.invalid_value(path, resources, _OVERLAP))
    for j, res in enumerate(resources):
        at = f"{path}[{j}]"
        if not isinstance(res, str):
            causes.append(errors.invalid_value(at, res, "must be a string"))
            continue
        group, resource = parse_group_resource(res)
        if res.lower() != res:
            causes.append(errors.invalid_value(at, res, _CAPITALS))
        elif res == "*":
            causes.append(errors.invalid_value(at, res, _STAR_RESOURCE))
        elif res in ("apiserveripinfo", "serviceipallocations", "servicenodeportallocations"):
            causes.append(errors.invalid_value(at, res, _NON_REST))
        elif group == "events.k8s.io":
            causes.append(errors.invalid_value(at, res, _EVENTS_GROUP))
        elif group == "extensions":
            causes.append(errors.invalid_value(at, res, _EXTENSIONS_GROUP))
        elif group == "*" and resource != "*":
            causes.append(errors.invalid_value(at, res, _ACROSS_GROUPS))
    return causes


def _validate_keys(keys: Any, path: str, sizes: tuple[int, ...]) -> list[errors.Cause]:
    if not isinstance(keys, list) or not keys:
        return [errors.required(path, "at least one keys is required")]
    causes: list[errors.Cause] = []
    for i, key in enumerate(keys):
        at = f"{path}[{i}]"
        key = key if isinstance(key, dict) else {}
        if not key.get("name"):
            causes.append(errors.required(f"{at}.name", "name is a mandatory field for a key"))
        secret = key.get("secret")
        if not secret:
            causes.append(errors.required(f"{at}.secret", "secret is a mandatory field for a key"))
            continue
        try:
            raw = base64.b64decode(str(secret), validate=True)
        except (binascii.Error, ValueError):
            causes.append(errors.invalid_value(f"{at}.secret", "REDACTED", "secrets must be base64 encoded"))
            continue
        if len(raw) not in sizes:
            causes.append(errors.invalid_value(
                f"{at}.secret", "REDACTED",
                f"secret is not of the expected length, got {len(raw)}, expected one of {_go_ints(sizes)}"))
    return causes


def validate(config: Any) -> list[errors.Cause]:
    """upstream's ValidateEncryptionConfiguration (without the KMS checks: KMS is refused)."""
    root = "resources"
    resources = config.get("resources") if isinstance(config, dict) else None
    if not resources:
        return [errors.required(root, f"at least one {root} is required")]
    if not isinstance(resources, list):
        return [errors.invalid_value(root, resources, "must be a list")]
    causes: list[errors.Cause] = []
    for i, conf in enumerate(resources):
        conf = conf if isinstance(conf, dict) else {}
        r, p = f"{root}[{i}].resources", f"{root}[{i}].providers"
        names = conf.get("resources") or []
        if not isinstance(names, list):
            names = [names]
        if not names:
            causes.append(errors.required(r, f"at least one {r} is required"))
        causes += _validate_resources(names, r)
        providers = conf.get("providers") or []
        if not isinstance(providers, list):
            providers = [providers]
        if not providers:
            causes.append(errors.required(p, f"at least one {p} is required"))
        for j, provider in enumerate(providers):
            at = f"{p}[{j}]"
            provider = provider if isinstance(provider, dict) else {}
            found = [k for k in PROVIDER_KINDS if provider.get(k) is not None]
            if not found:
                causes.append(errors.invalid_value(at, provider, _NO_PROVIDER))
                continue
            if len(found) > 1:
                causes.append(errors.invalid_value(at, provider, _MORE_THAN_ONE))
                continue
            kind = found[0]
            body = provider[kind] if isinstance(provider[kind], dict) else {}
            if kind == "kms":
                causes.append(errors.invalid_value(
                    f"{at}.kms", body.get("name", ""),
                    "KMS providers are not supported by this API server (no KMS plugin runs)"))
            elif kind in ("aesgcm", "aescbc"):
                causes += _validate_keys(body.get("keys"), f"{at}.{kind}.keys", AES_KEY_SIZES)
            elif kind == "secretbox":
                causes += _validate_keys(body.get("keys"), f"{at}.secretbox.keys", SECRETBOX_KEY_SIZES)
    return causes


def _provider(entry: dict) -> Provider:
    kind = next(k for k in PROVIDER_KINDS if entry.get(k) is not None)
    if kind == "identity":
        return identity_provider()
    keys = [(k["name"], base64.b64decode(k["secret"])) for k in entry[kind]["keys"]]
    if kind == "secretbox":
        return secretbox_provider(keys)
    return aes_provider(kind, keys)


class EncryptionConfig:
    """A validated EncryptionConfiguration: the transformer of each storage key."""

    def __init__(self, config: dict | None) -> None:
        """``None``: no file (every resource written as it is; encrypted values cannot be read)."""
        by_resource: dict[tuple[str, str], list[Provider]] = {}
        if config is not None:
            causes = validate(config)
            if causes:
                raise EncryptionConfigError(f"error while parsing file: {_aggregate(causes)}")
        for conf in config["resources"] if config is not None else ():
            providers = [_provider(p) for p in conf["providers"]]
            for name in conf["resources"]:
                by_resource.setdefault(parse_group_resource(name), []).extend(providers)
        self.transformers = {gr: ValueTransformer(ps) for gr, ps in by_resource.items()}
        self._by_head: dict[str, ValueTransformer] = {}

    def for_resource(self, group: str, resource: str) -> ValueTransformer:
        """Exact match, then ``*.<group>``, then ``*.*``; else the identity check."""
        t = self.transformers
        return t.get((group, resource)) or t.get((group, "*")) or t.get(("*", "*")) or IDENTITY

    def transformer_for(self, key: str) -> ValueTransformer:
        """The transformer of a storage key ``/registry/<group|core>/<resource>/...``."""
        if not self.transformers:
            return IDENTITY
        parts = key.split("/", 4)
        head = "/".join(parts[:4])
        found = self._by_head.get(head)
        if found is None:
            group = parts[2] if len(parts) > 2 else ""
            resource = parts[3] if len(parts) > 3 else ""
            found = self.for_resource("" if group == "core" else group, resource)
            if len(self._by_head) < 4096:
                self._by_head[head] = found
        return found


#: no file: every resource is written as it is, and an encrypted value cannot be read
NO_ENCRYPTION = EncryptionConfig(None)


def parse(text: str) -> EncryptionConfig:
    """An EncryptionConfiguration from YAML or JSON text."""
    import yaml

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise EncryptionConfigError(f"error while parsing file: {exc}") from None
    if not isinstance(config, dict):
        raise EncryptionConfigError("error while parsing file: Object 'Kind' is missing in the file")
    kind, version = config.get("kind"), config.get("apiVersion")
    if not kind:
        raise EncryptionConfigError("error while parsing file: Object 'Kind' is missing in the file")
    if version != API_VERSION or kind != KIND:
        raise EncryptionConfigError(
            f'error while parsing file: no kind "{kind}" is registered for version "{version}"')
    return EncryptionConfig(config)


def load(path: str) -> EncryptionConfig:
    """Read and validate the file ``path`` (errors as upstream words them)."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as exc:
        raise EncryptionConfigError(
            f'error while parsing file: error opening encryption provider configuration file "{path}": '
            f"{exc.strerror or exc}") from None
    if not data.strip():
        raise EncryptionConfigError(
            f'error while parsing file: encryption provider configuration file "{path}" is empty')
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise EncryptionConfigError("error while parsing file: the file is not UTF-8 text") from None
    return parse(text)


__all__ = ["API_VERSION", "EncryptionConfig", "EncryptionConfigError", "KIND", "NO_ENCRYPTION", "load", "parse",
           "parse_group_resource", "validate"]
