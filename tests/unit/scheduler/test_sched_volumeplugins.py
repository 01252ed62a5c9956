"""VolumeRestrictions, VolumeZone and NodeVolumeLimits."""

from __future__ import annotations

from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.types import Code, CycleState, QueueingHint
from kubeplane.scheduler.plugins.node_volume_limits import REASON_MAX_VOLUME_COUNT, NodeVolumeLimits
from kubeplane.scheduler.plugins.volume_restrictions import (
    REASON_DISK_CONFLICT,
    REASON_RWOP_CONFLICT,
    VolumeRestrictions,
    is_volume_conflict,
)
from kubeplane.scheduler.plugins.volume_zone import REASON_CONFLICT, VolumeZone
from volume_plugins_env import Factory, Snapshot, claim_vol, node, pod, pvc


def run(plugin, p: dict, ni: NodeInfo):
    state = CycleState()
    pi = PodInfo(p)
    _, st = plugin.pre_filter(state, pi, [ni])
    if st is not None:
        return st
    return plugin.filter(state, pi, ni)


# --------------------------------------------------------------------------- VolumeRestrictions


def test_is_volume_conflict_rules() -> None:
    gce = lambda ro=False: {"name": "g", "gcePersistentDisk": {"pdName": "disk", "readOnly": ro}}  # noqa: E731
    assert is_volume_conflict(gce(), pod("x", gce()))
    assert is_volume_conflict(gce(True), pod("x", gce()))
    assert not is_volume_conflict(gce(True), pod("x", gce(True)))
    ebs = {"name": "e", "awsElasticBlockStore": {"volumeID": "vol-1", "readOnly": True}}
    assert is_volume_conflict(ebs, pod("x", ebs))  # EBS conflicts even read-only
    iscsi = lambda iqn, ro=False: {"name": "i", "iscsi": {"iqn": iqn, "readOnly": ro}}  # noqa: E731
    assert is_volume_conflict(iscsi("a"), pod("x", iscsi("a", True)))
    assert not is_volume_conflict(iscsi("a"), pod("x", iscsi("b")))
    assert not is_volume_conflict(iscsi("a", True), pod("x", iscsi("a", True)))
    rbd = lambda mons, image="img", ro=False: {"name": "r", "rbd": {  # noqa: E731
        "monitors": mons, "image": image, "readOnly": ro}}
    assert is_volume_conflict(rbd(["m1", "m2"]), pod("x", rbd(["m2"])))
    assert not is_volume_conflict(rbd(["m1"]), pod("x", rbd(["m2"])))
    assert not is_volume_conflict(rbd(["m1"]), pod("x", rbd(["m1"], image="other")))


def test_volume_restrictions_disk_conflict_on_node() -> None:
    pl = VolumeRestrictions(None, Handle())
    disk = {"name": "d", "gcePersistentDisk": {"pdName": "disk"}}
    busy = NodeInfo(node("n1"), [pod("other", disk, node_name="n1")])
    free = NodeInfo(node("n2"))
    st = run(pl, pod("p", disk), busy)
    assert st is not None and st.code == Code.UNSCHEDULABLE and st.reasons == [REASON_DISK_CONFLICT]
    assert run(pl, pod("p", disk), free) is None
    st = run(pl, pod("plain", {"name": "e", "emptyDir": {}}), busy)
    assert st is not None and st.code == Code.SKIP


def test_volume_restrictions_read_write_once_pod() -> None:
    f = Factory()
    f.put("persistentvolumeclaims", pvc("solo", ["ReadWriteOncePod"]))
    f.put("persistentvolumeclaims", pvc("shared", ["ReadWriteOnce"]))
    n1 = NodeInfo(node("n1"), [pod("user", claim_vol("solo"), claim_vol("shared"), node_name="n1")])
    n2 = NodeInfo(node("n2"))
    handle = Handle(informer_factory=f, snapshot=Snapshot([n1, n2]))
    pl = VolumeRestrictions(None, handle)
    # Any node: the claim is in use somewhere in the cluster.
    for ni in (n1, n2):
        st = run(pl, pod("p", claim_vol("solo")), ni)
        assert st is not None and st.code == Code.UNSCHEDULABLE and st.reasons == [REASON_RWOP_CONFLICT]
    st = run(pl, pod("p", claim_vol("shared")), n2)
    assert st is not None and st.code == Code.SKIP
    st = run(pl, pod("p", claim_vol("missing")), n2)
    assert st is not None and st.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert st.reasons == ['persistentvolumeclaim "missing" not found']
    # Preemption removing the user frees the claim.
    state = CycleState()
    pi = PodInfo(pod("p", claim_vol("solo")))
    assert pl.pre_filter(state, pi, [n1, n2])[1] is None
    pl.remove_pod(state, pi, n1.pods[0], n1)
    assert pl.filter(state, pi, n2) is None
    pl.add_pod(state, pi, n1.pods[0], n1)
    assert pl.filter(state, pi, n2) is not None
    # Hints: deleting the user queues the pod; an unrelated pod does not.
    assert pl.is_schedulable_after_pod_deleted(pi.pod, n1.pods[0].pod, None) == QueueingHint.QUEUE
    other = pod("o", claim_vol("shared"), node_name="n1")
    assert pl.is_schedulable_after_pod_deleted(pi.pod, other, None) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pvc_added(pi.pod, None, pvc("solo")) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pvc_added(pi.pod, None, pvc("x")) == QueueingHint.SKIP


# --------------------------------------------------------------------------- VolumeZone


def zone_env() -> tuple[Factory, VolumeZone]:
    f = Factory()
    f.put("storageclasses", {"metadata": {"name": "wffc"}, "volumeBindingMode": "WaitForFirstConsumer"})
    f.put("storageclasses", {"metadata": {"name": "imm"}, "volumeBindingMode": "Immediate"})
    f.put("persistentvolumes", {"metadata": {"name": "pv-a", "labels": {
        "topology.kubernetes.io/zone": "a__b", "topology.kubernetes.io/region": "r1"}}, "spec": {}})
    f.put("persistentvolumes", {"metadata": {"name": "pv-beta", "labels": {
        "failure-domain.beta.kubernetes.io/zone": "c"}}, "spec": {}})
    f.put("persistentvolumeclaims", pvc("za", volume="pv-a"))
    f.put("persistentvolumeclaims", pvc("zbeta", volume="pv-beta"))
    f.put("persistentvolumeclaims", pvc("late", cls="wffc"))
    f.put("persistentvolumeclaims", pvc("pending", cls="imm"))
    return f, VolumeZone(None, Handle(informer_factory=f))


def test_volume_zone_matches_node_labels() -> None:
    _, pl = zone_env()
    za = pod("p", claim_vol("za"))
    ok = NodeInfo(node("n1", **{"topology.kubernetes.io/zone": "b", "topology.kubernetes.io/region": "r1"}))
    wrong_zone = NodeInfo(node("n2", **{"topology.kubernetes.io/zone": "c", "topology.kubernetes.io/region": "r1"}))
    wrong_region = NodeInfo(node("n3", **{"topology.kubernetes.io/zone": "a", "topology.kubernetes.io/region": "r2"}))
    unlabelled = NodeInfo(node("n4"))
    assert run(pl, za, ok) is None
    for ni in (wrong_zone, wrong_region):
        st = run(pl, za, ni)
        assert st is not None and st.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and st.reasons == [REASON_CONFLICT]
    assert run(pl, za, unlabelled) is None  # nodes without topology labels are not constrained


def test_volume_zone_beta_label_matches_ga_node_label_and_unbound_claims() -> None:
    _, pl = zone_env()
    ga_c = NodeInfo(node("n1", **{"topology.kubernetes.io/zone": "c"}))
    ga_d = NodeInfo(node("n2", **{"topology.kubernetes.io/zone": "d"}))
    assert run(pl, pod("p", claim_vol("zbeta")), ga_c) is None
    assert run(pl, pod("p", claim_vol("zbeta")), ga_d) is not None
    st = run(pl, pod("p", claim_vol("late")), ga_d)
    assert st is not None and st.code == Code.SKIP  # delayed binding: decided by VolumeBinding
    st = run(pl, pod("p", claim_vol("pending")), ga_d)
    assert st is not None and st.reasons == ["PersistentVolume had no name"]
    st = run(pl, pod("p", claim_vol("nope")), ga_d)
    assert st is not None and st.reasons == ['persistentvolumeclaim "nope" not found']


def test_volume_zone_hints() -> None:
    _, pl = zone_env()
    p = pod("p", claim_vol("za"))
    assert pl.is_schedulable_after_storage_class_added(
        p, None, {"metadata": {"name": "x"}, "volumeBindingMode": "WaitForFirstConsumer"}) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_storage_class_added(
        p, None, {"metadata": {"name": "x"}, "volumeBindingMode": "Immediate"}) == QueueingHint.SKIP
    plain = {"metadata": {"name": "v", "labels": {}}}
    zoned = {"metadata": {"name": "v", "labels": {"topology.kubernetes.io/zone": "a"}}}
    assert pl.is_schedulable_after_pv_change(p, plain, zoned) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pv_change(p, zoned, zoned) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pvc_change(p, None, pvc("za")) == QueueingHint.QUEUE


# --------------------------------------------------------------------------- NodeVolumeLimits


def limits_env(count: int | None = 2) -> tuple[Factory, NodeVolumeLimits]:
    f = Factory()
    driver: dict = {"name": "csi.example", "nodeID": "n1"}
    if count is not None:
        driver["allocatable"] = {"count": count}
    f.put("csinodes", {"metadata": {"name": "n1"}, "spec": {"drivers": [driver]}})
    f.put("storageclasses", {"metadata": {"name": "csi"}, "provisioner": "csi.example"})
    for i in range(4):
        f.put("persistentvolumes", {"metadata": {"name": f"pv{i}"}, "spec": {
            "csi": {"driver": "csi.example", "volumeHandle": f"h{i}"}}})
        f.put("persistentvolumeclaims", pvc(f"c{i}", volume=f"pv{i}", cls="csi"))
    f.put("persistentvolumeclaims", pvc("unbound", cls="csi"))
    return f, NodeVolumeLimits(None, Handle(informer_factory=f))


def test_node_volume_limits_counts_attached_and_new_volumes() -> None:
    _, pl = limits_env(2)
    ni = NodeInfo(node("n1"), [pod("a", claim_vol("c0"), node_name="n1")])
    assert run(pl, pod("p", claim_vol("c1")), ni) is None
    st = run(pl, pod("p", claim_vol("c1"), claim_vol("c2")), ni)
    assert st is not None and st.code == Code.UNSCHEDULABLE and st.reasons == [REASON_MAX_VOLUME_COUNT]
    # A volume already attached to the node is not counted twice.
    assert run(pl, pod("p", claim_vol("c0"), claim_vol("c1")), ni) is None
    # An unbound claim counts through its class's provisioner.
    st = run(pl, pod("p", claim_vol("c1"), claim_vol("unbound")), ni)
    assert st is not None and st.reasons == [REASON_MAX_VOLUME_COUNT]
    # Inline CSI volumes count too.
    inline = {"name": "i", "csi": {"driver": "csi.example"}}
    assert run(pl, pod("p", claim_vol("c1"), inline), ni) is not None
    st = run(pl, pod("p", claim_vol("ghost")), ni)
    assert st is not None and st.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    st = run(pl, pod("p", {"name": "e", "emptyDir": {}}), ni)
    assert st is not None and st.code == Code.SKIP


def test_node_volume_limits_without_limits_and_hints() -> None:
    _, pl = limits_env(None)
    ni = NodeInfo(node("n1"), [pod("a", claim_vol("c0"), claim_vol("c1"), node_name="n1")])
    assert run(pl, pod("p", claim_vol("c2"), claim_vol("c3")), ni) is None
    other = NodeInfo(node("n9"))  # no CSINode at all
    assert run(pl, pod("p", claim_vol("c2")), other) is None
    old = {"metadata": {"name": "n1"}, "spec": {"drivers": [{"name": "d", "allocatable": {"count": 1}}]}}
    more = {"metadata": {"name": "n1"}, "spec": {"drivers": [{"name": "d", "allocatable": {"count": 3}}]}}
    p = pod("p", claim_vol("c2"))
    assert pl.is_schedulable_after_csi_node_updated(p, old, more) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_csi_node_updated(p, more, old) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pod_deleted(p, pod("x", claim_vol("c0"), node_name="n1"), None) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_deleted(p, pod("x", node_name="n1"), None) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pvc_added(p, None, pvc("c2")) == QueueingHint.QUEUE
