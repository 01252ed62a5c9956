"""--encryption-provider-config: upstream's EncryptionConfiguration file read and
validated with upstream's messages, resources matched as upstream matches them,
and the API server encrypting at rest (rotation by rewrite, 500 on an unreadable value)."""

from __future__ import annotations

import base64
import copy
import textwrap
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import APIServer, APIServerConfig, ensure_default_namespaces
from kubeplane.apiserver.encryptionconfig import NO_ENCRYPTION, EncryptionConfigError, load, parse
from kubeplane.apiserver.server import build_app
from kubeplane.registry.registry import Registry
from kubeplane.startup import StartupError
from kubeplane.storage import MemoryStore
from kubeplane.storage.transformer import ENVELOPE_FIELD, IDENTITY, TransformingStore, is_envelope

SECRETS = resource("secrets")
CONFIGMAPS = resource("configmaps")
K16 = base64.b64encode(bytes(range(16))).decode()
K24 = base64.b64encode(bytes(range(24))).decode()
K32 = base64.b64encode(bytes(range(32))).decode()
K32B = base64.b64encode(bytes(range(50, 82))).decode()
HEAD = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n"


def config(body: str):
    return parse(HEAD + textwrap.dedent(body))


def error_of(body: str) -> str:
    with pytest.raises(EncryptionConfigError) as exc:
        config(body)
    return str(exc.value)


def test_valid_config_with_every_provider() -> None:
    cfg = config(f"""
    resources:
      - resources: [secrets, configmaps]
        providers:
          - aesgcm: {{keys: [{{name: k2, secret: {K32}}}, {{name: k1, secret: {K16}}}]}}
          - aescbc: {{keys: [{{name: c, secret: {K24}}}]}}
          - secretbox: {{keys: [{{name: s, secret: {K32}}}]}}
          - identity: {{}}
    """)
    t = cfg.for_resource("", "secrets")
    assert [p.kind for p in t.providers] == ["aesgcm", "aescbc", "secretbox", "identity"]
    assert [n for n, _ in t.providers[0].keys] == ["k2", "k1"]
    assert cfg.transformer_for("/registry/core/configmaps/default/x") is cfg.for_resource("", "configmaps")
    assert cfg.transformer_for("/registry/core/pods/default/x") is IDENTITY


def test_resources_are_matched_exactly_then_by_group_then_everything() -> None:
    cfg = config(f"""
    resources:
      - resources: [secrets]
        providers: [{{secretbox: {{keys: [{{name: s, secret: {K32}}}]}}}}]
      - resources: ["*.apps"]
        providers: [{{aescbc: {{keys: [{{name: a, secret: {K32}}}]}}}}]
      - resources: ["*."]
        providers: [{{aesgcm: {{keys: [{{name: core, secret: {K32}}}]}}}}]
      - resources: ["*.*"]
        providers: [{{aesgcm: {{keys: [{{name: all, secret: {K32B}}}]}}}}]
      - resources: [secrets]
        providers: [{{identity: {{}}}}]
    """)
    kinds = lambda key: [(p.kind, p.keys[0][0] if p.keys else "") for p in cfg.transformer_for(key).providers]  # noqa: E731
    # A resource named in two entries gets both entries' providers, in file order.
    assert kinds("/registry/core/secrets/ns/a") == [("secretbox", "s"), ("identity", "")]
    assert kinds("/registry/apps/deployments/ns/d") == [("aescbc", "a")]
    assert kinds("/registry/core/configmaps/ns/c") == [("aesgcm", "core")]
    assert kinds("/registry/batch/jobs/ns/j") == [("aesgcm", "all")]


def test_config_errors_are_upstreams() -> None:
    assert error_of("""
    resources:
      - resources: [secrets]
        providers: [{aesgcm: {keys: [{name: k, secret: cGFzc3dvcmQK}]}}]
    """) == ('error while parsing file: resources[0].providers[0].aesgcm.keys[0].secret: Invalid value: '
             '"REDACTED": secret is not of the expected length, got 9, expected one of [16 24 32]')
    assert error_of(f"""
    resources:
      - resources: [secrets]
        providers: [{{secretbox: {{keys: [{{name: k, secret: {K16}}}]}}}}]
    """).endswith('resources[0].providers[0].secretbox.keys[0].secret: Invalid value: "REDACTED": '
                  'secret is not of the expected length, got 16, expected one of [32]')
    assert error_of("""
    resources:
      - resources: [secrets]
        providers: [{aescbc: {keys: [{secret: "not base64!"}]}}]
    """) == ('error while parsing file: [resources[0].providers[0].aescbc.keys[0].name: Required value: '
             'name is a mandatory field for a key, resources[0].providers[0].aescbc.keys[0].secret: '
             'Invalid value: "REDACTED": secrets must be base64 encoded]')
    assert error_of("""
    resources:
      - resources: [secrets]
        providers: [{aesgcm: {keys: []}}]
    """).endswith("resources[0].providers[0].aesgcm.keys: Required value: at least one keys is required")
    assert error_of("resources: []\n") == "error while parsing file: resources: Required value: at least one resources is required"
    assert error_of("""
    resources:
      - resources: []
        providers: []
    """) == ("error while parsing file: [resources[0].resources: Required value: at least one resources[0].resources "
             "is required, resources[0].providers: Required value: at least one resources[0].providers is required]")
    assert "more than one provider specified in a single element, should split into different list elements" in error_of(f"""
    resources:
      - resources: [secrets]
        providers: [{{identity: {{}}, aesgcm: {{keys: [{{name: k, secret: {K32}}}]}}}}]
    """)
    assert ("provider does not contain any of the expected providers: KMS, AESGCM, AESCBC, Secretbox, Identity"
            in error_of("""
    resources:
      - resources: [secrets]
        providers: [{rot13: {}}]
    """))


@pytest.mark.parametrize("names,index,message", [
    (["*"], "[0]", "use '*.' to encrypt all the resources from core API group or *.* to encrypt all resources"),
    (["Secrets"], "[0]", "resource name should not contain capital letters"),
    (["serviceipallocations"], "[0]", "resources which do not have REST API/s cannot be encrypted"),
    (["events.events.k8s.io"], "[0]", "'*.events.k8s.io' objects are stored using the 'events' API group in etcd. "
                                      "Use 'events' instead in the config file"),
    (["*.extensions"], "[0]", "'extensions' group has been removed and cannot be used for encryption"),
    (["secrets", "foos.*"], "[1]", "encrypting the same resource across groups is not supported"),
    (["secrets", "secrets"], "", "the same resource cannot be specified multiple times"),
    (["secrets", "*."], "", "using overlapping resources such as 'secrets' and '*.' in the same resource list is "
                            "not allowed as they will be masked"),
    (["*.*", "configmaps"], "", "using overlapping resources such as 'secrets' and '*.' in the same resource list "
                                "is not allowed as they will be masked"),
])
def test_resource_names_are_checked_as_upstream(names: list[str], index: str, message: str) -> None:
    listed = ", ".join(f'"{n}"' for n in names)
    err = error_of(f"""
    resources:
      - resources: [{listed}]
        providers: [{{identity: {{}}}}]
    """)
    assert f"resources[0].resources{index}: Invalid value: " in err and message in err


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(EncryptionConfigError, match='error opening encryption provider configuration file ".*nope"'):
        load(str(tmp_path / "nope"))
    (tmp_path / "empty").write_text("")
    with pytest.raises(EncryptionConfigError, match="is empty"):
        load(str(tmp_path / "empty"))
    (tmp_path / "kind").write_text("apiVersion: apiserver.config.k8s.io/v1\nkind: Foo\nresources: []\n")
    with pytest.raises(EncryptionConfigError, match='no kind "Foo" is registered for version "apiserver.config.k8s.io/v1"'):
        load(str(tmp_path / "kind"))
    (tmp_path / "kms").write_text(HEAD + "resources:\n- resources: [secrets]\n  providers:\n"
                                  "  - kms: {name: p, endpoint: unix:///tmp/kms.sock}\n")
    with pytest.raises(EncryptionConfigError, match=r"resources\[0\].providers\[0\].kms: .*KMS providers are not supported"):
        load(str(tmp_path / "kms"))


# --------------------------------------------------------------------------- in the API server


ROTATE_FROM = f"""
resources:
  - resources: [secrets]
    providers:
      - aesgcm: {{keys: [{{name: key1, secret: {K32}}}]}}
      - identity: {{}}
"""
ROTATE_TO = f"""
resources:
  - resources: [secrets]
    providers:
      - aesgcm: {{keys: [{{name: key2, secret: {K32B}}}, {{name: key1, secret: {K32}}}]}}
      - identity: {{}}
"""


def secret(name: str, value: str = "c2VjcmV0") -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"k": value}}


async def _registry(backend: MemoryStore, body: str | None) -> Registry:
    cfg = config(body) if body is not None else NO_ENCRYPTION
    registry = Registry(TransformingStore(backend, cfg.transformer_for), CATALOGUE)
    await ensure_default_namespaces(registry)
    return registry


async def test_rewriting_an_unchanged_secret_reencrypts_with_the_new_first_key() -> None:
    """``kubectl get secrets -o json | kubectl replace -f -``: a stale value is
    written again (new revision, key 2); a second replace is a no-op."""
    backend = MemoryStore()
    old = await _registry(backend, ROTATE_FROM)
    await old.create(SECRETS, secret("s"), namespace="default")
    key = SECRETS.storage_key("s", "default")
    assert (await backend.get(key)).value[ENVELOPE_FIELD].startswith("k8s:enc:aesgcm:v1:key1:")
    new = await _registry(backend, ROTATE_TO)
    current = await new.get(SECRETS, "s", namespace="default")
    replaced = await new.update(SECRETS, copy.deepcopy(current), namespace="default")
    assert replaced["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]
    assert replaced["data"] == {"k": "c2VjcmV0"}
    assert (await backend.get(key)).value[ENVELOPE_FIELD].startswith("k8s:enc:aesgcm:v1:key2:")
    again = await new.update(SECRETS, copy.deepcopy(replaced), namespace="default")
    assert again["metadata"]["resourceVersion"] == replaced["metadata"]["resourceVersion"]  # no-op now
    # Removing encryption: identity first decrypts at the next rewrite.
    plain = await _registry(backend, f"""
    resources:
      - resources: [secrets]
        providers: [{{identity: {{}}}}, {{aesgcm: {{keys: [{{name: key2, secret: {K32B}}}]}}}}]
    """)
    cur = await plain.get(SECRETS, "s", namespace="default")
    await plain.update(SECRETS, copy.deepcopy(cur), namespace="default")
    assert not is_envelope((await backend.get(key)).value)


@pytest.fixture
async def http() -> AsyncIterator[tuple[aiohttp.ClientSession, str, MemoryStore]]:
    backend = MemoryStore()
    writer = await _registry(backend, ROTATE_FROM)
    await writer.create(SECRETS, secret("locked"), namespace="default")
    await writer.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
                        namespace="default")
    # Served by a server that no longer has key1 (only key2).
    registry = await _registry(backend, f"""
    resources:
      - resources: [secrets]
        providers: [{{aesgcm: {{keys: [{{name: key2, secret: {K32B}}}]}}}}, {{identity: {{}}}}]
    """)
    server = TestServer(build_app(registry, CATALOGUE), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield session, str(server.make_url("")).rstrip("/"), backend
    await server.close()
    await registry.close()


async def test_unreadable_secret_answers_500_and_the_rest_keeps_working(http) -> None:
    session, base, _ = http
    ns = base + "/api/v1/namespaces/default"
    async with session.get(ns + "/secrets/locked") as r:
        body = await r.json()
        assert r.status == 500 and body["reason"] == "InternalError"
        # upstream's aggregate: the AES provider has no key1, identity cannot read encrypted data
        assert body["message"] == ("Internal error occurred: [no matching key was found for the provided AES "
                                   "transformer, identity transformer tried to read encrypted data]")
    async with session.get(ns + "/secrets") as r:
        body = await r.json()
        assert r.status == 500
        assert body["message"] == ('Internal error occurred: unable to transform key '
                                   '"/registry/core/secrets/default/locked": [no matching key was found for the '
                                   'provided AES transformer, identity transformer tried to read encrypted data]')
    async with session.get(ns + "/configmaps/c") as r:
        assert r.status == 200
    async with session.post(ns + "/secrets", json=secret("fresh")) as r:
        assert r.status == 201
    async with session.get(ns + "/secrets/fresh") as r:
        assert r.status == 200 and (await r.json())["data"] == {"k": "c2VjcmV0"}
    # Deleting the unreadable secret is refused as upstream (its read fails), nothing is lost.
    async with session.delete(ns + "/secrets/locked") as r:
        assert r.status == 500


async def test_watch_ends_with_an_internal_error_on_an_unreadable_event(http) -> None:
    session, base, backend = http
    rv = str(backend.revision - 2)  # before the secret was created
    async with session.get(base + f"/api/v1/namespaces/default/secrets?watch=1&resourceVersion={rv}") as r:
        lines = [line async for line in r.content]
    import orjson

    events = [orjson.loads(line) for line in lines if line.strip()]
    assert events[-1]["type"] == "ERROR"
    assert events[-1]["object"]["code"] == 500
    assert "no matching key was found for the provided AES transformer" in events[-1]["object"]["message"]


async def test_api_server_reads_the_file_and_encrypts(tmp_path: Path) -> None:
    path = tmp_path / "enc.yaml"
    path.write_text(HEAD + ROTATE_FROM)
    server = APIServer(APIServerConfig(data_dir=str(tmp_path / "d"), listen="127.0.0.1:0", storage="memory",
                                       encryption_provider_config=str(path), event_ttl=0))
    await server.start()
    try:
        await server.registry.create(SECRETS, secret("s"), namespace="default")
        inner = server.store.inner
        assert (await inner.get(SECRETS.storage_key("s", "default"))).value[ENVELOPE_FIELD].startswith(
            "k8s:enc:aesgcm:v1:key1:")
        got = await server.registry.get(SECRETS, "s", namespace="default")
        assert got["data"] == {"k": "c2VjcmV0"}
    finally:
        await server.stop()
    path.write_text(HEAD + "resources: []\n")
    bad = APIServer(APIServerConfig(data_dir=str(tmp_path / "d"), listen="127.0.0.1:0", storage="memory",
                                    encryption_provider_config=str(path)))
    with pytest.raises(StartupError, match="at least one resources is required"):
        await bad.start()
