"""pods/eviction against a real registry: budgets decide, upstream's statuses answer."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import now_text
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.eviction import _check_and_decrement
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

PODS = resource("pods")
PDBS = resource("poddisruptionbudgets")
NS = "default"


@pytest.fixture
async def client():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    yield c
    await c.close()
    await registry.close()
    await store.close()


async def pod(client, name, *, ready=True, phase="Running", labels=None, node="n1"):
    await client.create(PODS, {"metadata": {"name": name, "labels": labels or {"app": "web"}},
                               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx:1"}]}}, NS)
    await client.patch(PODS, name, {"status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_text()}]}},
        NS, subresource="status")


async def pdb(client, name, *, allowed, healthy=2, desired=2, expected=2, policy=None, selector=None,
              generation_behind=False):
    spec = {"selector": selector or {"matchLabels": {"app": "web"}}, "minAvailable": desired}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    created = await client.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                         "metadata": {"name": name}, "spec": spec}, NS)
    assert created["status"] == {"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0,
                                 "expectedPods": 0}
    created["status"] = {"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                         "disruptionsAllowed": allowed,
                         "observedGeneration": created["metadata"]["generation"] - (1 if generation_behind else 0)}
    return await client.update(PDBS, created, subresource="status")


def eviction(name, **delete_options):
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}}
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


async def evict(client, name, **opts):
    return await client.create(PODS, eviction(name, **opts), NS, subresource="eviction", name=name)


async def gone_or_terminating(client, name) -> bool:
    try:
        p = await client.get(PODS, name, NS)
    except StatusError as err:
        return err.code == 404
    return bool(p["metadata"].get("deletionTimestamp"))


async def test_no_budget_evicts_and_marks_the_disruption_target(client):
    await pod(client, "p")
    status = await evict(client, "p", gracePeriodSeconds=30)
    assert status == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    p = await client.get(PODS, "p", NS)
    assert p["metadata"]["deletionGracePeriodSeconds"] == 30
    cond = next(c for c in p["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "EvictionByEvictionAPI",
                                                                 "Eviction API: evicting")


async def test_budget_allowing_one_takes_it_then_answers_429(client):
    await pod(client, "a")
    await pod(client, "b")
    await pdb(client, "web", allowed=1, healthy=2, desired=1)
    await evict(client, "a")
    after = await client.get(PDBS, "web", NS)
    assert after["status"]["disruptionsAllowed"] == 0
    assert list(after["status"]["disruptedPods"]) == ["a"]
    cond = next(c for c in after["status"]["conditions"] if c["type"] == "DisruptionAllowed")
    assert (cond["status"], cond["reason"]) == ("False", "InsufficientPods")
    assert await gone_or_terminating(client, "a")
    with pytest.raises(StatusError) as err:
        await evict(client, "b")
    e = err.value
    assert (e.code, e.reason, e.message) == (429, "TooManyRequests",
                                             "Cannot evict pod as it would violate the pod's disruption budget.")
    # the status still counts the evicted pod healthy (no controller here)
    assert [(c.reason, c.message) for c in e.causes] == [
        ("DisruptionBudget", "The disruption budget web does not allow evicting pods currently")]
    assert e.retry_after is None
    assert not await gone_or_terminating(client, "b")
    # what the disruption controller then writes: the budget is just met
    after["status"].update(currentHealthy=1, disruptedPods=None)
    await client.update(PDBS, after, subresource="status")
    with pytest.raises(StatusError) as err:
        await evict(client, "b")
    assert [c.message for c in err.value.causes] == [
        "The disruption budget web needs 1 healthy pods and has 1 currently"]


async def test_budget_not_yet_observed_is_still_being_processed(client):
    await pod(client, "a")
    await pdb(client, "web", allowed=1, generation_behind=True)
    with pytest.raises(StatusError) as err:
        await evict(client, "a")
    assert err.value.code == 429 and err.value.retry_after == 10
    assert err.value.causes[0].message == "The disruption budget web is still being processed by the server."


async def test_unready_pods_under_a_met_budget_and_always_allow(client):
    await pod(client, "sick", ready=False)
    await pdb(client, "web", allowed=0, healthy=2, desired=2)
    await evict(client, "sick")  # the budget is met: the unready pod goes without a disruption
    assert (await client.get(PDBS, "web", NS))["status"]["disruptionsAllowed"] == 0
    await pod(client, "sick2", ready=False, labels={"app": "db"})
    await pdb(client, "db", allowed=0, healthy=0, desired=2, policy="AlwaysAllow",
              selector={"matchLabels": {"app": "db"}})
    await evict(client, "sick2")
    assert await gone_or_terminating(client, "sick2")


async def test_finished_and_pending_pods_ignore_budgets(client):
    await pod(client, "done", phase="Succeeded", ready=False)
    await pod(client, "waiting", phase="Pending", ready=False)
    await pdb(client, "web", allowed=0, healthy=0, desired=5)
    await evict(client, "done")
    await evict(client, "waiting")
    assert await gone_or_terminating(client, "done") and await gone_or_terminating(client, "waiting")


async def test_two_budgets_answer_500(client):
    await pod(client, "a")
    await pdb(client, "one", allowed=1)
    await pdb(client, "two", allowed=1)
    with pytest.raises(StatusError) as err:
        await evict(client, "a")
    assert err.value.code == 500
    assert err.value.message == ("This pod has more than one PodDisruptionBudget, which the eviction "
                                 "subresource does not support.")


async def test_negative_counts_are_invalid_and_a_negative_budget_forbids(client):
    await pod(client, "a")
    with pytest.raises(StatusError) as err:
        await pdb(client, "web", allowed=-1)
    assert (err.value.code, err.value.message) == (
        422, 'PodDisruptionBudget.policy "web" is invalid: status.disruptionsAllowed: Invalid value: -1: '
             "must be greater than or equal to 0")
    # a budget read as negative (written by an older server) is refused with upstream's 403
    registry = client.registry
    budget = await client.get(PDBS, "web", NS)
    budget["status"].update(disruptionsAllowed=-1, observedGeneration=budget["metadata"]["generation"])
    with pytest.raises(StatusError) as err:
        await _check_and_decrement(registry, NS, "a", budget, False)
    assert (err.value.code, err.value.message) == (
        403, 'poddisruptionbudget.policy "web" is forbidden: pdb disruptions allowed is negative')


async def test_dry_run_changes_nothing(client):
    await pod(client, "a")
    await pdb(client, "web", allowed=1, healthy=2, desired=1)
    await client.create(PODS, eviction("a"), NS, subresource="eviction", name="a", dry_run=True)
    assert (await client.get(PDBS, "web", NS))["status"]["disruptionsAllowed"] == 1
    assert not await gone_or_terminating(client, "a")


async def test_bad_evictions(client):
    await pod(client, "a")
    with pytest.raises(StatusError) as err:
        await client.create(PODS, eviction("other"), NS, subresource="eviction", name="a")
    assert (err.value.code, err.value.message) == (400, "name in URL does not match name in Eviction object")
    with pytest.raises(StatusError) as err:
        await evict(client, "a", ignoreStoreReadErrorWithClusterBreakingPotential=True)
    assert err.value.code == 422
    assert err.value.message == (
        'Eviction.policy "a" is invalid: deleteOptions.ignoreStoreReadErrorWithClusterBreakingPotential: '
        "Invalid value: true: can not be set for pod eviction, try after removing the option")
    with pytest.raises(StatusError) as err:
        await evict(client, "a", gracePeriodSeconds="soon")
    assert err.value.code == 400
    with pytest.raises(StatusError) as err:
        await client.create(PODS, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a"}}, NS,
                            subresource="eviction", name="a")
    assert err.value.code == 400
    with pytest.raises(StatusError) as err:
        await evict(client, "missing")
    assert (err.value.code, err.value.message) == (404, 'pods "missing" not found')
    with pytest.raises(StatusError) as err:
        await evict(client, "a", preconditions={"uid": "not-the-uid"})
    assert err.value.code == 409
    assert "the UID in the precondition (not-the-uid) does not match the UID in record" in err.value.message
