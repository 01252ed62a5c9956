"""ControllerRevision helpers (kubeplane.controllers.history) against a real
registry (MemoryStore + InProcessClient + a ControllerRevision informer)."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.history import (
    CONTROLLER_REVISION_CONTROLLER_INDEX,
    CONTROLLER_REVISION_HASH_LABEL,
    History,
    controller_revision_controller_index_key,
    controller_revision_name,
    equal_revision,
    find_equal_revisions,
    fnv32,
    hash_controller_revision,
    new_controller_revision,
    raw_data,
    sort_controller_revisions,
    template_patch,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

CR = resource("controllerrevisions")
STS = resource("statefulsets") if CATALOGUE.by_gvr("apps", "v1", "statefulsets") else None
NS = "default"


def parent(name: str = "web", uid: str = "uid-web") -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS, "uid": uid}}


def data(image: str) -> dict:
    return {"spec": {"template": {"$patch": "replace", "spec": {"containers": [{"name": "c", "image": image}]}}}}


# ------------------------------------------------------------------ pure helpers


def test_fnv32_is_fnv1_not_fnv1a() -> None:
    # Reference values of FNV-1 (32 bit); FNV-1a of "a" would be 0xe40c292c.
    assert fnv32(b"") == 0x811C9DC5
    assert fnv32(b"a") == 0x050C5D7E
    assert fnv32(b"foobar") == 0x31F0B262


def test_raw_data_is_go_json() -> None:
    assert raw_data({"b": 1, "a": {"d": [1, 2], "c": "x"}}) == b'{"a":{"c":"x","d":[1,2]},"b":1}'
    assert raw_data({"k": "<a&b>\u2028"}) == b'{"k":"\\u003ca\\u0026b\\u003e\\u2028"}'
    assert raw_data({"k": "caf\u00e9"}) == '{"k":"caf\u00e9"}'.encode()


def test_hash_depends_on_data_and_probe() -> None:
    a = {"data": data("nginx:1")}
    b = {"data": data("nginx:2")}
    h = hash_controller_revision(a)
    assert h == hash_controller_revision({"data": data("nginx:1")})
    assert h != hash_controller_revision(b)
    assert h != hash_controller_revision(a, 0)
    assert hash_controller_revision(a, 0) != hash_controller_revision(a, 1)
    assert set(h) <= set("bcdfghjklmnpqrstvwxz2456789")
    # The probe is hashed as its decimal digits after the data (upstream's strconv.FormatInt).
    from kubeplane.controllers.history import safe_encode_string
    expected = safe_encode_string(str(fnv32(b"12", fnv32(raw_data(a["data"])))))
    assert hash_controller_revision(a, 12) == expected


def test_name_truncates_long_prefixes() -> None:
    assert controller_revision_name("web", "abc") == "web-abc"
    long = "x" * 300
    assert controller_revision_name(long, "h") == "x" * 223 + "-h"


def test_new_controller_revision() -> None:
    p = parent()
    cr = new_controller_revision(p, "apps/v1", "StatefulSet", {"app": "web"}, data("nginx:1"), 3, None)
    h = hash_controller_revision(cr)
    assert cr["metadata"]["name"] == f"web-{h}"
    assert cr["metadata"]["namespace"] == NS
    assert cr["metadata"]["labels"] == {"app": "web", CONTROLLER_REVISION_HASH_LABEL: h}
    assert cr["metadata"]["ownerReferences"] == [{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "uid-web",
        "controller": True, "blockOwnerDeletion": True}]
    assert cr["revision"] == 3 and cr["data"] == data("nginx:1")
    with_count = new_controller_revision(p, "apps/v1", "StatefulSet", {}, data("nginx:1"), 3, 2)
    assert with_count["metadata"]["name"] == f"web-{hash_controller_revision(cr, 2)}"


def test_sort_and_equality() -> None:
    def rev(name: str, n: int, created: str, image: str = "i") -> dict:
        return {"metadata": {"name": name, "creationTimestamp": created}, "revision": n, "data": data(image)}

    revs = [rev("c", 2, "2026-01-01T00:00:00Z"), rev("b", 1, "2026-01-02T00:00:00Z"),
            rev("a", 1, "2026-01-02T00:00:00Z"), rev("z", 1, "2026-01-01T00:00:00Z")]
    assert [r["metadata"]["name"] for r in sort_controller_revisions(revs)] == ["z", "a", "b", "c"]
    x, y, other = rev("x", 1, "", "one"), rev("y", 5, "", "one"), rev("o", 1, "", "two")
    assert equal_revision(x, y) and not equal_revision(x, other)
    assert equal_revision(None, None) and not equal_revision(x, None)
    assert find_equal_revisions([x, other, y], x) == [x, y]


def test_template_patch_is_go_typed_and_sorted() -> None:
    template = {"metadata": {"labels": {"b": "1", "a": "2"}, "annotations": {}},
                "spec": {"containers": [{"name": "c", "image": "i:1", "env": []}]}}
    patch = template_patch(template)
    tmpl = patch["spec"]["template"]
    assert list(tmpl) == ["$patch", "metadata", "spec"] and tmpl["$patch"] == "replace"
    assert tmpl["metadata"] == {"creationTimestamp": None, "labels": {"a": "2", "b": "1"}}
    assert list(tmpl["metadata"]["labels"]) == ["a", "b"]
    c = tmpl["spec"]["containers"][0]
    # the API server's defaults, no empty env, resources {} as Go writes the struct
    assert c["resources"] == {} and "env" not in c and c["imagePullPolicy"] == "IfNotPresent"
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert tmpl["spec"]["restartPolicy"] == "Always" and tmpl["spec"]["dnsPolicy"] == "ClusterFirst"
    assert raw_data(patch).startswith(b'{"spec":{"template":{"$patch":"replace","metadata":{"creationTimestamp":null')
    # writing the stored (defaulted) template back gives the same bytes
    assert raw_data(template_patch({k: v for k, v in tmpl.items() if k != "$patch"})) == raw_data(patch)


def test_index_key() -> None:
    ref = {"kind": "StatefulSet", "name": "web", "uid": "u1"}
    assert controller_revision_controller_index_key("ns", ref) == "ns/StatefulSet/web/u1"
    assert controller_revision_controller_index_key("ns", None) == "ns"


# ------------------------------------------------------------ against the registry


class Env:
    def __init__(self, client: InProcessClient, factory: SharedInformerFactory, history: History) -> None:
        self.client = client
        self.factory = factory
        self.history = history

    async def seen(self, name: str, rv: str | None = None) -> dict:
        def check() -> dict | None:
            got = self.history.informer.indexer.get_by_key(f"{NS}/{name}")
            if got is None or (rv is not None and got["metadata"]["resourceVersion"] != rv):
                return None
            return got
        return await eventually(check)


@pytest.fixture
async def env():
    store = MemoryStore(history=500)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    history = History(client, factory.informer_for(CR))
    factory.start()
    assert all((await factory.wait_for_cache_sync(2)).values())
    yield Env(client, factory, history)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


async def test_create_and_collisions(env: Env) -> None:
    p = parent()
    cr = new_controller_revision(p, "apps/v1", "StatefulSet", {"app": "web"}, data("nginx:1"), 1, None)
    created, count = await env.history.create_controller_revision(p, cr, 0)
    assert count == 0
    assert created["metadata"]["name"] == f"web-{hash_controller_revision(cr, 0)}"
    assert created["data"] == data("nginx:1") and created["revision"] == 1
    # The same data again: the existing revision, no new object, no collision.
    again, count = await env.history.create_controller_revision(p, cr, 0)
    assert count == 0 and again["metadata"]["uid"] == created["metadata"]["uid"]
    # Different data under the name collision count 0 would give: the count moves on.
    other = new_controller_revision(p, "apps/v1", "StatefulSet", {"app": "web"}, data("nginx:2"), 2, None)
    squatter = {"apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": f"web-{hash_controller_revision(other, 0)}"}, "data": {"x": 1}, "revision": 9}
    await env.client.create(CR, squatter, NS)
    made, count = await env.history.create_controller_revision(p, other, 0)
    assert count == 1
    assert made["metadata"]["name"] == f"web-{hash_controller_revision(other, 1)}"
    assert made["data"] == data("nginx:2")
    with pytest.raises(ValueError):
        await env.history.create_controller_revision(p, other, None)  # type: ignore[arg-type]


async def test_list_owned_and_orphans(env: Env) -> None:
    p = parent()
    mine = new_controller_revision(p, "apps/v1", "StatefulSet", {"app": "web"}, data("a"), 1, None)
    mine, _ = await env.history.create_controller_revision(p, mine, 0)
    stranger = parent("web", "uid-other")
    theirs = new_controller_revision(stranger, "apps/v1", "StatefulSet", {"app": "web"}, data("b"), 1, None)
    theirs["metadata"]["name"] = "theirs"
    await env.client.create(CR, theirs, NS)
    await env.client.create(CR, {"metadata": {"name": "orphan", "labels": {"app": "web"}},
                                 "data": data("c"), "revision": 1}, NS)
    await env.client.create(CR, {"metadata": {"name": "unrelated", "labels": {"app": "db"}},
                                 "data": data("d"), "revision": 1}, NS)
    for name in ("theirs", "orphan", "unrelated"):
        await env.seen(name)
    await env.seen(mine["metadata"]["name"])
    selector = label_selector_from_dict({"matchLabels": {"app": "web"}})
    got = env.history.list_controller_revisions(p, "apps/v1", "StatefulSet", selector)
    assert sorted(r["metadata"]["name"] for r in got) == sorted([mine["metadata"]["name"], "orphan"])
    assert env.history.informer.indexer.by_index(CONTROLLER_REVISION_CONTROLLER_INDEX, NS)


async def test_adopt_release_update_delete(env: Env) -> None:
    p = parent()
    orphan = await env.client.create(CR, {"metadata": {"name": "orphan", "labels": {"app": "web"}},
                                          "data": data("c"), "revision": 1}, NS)
    adopted = await env.history.adopt_controller_revision(p, "apps/v1", "StatefulSet", orphan)
    assert adopted["metadata"]["ownerReferences"] == [{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "uid-web",
        "controller": True, "blockOwnerDeletion": True}]
    with pytest.raises(ValueError, match="attempt to adopt revision owned by"):
        await env.history.adopt_controller_revision(p, "apps/v1", "StatefulSet", adopted)
    released = await env.history.release_controller_revision(p, adopted)
    assert released is not None and not released["metadata"].get("ownerReferences")
    await env.client.delete(CR, "orphan", NS)
    assert await env.history.release_controller_revision(p, adopted) is None

    cr, _ = await env.history.create_controller_revision(
        p, new_controller_revision(p, "apps/v1", "StatefulSet", {}, data("x"), 1, None), 0)
    # Renumbering works from a stale copy: the conflict is retried with a fresh one.
    await env.client.patch(CR, cr["metadata"]["name"], {"metadata": {"labels": {"touched": "yes"}}}, NS)
    renumbered = await env.history.update_controller_revision(cr, 7)
    assert renumbered["revision"] == 7 and renumbered["metadata"]["labels"]["touched"] == "yes"
    assert (await env.history.update_controller_revision(renumbered, 7)) == renumbered
    await env.history.delete_controller_revision(renumbered)
    with pytest.raises(StatusError) as err:
        await env.client.get(CR, cr["metadata"]["name"], NS)
    assert err.value.code == 404


async def test_controller_revision_validation(env: Env) -> None:
    async def invalid(obj: dict) -> list[tuple[str, str, str]]:
        with pytest.raises(StatusError) as err:
            await env.client.create(CR, obj, NS)
        assert err.value.code == 422
        return [(c["reason"], c["field"], c["message"]) for c in err.value.to_status()["details"]["causes"]]

    assert await invalid({"metadata": {"name": "a"}, "revision": 1}) == [
        ("FieldValueRequired", "data", "Required value: data is mandatory")]
    assert await invalid({"metadata": {"name": "a"}, "data": [1], "revision": 1}) == [
        ("FieldValueRequired", "data", "Required value: data must be a valid JSON object")]
    assert await invalid({"metadata": {"name": "a"}, "data": {}, "revision": -1}) == [
        ("FieldValueInvalid", "revision", "Invalid value: -1: must be greater than or equal to 0")]
    assert await invalid({"metadata": {"name": "A_b"}, "data": {}, "revision": 1}) == [
        ("FieldValueInvalid", "metadata.name", "Invalid value: \"A_b\": a lowercase RFC 1123 subdomain must "
         "consist of lower case alphanumeric characters, '-' or '.', and must start and end with an "
         "alphanumeric character (e.g. 'example.com', regex used for validation is "
         "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")]
    made = await env.client.create(CR, {"metadata": {"name": "ok"}, "data": {"a": 1}, "revision": 1}, NS)
    assert "generation" not in made["metadata"]
    made["revision"] = 2
    made = await env.client.update(CR, made)
    assert made["revision"] == 2
    made["data"] = {"a": 2}
    with pytest.raises(StatusError) as err:
        await env.client.update(CR, made)
    assert err.value.code == 422
    assert [(c["field"], c["message"]) for c in err.value.to_status()["details"]["causes"]] == [
        ("data", "Invalid value: {\"a\":2}: field is immutable")] or "field is immutable" in err.value.message
