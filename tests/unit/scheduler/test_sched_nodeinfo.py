"""PodInfo request computation and NodeInfo bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest

from kubeplane.scheduler.framework.nodeinfo import (
    DEFAULT_MEMORY_REQUEST, HostPortInfo, NodeInfo, NodeSelector, PodInfo, pod_requests,
)

MI = 1024 * 1024


def container(name: str = "c", cpu: str | None = None, mem: str | None = None, **extra: Any) -> dict:
    req: dict[str, Any] = {}
    if cpu is not None:
        req["cpu"] = cpu
    if mem is not None:
        req["memory"] = mem
    c: dict[str, Any] = {"name": name, "image": "img", "resources": {"requests": req} if req else {}}
    c.update(extra)
    return c


def pod(name: str = "p", containers: list | None = None, init: list | None = None, **spec: Any) -> dict:
    s: dict[str, Any] = {"containers": containers if containers is not None else [container()]}
    if init:
        s["initContainers"] = init
    s.update(spec)
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}, "spec": s}


def node(name: str = "n1", cpu: str = "4", mem: str = "8Gi", pods: str = "110") -> dict:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": mem, "pods": pods}}}


def test_containers_are_summed() -> None:
    p = pod(containers=[container("a", "100m", "1Mi"), container("b", "250m", "2Mi")])
    assert pod_requests(p) == {"cpu": 350, "memory": 3 * MI}


def test_init_containers_take_the_max_not_the_sum() -> None:
    p = pod(containers=[container("a", "100m")], init=[container("i1", "500m"), container("i2", "300m")])
    assert pod_requests(p)["cpu"] == 500
    p2 = pod(containers=[container("a", "1")], init=[container("i1", "500m")])
    assert pod_requests(p2)["cpu"] == 1000


def test_sidecars_add_to_the_pod_and_to_later_init_containers() -> None:
    # sidecar 200m runs alongside both the later init container and the app containers
    p = pod(
        containers=[container("a", "100m")],
        init=[container("side", "200m", restartPolicy="Always"), container("i", "500m")],
    )
    # max(100 + 200, 500 + 200) = 700
    assert pod_requests(p)["cpu"] == 700
    # an init container *before* the sidecar does not include it
    p2 = pod(
        containers=[container("a", "100m")],
        init=[container("i", "500m"), container("side", "200m", restartPolicy="Always")],
    )
    assert pod_requests(p2)["cpu"] == 500


def test_overhead_is_added() -> None:
    p = pod(containers=[container("a", "100m", "10Mi")], overhead={"cpu": "250m", "memory": "1Mi"})
    assert pod_requests(p) == {"cpu": 350, "memory": 11 * MI}


def test_pod_level_requests_override_container_sum() -> None:
    p = pod(containers=[container("a", "100m", "10Mi")], resources={"requests": {"cpu": "2"}})
    assert pod_requests(p) == {"cpu": 2000, "memory": 10 * MI}


def test_non_zero_defaults_apply_to_missing_requests_only() -> None:
    pi = PodInfo(pod(containers=[container("a"), container("b", cpu="0", mem="1Mi")]))
    assert pi.requests == {"cpu": 0, "memory": MI}
    assert pi.non_zero_cpu == 100  # 100m default for a, explicit 0 for b
    assert pi.non_zero_memory == DEFAULT_MEMORY_REQUEST + MI


def test_extended_and_hugepages_resources() -> None:
    c = container("a", "1")
    c["resources"]["requests"].update({"example.com/gpu": "2", "hugepages-2Mi": "4Mi", "foo": "3"})
    assert pod_requests(pod(containers=[c])) == {"cpu": 1000, "example.com/gpu": 2, "hugepages-2Mi": 4 * MI}


def test_podinfo_fields() -> None:
    p = pod(
        containers=[container("a", ports=[{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}])],
        priority=7,
        tolerations=[{"key": "k", "operator": "Exists"}],
        volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}, {"name": "e", "ephemeral": {}}],
        affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "zone"}]}},
    )
    pi = PodInfo(p)
    assert pi.priority == 7
    assert pi.host_ports == [("0.0.0.0", "TCP", 8080)]
    assert pi.pvc_names == ["data", "p-e"]
    assert pi.has_affinity
    term = pi.required_anti_affinity_terms[0]
    assert term.namespaces == {"default"} and term.topology_key == "zone"
    assert term.matches({"metadata": {"namespace": "default", "labels": {"app": "x"}}})
    assert not term.matches({"metadata": {"namespace": "other", "labels": {"app": "x"}}})


def test_nodeinfo_add_remove_and_generation() -> None:
    ni = NodeInfo(node("n1"))
    g0 = ni.generation
    assert ni.allocatable == {"cpu": 4000, "memory": 8 * 1024 * MI, "pods": 110}
    p = pod("a", containers=[container("c", "500m", "1Gi", ports=[{"containerPort": 1, "hostPort": 99}])])
    p["spec"]["nodeName"] = "n1"
    ni.add_pod(p)
    assert ni.generation > g0
    assert ni.requested == {"cpu": 500, "memory": 1024 * MI}
    assert ni.non_zero_requested == {"cpu": 500, "memory": 1024 * MI}
    assert ni.used_ports.check_conflict("0.0.0.0", "TCP", 99)
    c = ni.clone()
    g1 = ni.generation
    ni.remove_pod(p)
    assert ni.generation > g1
    assert ni.requested == {"cpu": 0, "memory": 0} and not ni.pods and len(ni.used_ports) == 0
    # the clone is independent
    assert len(c.pods) == 1 and c.requested["cpu"] == 500 and c.generation == g1
    with pytest.raises(KeyError):
        ni.remove_pod(p)


def test_host_port_conflicts_with_wildcard_ip() -> None:
    h = HostPortInfo()
    h.add("127.0.0.1", "TCP", 80)
    assert h.check_conflict("0.0.0.0", "TCP", 80)
    assert h.check_conflict("127.0.0.1", "TCP", 80)
    assert not h.check_conflict("127.0.0.2", "TCP", 80)
    assert not h.check_conflict("127.0.0.1", "UDP", 80)
    h.add("", "", 53)
    assert h.check_conflict("10.0.0.1", "TCP", 53)


@pytest.mark.parametrize(
    "terms,labels,name,expected",
    [
        ([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}], {"zone": "b"}, "n", True),
        ([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}], {}, "n", True),
        ([{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}], {}, "n", False),
        ([{"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}], {}, "n", True),
        ([{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["2"]}]}], {"gpus": "3"}, "n", True),
        ([{"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["2"]}]}], {"gpus": "3"}, "n", False),
        ([{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["x"]}]}], {"gpus": "3"}, "n", False),
        ([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}], {}, "n", True),
        ([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n"]}]}], {}, "n", False),
        ([{}], {}, "n", False),  # empty term matches nothing
        ([], {}, "n", False),  # no terms match nothing
        ([{}, {"matchExpressions": [{"key": "a", "operator": "Exists"}]}], {"a": ""}, "n", True),  # ORed
    ],
)
def test_node_selector_terms(terms: list, labels: dict, name: str, expected: bool) -> None:
    sel = NodeSelector({"nodeSelectorTerms": terms})
    assert sel.matches({"metadata": {"name": name, "labels": labels}}) is expected


def test_pod_info_for_the_assumed_copy_shares_what_it_derived() -> None:
    pod = {"metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}},
                                    "ports": [{"containerPort": 80, "hostPort": 8080}]}],
                    "tolerations": [{"key": "k", "operator": "Exists"}], "priority": 7}}
    info = PodInfo(pod)
    assert info.tolerations  # a lazily derived field, computed before the copy
    assumed = {**pod, "spec": {**pod["spec"], "nodeName": "n1"}}
    copy_info = info.for_copy(assumed)
    fresh = PodInfo(assumed)
    assert copy_info.pod is assumed and copy_info.node_name == "n1" and info.node_name == ""
    for attr in ("uid", "name", "namespace", "priority", "requests", "non_zero_cpu", "non_zero_memory",
                 "host_ports", "pvc_names", "tolerations", "start_time"):
        assert getattr(copy_info, attr) == getattr(fresh, attr), attr
    ni = NodeInfo({"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4", "pods": "10"}}})
    ni.add_pod(copy_info)
    assert ni.requested["cpu"] == 500 and ni.remove_pod(fresh) is copy_info
