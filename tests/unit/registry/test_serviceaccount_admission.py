"""The ServiceAccount admission plugin, case by case against upstream's
plugin/pkg/admission/serviceaccount: the default account, refusal of a
missing account (with the retries for ``default``), the projected token
volume and its mounts, the automount opt-outs, mirror pods, mountable-secret
enforcement and the pull secrets taken from the account."""

from __future__ import annotations

import random

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.registry.admission import (
    CREATE,
    MIRROR_POD_ANNOTATION,
    SERVICE_ACCOUNT_MOUNT_PATH,
    AdmissionChain,
    Attributes,
    NamespaceLifecycle,
    ServiceAccount,
    default_chain,
    service_account_token_volume,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

PODS = resource("pods")
SAS = resource("serviceaccounts")

MOUNT = {"name": "VOL", "readOnly": True, "mountPath": SERVICE_ACCOUNT_MOUNT_PATH}


class Sleeps:
    """The plugin's sleep, recorded instead of waited."""

    def __init__(self):
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
async def env():
    store = MemoryStore()
    sleeps = Sleeps()
    plugin = ServiceAccount(store, sleep=sleeps, rng=random.Random(7))
    registry = Registry(store, CATALOGUE, admission=AdmissionChain([NamespaceLifecycle(store), plugin]))
    await ensure_default_namespaces(registry)
    yield registry, plugin, sleeps
    await registry.close()
    await store.close()


async def _sa(registry, name="default", ns="default", **fields):
    return await registry.create(SAS, {"metadata": {"name": name, **fields.pop("metadata", {})}, **fields}, ns)


def _pod(name="p", **spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "nginx"}], **spec}}


def _mounts(spec, field="containers"):
    return [c.get("volumeMounts") for c in spec.get(field) or []]


def _token_volumes(spec):
    return [v for v in spec.get("volumes") or [] if v["name"].startswith("kube-api-access-")]


# (case, account fields, pod spec fields, expected: "mounted" | "not mounted")
AUTOMOUNT_CASES = [
    ("default: mounted", {}, {}, "mounted"),
    ("account opts out", {"automountServiceAccountToken": False}, {}, "not mounted"),
    ("pod opts out", {}, {"automountServiceAccountToken": False}, "not mounted"),
    ("pod opts in over the account", {"automountServiceAccountToken": False},
     {"automountServiceAccountToken": True}, "mounted"),
    ("pod opts out over the account", {"automountServiceAccountToken": True},
     {"automountServiceAccountToken": False}, "not mounted"),
]


@pytest.mark.parametrize("case, account, spec, want", AUTOMOUNT_CASES, ids=[c[0] for c in AUTOMOUNT_CASES])
async def test_automount_rules(env, case, account, spec, want):
    registry, _, _ = env
    await _sa(registry, **account)
    pod = await registry.create(PODS, _pod(**spec), "default")
    s = pod["spec"]
    assert s["serviceAccountName"] == "default" and s["serviceAccount"] == "default"
    vols = _token_volumes(s)
    if want == "mounted":
        assert len(vols) == 1
        name = vols[0]["name"]
        assert len(name) == len("kube-api-access-") + 5
        assert vols[0] == service_account_token_volume(name)
        assert _mounts(s) == [[{**MOUNT, "name": name}]]
    else:
        assert vols == [] and _mounts(s) == [None]


async def test_projected_volume_is_upstreams(env):
    registry, _, _ = env
    await _sa(registry)
    pod = await registry.create(PODS, _pod(), "default")
    vol = _token_volumes(pod["spec"])[0]
    assert vol["projected"] == {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}


async def test_every_container_and_init_container_mounts_it_but_existing_mounts_win(env):
    registry, _, _ = env
    await _sa(registry, "builder")
    own = {"name": "mine", "mountPath": SERVICE_ACCOUNT_MOUNT_PATH}
    pod = await registry.create(PODS, _pod(
        serviceAccountName="builder",
        initContainers=[{"name": "i", "image": "busybox"}],
        containers=[{"name": "a", "image": "nginx"},
                    {"name": "b", "image": "nginx", "volumeMounts": [own]}],
        volumes=[{"name": "mine", "emptyDir": {}}]), "default")
    s = pod["spec"]
    name = _token_volumes(s)[0]["name"]
    assert _mounts(s, "initContainers") == [[{**MOUNT, "name": name}]]
    assert _mounts(s) == [[{**MOUNT, "name": name}], [own]]
    assert [v["name"] for v in s["volumes"]] == ["mine", name]


async def test_an_existing_token_volume_is_reused(env):
    registry, _, _ = env
    await _sa(registry)
    pod = await registry.create(PODS, _pod(volumes=[service_account_token_volume("kube-api-access-abcde")]),
                                "default")
    s = pod["spec"]
    assert [v["name"] for v in s["volumes"]] == ["kube-api-access-abcde"]
    assert _mounts(s) == [[{**MOUNT, "name": "kube-api-access-abcde"}]]


async def test_no_volume_when_every_container_has_a_mount_there(env):
    registry, _, _ = env
    await _sa(registry)
    own = {"name": "v", "mountPath": SERVICE_ACCOUNT_MOUNT_PATH}
    pod = await registry.create(PODS, _pod(containers=[{"name": "c", "image": "x", "volumeMounts": [own]}],
                                           volumes=[{"name": "v", "emptyDir": {}}]), "default")
    assert _token_volumes(pod["spec"]) == []


async def test_a_missing_account_is_refused_with_upstreams_message(env):
    registry, _, sleeps = env
    await _sa(registry)
    with pytest.raises(StatusError) as err:
        await registry.create(PODS, _pod(serviceAccountName="nope"), "default")
    assert err.value.code == 403 and err.value.reason == "Forbidden"
    assert err.value.message == ('pods "p" is forbidden: error looking up service account default/nope: '
                                 'serviceaccount "nope" not found')
    assert sleeps.calls == []  # other names are looked up once
    with pytest.raises(StatusError):
        await registry.get(PODS, "p", "default")


async def test_the_default_account_is_waited_for(env):
    registry, plugin, sleeps = env
    with pytest.raises(StatusError) as err:
        await registry.create(PODS, _pod(), "default")
    assert err.value.message == ('pods "p" is forbidden: error looking up service account default/default: '
                                 'serviceaccount "default" not found')
    # ten lookups, nine waits of one interval between 100 and 200 ms
    assert len(sleeps.calls) == 9 and len(set(sleeps.calls)) == 1 and 0.1 <= sleeps.calls[0] < 0.2

    # the account appears while the plugin waits (the controller creating it)
    sleeps.calls.clear()

    async def create_on_third_wait(seconds):
        sleeps.calls.append(seconds)
        if len(sleeps.calls) == 3:
            await _sa(registry)

    plugin._sleep = create_on_third_wait
    pod = await registry.create(PODS, _pod(), "default")
    assert pod["spec"]["serviceAccountName"] == "default" and len(sleeps.calls) == 3


async def test_the_deprecated_field_names_the_account(env):
    registry, _, _ = env
    await _sa(registry, "old")
    pod = await registry.create(PODS, _pod(serviceAccount="old"), "default")
    assert pod["spec"]["serviceAccountName"] == "old" and pod["spec"]["serviceAccount"] == "old"


async def test_a_generated_name_is_reported_as_its_prefix(env):
    registry, _, _ = env
    pod = _pod()
    pod["metadata"] = {"generateName": "web-"}
    pod["spec"]["serviceAccountName"] = "nope"
    with pytest.raises(StatusError) as err:
        await registry.create(PODS, pod, "default")
    assert err.value.message.startswith('pods "web-" is forbidden: ')


async def test_pull_secrets_come_from_the_account_unless_the_pod_has_some(env):
    registry, _, _ = env
    await _sa(registry, imagePullSecrets=[{"name": "reg"}])
    pod = await registry.create(PODS, _pod(), "default")
    assert pod["spec"]["imagePullSecrets"] == [{"name": "reg"}]
    pod = await registry.create(PODS, _pod("q", imagePullSecrets=[{"name": "own"}]), "default")
    assert pod["spec"]["imagePullSecrets"] == [{"name": "own"}]


MIRROR_CASES = [
    ("plain mirror pod", {}, None),
    ("names an account", {"serviceAccountName": "default"}, "a mirror pod may not reference service accounts"),
    ("secret volume", {"volumes": [{"name": "s", "secret": {"secretName": "x"}}]},
     "a mirror pod may not reference secrets"),
    ("env from a secret", {"containers": [{"name": "c", "image": "x", "envFrom": [{"secretRef": {"name": "x"}}]}]},
     "a mirror pod may not reference secrets"),
    ("pull secret", {"imagePullSecrets": [{"name": "x"}]}, "a mirror pod may not reference secrets"),
    ("token projection", {"volumes": [{"name": "t", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]},
     "a mirror pod may not use ServiceAccountToken volume projections"),
]


@pytest.mark.parametrize("case, spec, refused", MIRROR_CASES, ids=[c[0] for c in MIRROR_CASES])
async def test_mirror_pods_are_not_changed_and_may_not_use_accounts_or_secrets(env, case, spec, refused):
    registry, _, sleeps = env
    pod = _pod(**spec)
    pod["metadata"]["annotations"] = {MIRROR_POD_ANNOTATION: "x"}
    if refused is None:
        stored = await registry.create(PODS, pod, "default")  # no ServiceAccount exists: none is needed
        assert "serviceAccountName" not in stored["spec"] and "volumes" not in stored["spec"]
        assert sleeps.calls == []
    else:
        with pytest.raises(StatusError) as err:
            await registry.create(PODS, pod, "default")
        assert err.value.code == 403 and err.value.message == f'pods "p" is forbidden: {refused}'


ENFORCED = {"kubernetes.io/enforce-mountable-secrets": "true"}
SECRET_CASES = [
    ("listed secret volume", {"volumes": [{"name": "v", "secret": {"secretName": "ok"}}]}, None),
    ("unlisted secret volume", {"volumes": [{"name": "v", "secret": {"secretName": "bad"}}]},
     'volume with secret.secretName="bad" is not allowed because service account sa does not reference '
     "that secret"),
    ("unlisted env secret", {"containers": [{"name": "c", "image": "x", "env": [
        {"name": "E", "valueFrom": {"secretKeyRef": {"name": "bad", "key": "k"}}}]}]},
     'container c with envVar E referencing secret.secretName="bad" is not allowed because service account '
     "sa does not reference that secret"),
    ("unlisted envFrom in an init container", {"initContainers": [{"name": "i", "image": "x", "envFrom": [
        {"secretRef": {"name": "bad"}}]}]},
     'init container i with envFrom referencing secret.secretName="bad" is not allowed because service account '
     "sa does not reference that secret"),
    ("unlisted pull secret", {"imagePullSecrets": [{"name": "bad"}]},
     'imagePullSecrets[0].name="bad" is not allowed because service account sa does not reference that '
     "imagePullSecret"),
]


@pytest.mark.parametrize("case, spec, refused", SECRET_CASES, ids=[c[0] for c in SECRET_CASES])
async def test_enforce_mountable_secrets(env, case, spec, refused):
    registry, _, _ = env
    await _sa(registry, "sa", metadata={"annotations": ENFORCED}, secrets=[{"name": "ok"}],
              imagePullSecrets=[{"name": "pull"}])
    pod = _pod(serviceAccountName="sa", **spec)
    if refused is None:
        await registry.create(PODS, pod, "default")
    else:
        with pytest.raises(StatusError) as err:
            await registry.create(PODS, pod, "default")
        assert err.value.message == f'pods "p" is forbidden: {refused}'
    # without the annotation the same pod is admitted
    await _sa(registry, "sa", ns="kube-public", secrets=[{"name": "ok"}])
    await registry.create(PODS, pod, "kube-public")


async def test_updates_are_neither_changed_nor_checked(env):
    registry, _, _ = env
    await _sa(registry)
    pod = await registry.create(PODS, _pod(), "default")
    await registry.delete(SAS, "default", "default")
    labelled = {**pod, "metadata": {**pod["metadata"], "labels": {"a": "b"}}}
    out = await registry.update(PODS, labelled)
    assert out["metadata"]["labels"] == {"a": "b"} and out["spec"] == pod["spec"]
    # the pod's ServiceAccount may not change (the pod spec is immutable)
    other = {**out, "spec": {**out["spec"], "serviceAccountName": "other"}}
    with pytest.raises(StatusError) as err:
        await registry.update(PODS, other)
    assert err.value.code == 422


def test_it_handles_pod_creates_only():
    plugin = ServiceAccount(MemoryStore())
    assert plugin.handles(CREATE, PODS)
    assert not plugin.handles("UPDATE", PODS) and not plugin.handles("DELETE", PODS)
    assert not plugin.handles(CREATE, resource("configmaps"))


async def test_validating_phase_refuses_a_pod_whose_account_went_missing():
    """After the mutating phase (webhooks may change the pod), the account named must still exist."""
    store = MemoryStore()
    plugin = ServiceAccount(store, sleep=Sleeps())
    attrs = Attributes(CREATE, PODS, "p", "default", _pod(serviceAccountName="gone"))
    with pytest.raises(StatusError) as err:
        await plugin.validate(attrs)
    assert "serviceaccount \"gone\" not found" in err.value.message
    attrs = Attributes(CREATE, PODS, "p", "default", _pod())
    with pytest.raises(StatusError) as err:
        await plugin.validate(attrs)
    assert err.value.message == 'pods "p" is forbidden: no service account specified for pod default/p'


def test_a_bare_registry_leaves_it_off():
    assert "ServiceAccount" not in [p.name for p in default_chain(MemoryStore()).plugins]


async def test_a_missing_or_terminating_namespace_is_namespace_lifecycles_refusal(env):
    """Upstream's NamespaceLifecycle answers before this plugin: 404 for a
    missing namespace, 403 for a terminating one, without waiting for an account."""
    registry, _, sleeps = env
    with pytest.raises(StatusError) as err:
        await registry.create(PODS, _pod(), "nowhere")
    assert err.value.code == 404 and err.value.message == 'namespaces "nowhere" not found'
    await registry.create(resource("namespaces"), {"metadata": {"name": "going", "finalizers": ["x.io/hold"]}})
    await registry.delete(resource("namespaces"), "going")
    with pytest.raises(StatusError) as err:
        await registry.create(PODS, _pod(), "going")
    assert err.value.code == 403 and "because it is being terminated" in err.value.message
    assert sleeps.calls == []
