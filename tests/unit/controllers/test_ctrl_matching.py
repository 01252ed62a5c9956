"""PV <-> PVC matching helpers."""

from __future__ import annotations

from kubeplane.volume.matching import (
    check_node_affinity,
    check_volume_satisfies_claim,
    find_best_match_for_claim,
    find_matching_volume,
    pinned_hostnames,
    topology_matches,
)


def pv(name: str, size: str, *, cls: str = "std", modes=("ReadWriteOnce",), phase: str = "Available",
       labels=None, mode: str | None = None, claim_ref=None, hosts=None) -> dict:
    spec: dict = {"capacity": {"storage": size}, "accessModes": list(modes), "storageClassName": cls}
    if mode:
        spec["volumeMode"] = mode
    if claim_ref:
        spec["claimRef"] = claim_ref
    if hosts:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": list(hosts)}]}]}}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec, "status": {"phase": phase}}


def pvc(name: str = "c", size: str = "1Gi", *, cls: str = "std", modes=("ReadWriteOnce",), selector=None,
        mode: str | None = None, uid: str = "uid-c") -> dict:
    spec: dict = {"resources": {"requests": {"storage": size}}, "accessModes": list(modes), "storageClassName": cls}
    if selector is not None:
        spec["selector"] = selector
    if mode:
        spec["volumeMode"] = mode
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": spec}


def node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


def names(x):
    return None if x is None else x["metadata"]["name"]


def test_smallest_fitting_wins_first_on_ties() -> None:
    vols = [pv("big", "10Gi"), pv("small", "500Mi"), pv("fit-a", "2Gi"), pv("fit-b", "2Gi"), pv("exact", "1Gi")]
    assert names(find_matching_volume(pvc(), vols)) == "exact"
    assert names(find_matching_volume(pvc(size="1500Mi"), vols)) == "fit-a"
    assert find_matching_volume(pvc(size="20Gi"), vols) is None


def test_class_phase_claimref_and_volume_mode_filters() -> None:
    vols = [pv("other-class", "1Gi", cls="fast"), pv("bound", "1Gi", phase="Bound"),
            pv("claimed", "1Gi", claim_ref={"namespace": "ns", "name": "x"}),
            pv("block", "1Gi", mode="Block"), pv("ok", "5Gi")]
    assert names(find_matching_volume(pvc(), vols)) == "ok"
    assert names(find_matching_volume(pvc(mode="Block"), vols)) == "block"
    assert names(find_matching_volume(pvc(cls="fast"), vols)) == "other-class"


def test_selector() -> None:
    vols = [pv("a", "1Gi", labels={"tier": "gold"}), pv("b", "1Gi", labels={"tier": "silver"})]
    assert names(find_matching_volume(pvc(selector={"matchLabels": {"tier": "silver"}}), vols)) == "b"
    sel = {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold", "silver"]}]}
    assert find_matching_volume(pvc(selector=sel), vols) is None


def test_prebound_wins_and_respects_size_and_node() -> None:
    ref = {"namespace": "ns", "name": "c", "uid": "uid-c"}
    vols = [pv("small", "1Gi"), pv("pre", "10Gi", phase="Bound", claim_ref=ref, hosts=["n1"])]
    assert names(find_matching_volume(pvc(), vols)) == "pre"
    # Pre-bound PVs are found even in delay-binding mode without a node.
    assert names(find_matching_volume(pvc(), vols, delay_binding=True)) == "pre"
    # Unbound PVs are not picked by the controller for delayed claims.
    assert find_matching_volume(pvc(), [pv("small", "1Gi")], delay_binding=True) is None
    # Node affinity mismatch of the pre-bound PV fails the whole match.
    assert find_matching_volume(pvc(), vols, node=node("n2")) is None
    # A claimRef with another uid is not a pre-binding.
    other = [pv("pre", "1Gi", claim_ref={"namespace": "ns", "name": "c", "uid": "zzz"})]
    assert find_matching_volume(pvc(), other) is None
    # Too small pre-bound PV is skipped.
    assert names(find_matching_volume(pvc(size="20Gi"), vols)) is None


def test_node_affinity_and_access_modes_with_node() -> None:
    vols = [pv("n1-vol", "1Gi", hosts=["n1"]), pv("n2-vol", "2Gi", hosts=["n2"]),
            pv("rox", "1Gi", modes=("ReadOnlyMany",))]
    assert names(find_matching_volume(pvc(), vols, node=node("n2"))) == "n2-vol"
    assert names(find_matching_volume(pvc(), vols, node=node("n1"), excluded={"n1-vol"})) is None
    assert names(find_matching_volume(pvc(modes=("ReadOnlyMany",)), vols, node=node("n3"))) == "rox"


def test_controller_search_groups_by_access_modes() -> None:
    vols = [pv("rwo-rox", "1Gi", modes=("ReadWriteOnce", "ReadOnlyMany")), pv("rwo", "5Gi"),
            pv("rwx", "1Gi", modes=("ReadWriteMany",))]
    # Fewest-modes group first: the plain RWO volume wins although larger.
    assert names(find_best_match_for_claim(pvc(), vols)) == "rwo"
    assert names(find_best_match_for_claim(pvc(modes=("ReadWriteMany",)), vols)) == "rwx"
    assert find_best_match_for_claim(pvc(modes=("ReadWriteOncePod",)), vols) is None


def test_check_node_affinity_operators() -> None:
    n = node("n1", zone="a", gen="5")
    assert check_node_affinity(pv("free", "1Gi"), n)
    assert check_node_affinity(pv("x", "1Gi", hosts=["n1", "n2"]), n)
    assert not check_node_affinity(pv("x", "1Gi", hosts=["n2"]), n)

    def with_terms(terms):
        v = pv("t", "1Gi")
        v["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
        return v

    assert check_node_affinity(with_terms([
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]},
                              {"key": "gpu", "operator": "DoesNotExist"}]}]), n)
    assert not check_node_affinity(with_terms([
        {"matchExpressions": [{"key": "zone", "operator": "Exists"}, {"key": "gen", "operator": "Lt", "values": ["5"]}]}]), n)
    assert check_node_affinity(with_terms([{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]), n)
    assert not check_node_affinity(with_terms([]), n)
    assert not check_node_affinity(with_terms([{}]), n)


def test_topology_and_pinned_hosts_and_validation() -> None:
    allowed = [{"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}]}]
    assert topology_matches(allowed, {"zone": "a"}) and not topology_matches(allowed, {"zone": "c"})
    assert topology_matches(None, {})
    assert pinned_hostnames(pv("x", "1Gi", hosts=["n1"])) == {"n1"}
    assert pinned_hostnames(pv("x", "1Gi")) is None
    assert check_volume_satisfies_claim(pv("x", "1Gi"), pvc(size="2Gi")) == "requested PV is too small"
    assert check_volume_satisfies_claim(pv("x", "1Gi", cls="other"), pvc()) == "storageClassName does not match"
    assert check_volume_satisfies_claim(pv("x", "1Gi", mode="Block"), pvc()) == "incompatible volumeMode"
    assert check_volume_satisfies_claim(pv("x", "1Gi"), pvc(modes=("ReadWriteMany",))) == "incompatible accessMode"
    assert check_volume_satisfies_claim(pv("x", "1Gi"), pvc()) is None
