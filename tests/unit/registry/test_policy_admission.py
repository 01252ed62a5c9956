"""LimitRanger, Priority and ResourceQuota admission, and the validation of
ResourceQuotas and LimitRanges, through a real registry's default chain."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.tables import printer_for
from kubeplane.registry.policyadmission import LIMIT_RANGER_ANNOTATION, ensure_system_priority_classes
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

PODS = resource("pods")
PVCS = resource("persistentvolumeclaims")
QUOTAS = resource("resourcequotas")
LIMITS = resource("limitranges")
PCS = resource("priorityclasses", "scheduling.k8s.io")
NS = "default"


@pytest.fixture
async def reg():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    await ensure_system_priority_classes(registry)
    yield registry
    await registry.close()
    await store.close()


def pod(name: str, *containers: dict, **spec) -> dict:
    return {"metadata": {"name": name},
            "spec": {"containers": list(containers) or [{"name": "c", "image": "nginx:1"}], **spec}}


def container(name: str = "c", requests: dict | None = None, limits: dict | None = None) -> dict:
    c: dict = {"name": name, "image": "nginx:1"}
    if requests or limits:
        c["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return c


def limit_range(name: str, *items: dict) -> dict:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name}, "spec": {"limits": list(items)}}


async def refused(coro) -> StatusError:
    with pytest.raises(StatusError) as err:
        await coro
    return err.value


# ------------------------------------------------------------------ LimitRanger


async def test_limit_range_defaults_are_filled_in_and_announced(reg: Registry) -> None:
    lr = await reg.create(LIMITS, limit_range("defaults", {
        "type": "Container", "default": {"cpu": "500m", "memory": "256Mi"}, "min": {"cpu": "50m"}}), NS)
    # upstream's defaulting: the default request is the default limit
    assert lr["spec"]["limits"][0]["defaultRequest"] == {"cpu": "500m", "memory": "256Mi"}
    p = await reg.create(PODS, pod("p", container("a"), container("b", requests={"cpu": "100m"})), NS)
    a, b = p["spec"]["containers"]
    assert a["resources"] == {"limits": {"cpu": "500m", "memory": "256Mi"},
                              "requests": {"cpu": "500m", "memory": "256Mi"}}
    assert b["resources"] == {"limits": {"cpu": "500m", "memory": "256Mi"},
                              "requests": {"cpu": "100m", "memory": "256Mi"}}
    assert p["metadata"]["annotations"][LIMIT_RANGER_ANNOTATION] == (
        "LimitRanger plugin set: cpu, memory request for container a; cpu, memory limit for container a; "
        "memory request for container b; cpu, memory limit for container b")
    assert p["status"]["qosClass"] == "Burstable"
    # classed with the defaults it got, not as the BestEffort pod it was sent as
    alone = await reg.create(PODS, pod("alone"), NS)
    assert alone["status"]["qosClass"] == "Guaranteed"


async def test_limit_range_bounds_refuse_with_upstreams_messages(reg: Registry) -> None:
    await reg.create(LIMITS, limit_range("bounds", {
        "type": "Container", "max": {"cpu": "1", "memory": "1Gi"}, "min": {"cpu": "100m"},
        "maxLimitRequestRatio": {"cpu": "2"}}), NS)
    err = await refused(reg.create(PODS, pod("big", container(
        requests={"cpu": "500m"}, limits={"cpu": "2", "memory": "512Mi"})), NS))
    assert err.code == 403
    assert err.message == ('pods "big" is forbidden: [maximum cpu usage per Container is 1, but limit is 2, '
                           "cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000]")
    err = await refused(reg.create(PODS, pod("small", container(
        requests={"cpu": "50m"}, limits={"cpu": "80m"})), NS))
    assert err.message == 'pods "small" is forbidden: minimum cpu usage per Container is 100m, but request is 50m'
    err = await refused(reg.create(PODS, pod("low", container(requests={"cpu": "100m"}, limits={"cpu": "80m"})), NS))
    assert err.code == 422  # a request above its limit is validation's to refuse, before admission
    err = await refused(reg.create(PODS, pod("none", container(limits={"cpu": "150m"}), container(
        "d", requests={"cpu": "150m"}, limits={"cpu": "150m", "memory": "2Gi"})), NS))
    assert err.message == ('pods "none" is forbidden: maximum memory usage per Container is 1Gi, but limit is 2Gi')
    ok = await reg.create(PODS, pod("ok", container(requests={"cpu": "600m"}, limits={"cpu": "1"})), NS)
    # the max became the default memory limit
    assert ok["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}


async def test_pod_and_claim_limits(reg: Registry) -> None:
    await reg.create(LIMITS, limit_range("pods", {"type": "Pod", "max": {"memory": "1Gi"}},
                                         {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"},
                                          "max": {"storage": "5Gi"}}), NS)
    two = pod("two", container("a", requests={"memory": "600Mi"}, limits={"memory": "600Mi"}),
              container("b", requests={"memory": "600Mi"}, limits={"memory": "600Mi"}))
    err = await refused(reg.create(PODS, two, NS))
    assert err.message == 'pods "two" is forbidden: maximum memory usage per Pod is 1Gi, but limit is 1200Mi'
    claim = {"metadata": {"name": "big"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                   "resources": {"requests": {"storage": "10Gi"}}}}
    err = await refused(reg.create(PVCS, claim, NS))
    assert err.message == ('persistentvolumeclaims "big" is forbidden: maximum storage usage per '
                           "PersistentVolumeClaim is 5Gi, but request is 10Gi")
    claim["spec"]["resources"]["requests"]["storage"] = "2Gi"
    await reg.create(PVCS, claim, NS)


async def test_limit_range_validation(reg: Registry) -> None:
    err = await refused(reg.create(LIMITS, limit_range("bad", {
        "type": "Container", "min": {"cpu": "2"}, "max": {"cpu": "1"}, "maxLimitRequestRatio": {"memory": "500m"}},
        {"type": "Container"}, {"type": "Pod", "default": {"cpu": "1"}}, {"type": "PersistentVolumeClaim"},
        {"type": "Node"}), NS))
    assert err.code == 422
    got = {(c.field, c.message) for c in err.causes}
    assert ("spec.limits[0].min[cpu]", "Invalid value: 2: min value 2 is greater than max value 1") in got
    assert ("spec.limits[0].maxLimitRequestRatio[memory]", "Invalid value: 500m: ratio 500m is less than 1") in got
    assert ("spec.limits[1].type", 'Duplicate value: "Container"') in got
    assert ("spec.limits[2].default", "Forbidden: may not be specified when `type` is 'Pod'") in got
    assert ("spec.limits[3].limits", "Required value: either minimum or maximum storage value is required, "
                                     "but neither was provided") in got
    assert ("spec.limits[4].type", 'Invalid value: "Node": must be a standard limit type or fully qualified') in got


# --------------------------------------------------------------------- Priority


async def test_priority_from_the_class_or_the_default(reg: Registry) -> None:
    plain = await reg.create(PODS, pod("plain"), NS)
    assert plain["spec"]["priority"] == 0
    assert plain["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    assert "priorityClassName" not in plain["spec"]
    crit = await reg.create(PODS, pod("crit", priorityClassName="system-node-critical"), "kube-system")
    assert crit["spec"]["priority"] == 2000001000
    await reg.create(PCS, {"metadata": {"name": "low"}, "value": 100, "globalDefault": True,
                           "preemptionPolicy": "Never"})
    dflt = await reg.create(PODS, pod("dflt"), NS)
    assert (dflt["spec"]["priorityClassName"], dflt["spec"]["priority"], dflt["spec"]["preemptionPolicy"]) == (
        "low", 100, "Never")
    err = await refused(reg.create(PODS, pod("nope", priorityClassName="missing"), NS))
    assert (err.code, err.message) == (403, 'pods "nope" is forbidden: no PriorityClass with name missing was found')
    # refused in the mutating phase, before upstream generates a name: the generateName is reported
    gen = pod("", priorityClassName="missing")
    gen["metadata"] = {"generateName": "gen-"}
    err = await refused(reg.create(PODS, gen, NS))
    assert err.message == 'pods "gen-" is forbidden: no PriorityClass with name missing was found'
    err = await refused(reg.create(PODS, pod("liar", priorityClassName="low", priority=5), NS))
    assert err.message == ('pods "liar" is forbidden: the integer value of priority (5) must not be provided in pod '
                           "spec; priority admission controller computed 100 from the given PriorityClass name")
    # the priority stays what it was on updates that leave it out
    upd = copy.deepcopy(await reg.get(PODS, "dflt", NS))
    del upd["spec"]["priority"]
    upd["metadata"]["labels"] = {"x": "y"}
    assert (await reg.update(PODS, upd))["spec"]["priority"] == 100


async def test_one_global_default_and_system_classes_stay(reg: Registry) -> None:
    names = {pc["metadata"]["name"]: pc["value"] for pc in (await reg.list(PCS))["items"]}
    assert names == {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}
    await reg.create(PCS, {"metadata": {"name": "a"}, "value": 1, "globalDefault": True})
    err = await refused(reg.create(PCS, {"metadata": {"name": "b"}, "value": 2, "globalDefault": True}))
    assert err.message == ('priorityclasses.scheduling.k8s.io "b" is forbidden: PriorityClass a is already marked '
                           "as default. Only one default can exist")
    # the default itself may be updated
    a = copy.deepcopy(await reg.get(PCS, "a"))
    a["description"] = "the default"
    await reg.update(PCS, a)
    err = await refused(reg.delete(PCS, "system-node-critical"))
    assert err.message == ('priorityclasses.scheduling.k8s.io "system-node-critical" is forbidden: this is a '
                           "system priority class and cannot be deleted")


# ------------------------------------------------------- ResourceQuota objects


def quota(name: str, hard: dict, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": hard, **spec}}


async def test_resource_quota_validation(reg: Registry) -> None:
    err = await refused(reg.create(QUOTAS, quota("bad", {
        "pods": "1.5", "cpu": "-1", "widgets": "1", "configmaps": "2"}, scopes=["BestEffort", "NotBestEffort"]), NS))
    got = {(c.field, c.message) for c in err.causes}
    assert ("spec.hard[pods]", "Invalid value: 1500m: must be an integer") in got
    assert ("spec.hard[cpu]", 'Invalid value: "-1": must be greater than or equal to 0') in got
    assert ("spec.hard[widgets]", 'Invalid value: "widgets": must be a standard resource type or fully qualified') \
        in got
    assert ("spec.hard[widgets]", 'Invalid value: "widgets": must be a standard resource for quota') in got
    assert ("spec.scopes", 'Invalid value: []string{"BestEffort", "NotBestEffort"}: conflicting scopes') in got
    assert ("spec.scopes", 'Invalid value: []string{"BestEffort", "NotBestEffort"}: unsupported scope applied to '
                           "resource") in got
    err = await refused(reg.create(QUOTAS, quota("sel", {"pods": "1"}, scopeSelector={"matchExpressions": [
        {"scopeName": "Terminating", "operator": "In", "values": ["x"]},
        {"scopeName": "PriorityClass", "operator": "In"}]}), NS))
    got = {(c.field, c.message) for c in err.causes}
    assert any(f == "spec.scopeSelector.matchExpressions.operator" and m.startswith('Invalid value: "In": must be '
                                                                                    "'Exists' when scope")
               for f, m in got)
    assert ("spec.scopeSelector.matchExpressions.values", "Required value: must be at least one value when "
            "`operator` is 'In' or 'NotIn' for scope selector") in got
    rq = await reg.create(QUOTAS, quota("ok", {"pods": "2"}, scopes=["NotTerminating"]), NS)
    assert "status" not in rq and "generation" not in rq["metadata"]
    rq = copy.deepcopy(rq)
    rq["spec"]["scopes"] = ["Terminating"]
    err = await refused(reg.update(QUOTAS, rq))
    assert [(c.field, c.message) for c in err.causes] == [
        ("spec.scopes", 'Invalid value: []string{"Terminating"}: field is immutable')]


async def test_quota_without_status_does_not_constrain_and_table_columns(reg: Registry) -> None:
    rq = await reg.create(QUOTAS, quota("q", {"pods": "0", "limits.cpu": "1", "requests.memory": "1Gi"}), NS)
    # no controller counted it yet: upstream's admission matches on status.hard only
    await reg.create(PODS, pod("p"), NS)
    rq = copy.deepcopy(rq)
    rq["status"] = {"hard": {"pods": "0", "limits.cpu": "1", "requests.memory": "1Gi"}}
    rq = await reg.update(QUOTAS, rq, subresource="status")
    err = await refused(reg.create(PODS, pod("p2", container(requests={"memory": "1Mi"},
                                                               limits={"cpu": "1"})), NS))
    assert err.message == ('pods "p2" is forbidden: status unknown for quota: q, resources: '
                           "limits.cpu,pods,requests.memory")
    rq = copy.deepcopy(rq)
    rq["status"]["used"] = {"pods": "0", "limits.cpu": "500m", "requests.memory": "0"}
    rq = await reg.update(QUOTAS, rq, subresource="status")
    now = dt.datetime.now(dt.timezone.utc)
    row = printer_for(QUOTAS).row(rq, now)
    assert row[:3] == ["q", "pods: 0/0, requests.memory: 0/1Gi", "limits.cpu: 500m/1"]
    assert [c.name for c in printer_for(QUOTAS).columns] == ["Name", "Request", "Limit", "Age"]
    assert [c.name for c in printer_for(LIMITS).columns] == ["Name", "Created At"]


async def test_a_pod_with_limits_only_is_classed_with_its_defaulted_requests(reg: Registry) -> None:
    p = await reg.create(PODS, pod("limits-only", container("a", limits={"cpu": "100m", "memory": "24Mi"})), NS)
    assert p["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "24Mi"}
    assert p["status"]["qosClass"] == "Guaranteed"
