"""Writers racing on one object: every answer tells the truth about storage.

Two registries on one store stand for two API servers sharing storage: they
do not share the per-key turns, so their writes really race on the revision
check, and the loser has to retry against the state that won. On SQLite the
winner is still being committed when the loser retries, which is where a
retry that re-read committed state used to conflict again and again and then
answer Success without having stored anything.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.cluster import namespace_controller
from kubeplane.registry.registry import Registry
from kubeplane.storage import open_store
from kubeplane.storage.interface import KeyValue, RevisionConflictError, Store

PODS = resource("pods")
CMS = resource("configmaps")
NAMESPACES = resource("namespaces")
PAIRS = 200


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = await open_store(request.param, str(tmp_path))
    yield s
    await s.close()


@pytest.fixture
async def registries(store: Store) -> AsyncIterator[list[Registry]]:
    regs = [Registry(store, CATALOGUE) for _ in range(3)]
    await ensure_default_namespaces(regs[0])
    ns_controller = namespace_controller(regs[0])  # as the first API server's process runs it
    await ns_controller.start()
    yield regs
    await ns_controller.stop()
    for r in regs:
        await r.close()


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}


async def _bind(reg: Registry, name: str, node: str) -> str | StatusError:
    try:
        status = await reg.bind(name, "default", {"target": {"kind": "Node", "name": node}})
    except StatusError as err:
        return err
    assert status["status"] == "Success" and status["code"] == 201
    return node


async def test_a_conflicts_current_is_what_a_retry_succeeds_against(store: Store) -> None:
    # The contract the registry's retries rely on: the state a write lost to
    # is the one the next write is checked against, committed or not.
    key = "/registry/core/configmaps/default/c"
    first = await store.create(key, {"metadata": {"name": "c"}, "data": {"v": "0"}})
    racing = asyncio.ensure_future(store.update(key, {"metadata": {"name": "c"}, "data": {"v": "1"}},
                                                expected_revision=first.mod_revision))
    await asyncio.sleep(0)  # the racing write is accepted (on SQLite: not yet committed)
    with pytest.raises(RevisionConflictError) as info:
        await store.update(key, {"metadata": {"name": "c"}, "data": {"v": "x"}},
                           expected_revision=first.mod_revision)
    current = info.value.current
    assert current.value["data"] == {"v": "1"}
    kv = await store.update(key, {"metadata": {"name": "c"}, "data": {"v": "2"}},
                            expected_revision=current.mod_revision)
    await racing
    assert (await store.get(key)).value["data"] == {"v": "2"} and kv.mod_revision > current.mod_revision


@pytest.mark.parametrize("shared", [True, False], ids=["one-registry", "two-registries"])
async def test_of_two_concurrent_binds_exactly_one_wins_and_is_stored(
    registries: list[Registry], shared: bool
) -> None:
    a = registries[0]
    b = a if shared else registries[1]
    false_successes = doubles = 0
    for i in range(PAIRS):
        await a.create(PODS, _pod(f"p{i}"), "default")
        r1, r2 = await asyncio.gather(_bind(a, f"p{i}", "n1"), _bind(b, f"p{i}", "n2"))
        stored = (await a.get(PODS, f"p{i}", "default"))["spec"].get("nodeName")
        wins = [r for r in (r1, r2) if isinstance(r, str)]
        doubles += len(wins) != 1
        false_successes += sum(w != stored for w in wins)
        for lost in (r for r in (r1, r2) if not isinstance(r, str)):
            assert lost.code == 409 and lost.reason == "Conflict", lost
            assert lost.message == (f'Operation cannot be fulfilled on pods/binding "p{i}": '
                                    f'pod p{i} is already assigned to node "{stored}"')
            assert lost.kind == "pods/binding" and lost.name == f"p{i}"
    assert (false_successes, doubles) == (0, 0)


@pytest.mark.parametrize("shared", [True, False], ids=["one-registry", "two-registries"])
async def test_a_bind_racing_a_label_patch_both_stored(registries: list[Registry], shared: bool) -> None:
    a = registries[0]
    b = a if shared else registries[1]
    false_successes = 0
    for i in range(PAIRS):
        await a.create(PODS, _pod(f"q{i}"), "default")
        bound, patched = await asyncio.gather(
            _bind(a, f"q{i}", "n1"),
            b.patch(PODS, f"q{i}", {"metadata": {"labels": {"x": str(i)}}}, "default"),
        )
        pod = await a.get(PODS, f"q{i}", "default")
        assert bound == "n1"  # nothing else bound it: the bind must have been stored
        false_successes += pod["spec"].get("nodeName") != "n1"
        assert pod["metadata"]["labels"] == {"x": str(i)}
        assert [c["status"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"] == ["True"]
    assert false_successes == 0


async def test_a_second_bind_of_a_bound_pod_is_a_conflict(registries: list[Registry]) -> None:
    reg = registries[0]
    await reg.create(PODS, _pod("p"), "default")
    assert await _bind(reg, "p", "n") == "n"
    err = await _bind(reg, "p", "m")
    assert isinstance(err, StatusError) and err.code == 409
    assert err.to_status()["message"] == 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n"'
    assert err.to_status()["details"] == {"name": "p", "kind": "pods/binding"}
    gated = _pod("g")
    gated["spec"]["schedulingGates"] = [{"name": "wait"}]
    await reg.create(PODS, gated, "default")
    err = await _bind(reg, "g", "n")
    assert isinstance(err, StatusError) and err.code == 409
    assert err.message == 'Operation cannot be fulfilled on pods/binding "g": pod g has non-empty .spec.schedulingGates'
    assert "nodeName" not in (await reg.get(PODS, "g", "default"))["spec"]


async def test_unpinned_patches_from_three_writers_all_succeed(registries: list[Registry]) -> None:
    await registries[0].create(CMS, {"metadata": {"name": "hot"}, "data": {}}, "default")

    async def writer(reg: Registry, w: int) -> None:
        for n in range(40):
            await reg.patch(CMS, "hot", {"data": {f"w{w}-{n}": "v"}}, "default")

    # three registries (no shared turns) and three writers on one registry
    await asyncio.gather(*(writer(reg, w) for w, reg in enumerate(registries)),
                         *(writer(registries[0], w) for w in range(3, 6)))
    data = (await registries[0].get(CMS, "hot", "default"))["data"]
    assert len(data) == 6 * 40


async def test_deletes_racing_updates_and_finalizer_removal_never_conflict(registries: list[Registry]) -> None:
    a, b = registries[0], registries[1]
    for i in range(60):
        name = f"f{i}"
        await a.create(CMS, {"metadata": {"name": name, "finalizers": ["example.com/x"]}, "data": {}}, "default")
        # an orphaning delete racing another writer, then the finalizer's removal racing a patch
        deleted, patched = await asyncio.gather(
            a.delete(CMS, name, "default", propagation_policy="Orphan"),
            b.patch(CMS, name, {"metadata": {"labels": {"l": "1"}}}, "default"),
        )
        assert deleted[1] is False and patched[0]["metadata"]["labels"] == {"l": "1"}
        await asyncio.gather(
            b.patch(CMS, name, {"metadata": {"finalizers": None}}, "default"),
            a.patch(CMS, name, {"metadata": {"annotations": {"a": "1"}}}, "default"),
            return_exceptions=True,  # the annotation patch may find the object gone: 404
        )
        with pytest.raises(StatusError) as info:
            await a.get(CMS, name, "default")
        assert info.value.code == 404


async def test_concurrent_namespace_deletions_answer_without_errors(registries: list[Registry]) -> None:
    a, b = registries[0], registries[1]
    for i in range(20):
        ns = f"ns{i}"
        await a.create(NAMESPACES, {"metadata": {"name": ns}})
        await a.create(CMS, {"metadata": {"name": "c"}, "data": {}}, ns)
        results = await asyncio.gather(
            *(reg.delete(NAMESPACES, ns) for reg in (a, b, a, b)), return_exceptions=True)
        for r in results:
            # terminating (202-like) or, once finalization won, NotFound; never anything else
            assert (isinstance(r, tuple) and r[0]["status"]["phase"] == "Terminating") or (
                isinstance(r, StatusError) and r.code == 404), r
    for _ in range(200):
        left = [n["metadata"]["name"] for n in (await a.list(NAMESPACES))["items"]
                if n["metadata"]["name"].startswith("ns")]
        if not left:
            break
        await asyncio.sleep(0.05)
    assert left == []


class _AlwaysLosing:
    """A store on which every update loses to another writer that just wrote."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.attempts = 0

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def update(self, key: str, value: dict, expected_revision: int | None = None) -> KeyValue:
        self.attempts += 1
        kv = await self._inner.get(key)
        raise RevisionConflictError(key, expected_revision or 0,
                                    KeyValue(key, kv.value, kv.create_revision, kv.mod_revision + self.attempts))


async def test_retries_are_bounded_in_time_and_never_answer_success(store: Store) -> None:
    setup = Registry(store, CATALOGUE)
    await ensure_default_namespaces(setup)
    await setup.create(PODS, _pod("p"), "default")
    losing = _AlwaysLosing(store)
    reg = Registry(losing, CATALOGUE, retry_seconds=0.3)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    for attempt in (lambda: reg.bind("p", "default", {"target": {"name": "n"}}),
                    lambda: reg.patch(PODS, "p", {"metadata": {"labels": {"a": "b"}}}, "default")):
        t0 = loop.time()
        with pytest.raises(StatusError) as info:
            await attempt()
        assert info.value.code == 504 and info.value.reason == "Timeout"
        assert 0.3 <= loop.time() - t0 < 3
    assert losing.attempts > 100  # it kept retrying, not giving up after a count
    pod = await setup.get(PODS, "p", "default")
    assert "nodeName" not in pod["spec"] and "labels" not in pod["metadata"]
    await setup.close()
    await reg.close()


async def test_server_side_applies_racing_to_create_one_object_all_succeed(registries: list[Registry]) -> None:
    for i in range(30):
        name = f"applied{i}"

        def config(manager: int) -> dict:
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                    "data": {f"k{manager}": "v"}}

        results = await asyncio.gather(*(
            reg.patch(CMS, name, config(m), "default", patch_type="apply", field_manager=f"m{m}")
            for m, reg in enumerate(registries)))
        assert sorted(created for _, created in results) == [False, False, True]
        cm = await registries[0].get(CMS, name, "default")
        assert cm["data"] == {"k0": "v", "k1": "v", "k2": "v"}
        assert {m["manager"] for m in cm["metadata"]["managedFields"]} == {"m0", "m1", "m2"}


async def test_writes_racing_a_removal_still_being_committed_are_404s(store: Store, registries: list[Registry]) -> None:
    # The removal is accepted but (on SQLite) not yet committed: reads still
    # show the object, writes are checked against its absence.
    reg = registries[0]
    for attempt in ("delete-namespace", "bind", "patch", "delete-pod"):
        await reg.create(NAMESPACES, {"metadata": {"name": "racing"}})
        await reg.create(PODS, _pod("p"), "racing")
        ns_key, pod_key = NAMESPACES.storage_key("racing"), PODS.storage_key("p", "racing")
        removal = asyncio.ensure_future(store.delete(ns_key if attempt == "delete-namespace" else pod_key))
        await asyncio.sleep(0)
        with pytest.raises(StatusError) as info:
            if attempt == "delete-namespace":
                await reg.delete(NAMESPACES, "racing")
            elif attempt == "bind":
                await reg.bind("p", "racing", {"target": {"name": "n"}})
            elif attempt == "patch":
                await reg.patch(PODS, "p", {"metadata": {"labels": {"a": "b"}}}, "racing")
            else:
                await reg.delete(PODS, "p", "racing")
        assert info.value.code == 404, (attempt, info.value)
        await removal
        for key in (pod_key, ns_key):
            if await store.get(key) is not None:
                await store.delete(key)
