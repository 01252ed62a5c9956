"""Nominator: pods nominated to nodes, keyed by UID."""

from __future__ import annotations

from typing import Any

import pytest

from kubeplane.scheduler.nominator import Nominator
from kubeplane.scheduler.queue import QueuedPodInfo, QueueProfile, SchedulingQueue


def mkpod(name: str, nominated: str | None = None, node: str | None = None, uid: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"},
        "spec": {"containers": [{"name": "c"}]},
        "status": {},
    }
    if nominated:
        pod["status"]["nominatedNodeName"] = nominated
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_add_uses_status_or_override_and_keeps_order() -> None:
    n = Nominator()
    n.add_nominated_pod(mkpod("a", nominated="n1"))
    n.add_nominated_pod(mkpod("b"), "n1")
    n.add_nominated_pod(mkpod("c", nominated="n1"), "n2")
    n.add_nominated_pod(mkpod("d"))  # nothing to nominate
    assert names(n.nominated_pods_for_node("n1")) == ["a", "b"]
    assert names(n.nominated_pods_for_node("n2")) == ["c"]
    assert len(n) == 3
    assert n.nominated_node_for(mkpod("c")) == "n2"


def test_readd_moves_pod_and_never_duplicates() -> None:
    n = Nominator()
    n.add_nominated_pod(mkpod("a"), "n1")
    n.add_nominated_pod(mkpod("a"), "n1")
    assert names(n.nominated_pods_for_node("n1")) == ["a"]
    n.add_nominated_pod(mkpod("a"), "n2")
    assert n.nominated_pods_for_node("n1") == [] and names(n.nominated_pods_for_node("n2")) == ["a"]
    assert "n1" not in n.nominated_nodes()
    n.add_nominated_pod(mkpod("a"), "")  # empty override clears
    assert len(n) == 0


def test_accepts_pod_info_objects() -> None:
    n = Nominator()
    n.add_nominated_pod(QueuedPodInfo(pod=mkpod("a", nominated="n1")))
    assert names(n.nominated_pods_for_node("n1")) == ["a"]
    with pytest.raises(TypeError):
        n.add_nominated_pod(object())


def test_delete() -> None:
    n = Nominator()
    n.add_nominated_pod(mkpod("a"), "n1")
    n.add_nominated_pod(mkpod("b"), "n1")
    n.delete_nominated_pod_if_exists(mkpod("a"))
    n.delete_nominated_pod_if_exists(mkpod("zzz"))
    assert names(n.nominated_pods_for_node("n1")) == ["b"]
    n.delete_nominated_pod_if_exists(mkpod("b"))
    assert n.nominated_nodes() == {}


def test_update_keeps_in_memory_nomination_when_status_lacks_it() -> None:
    n = Nominator()
    old = mkpod("a")
    n.add_nominated_pod(old, "n1")  # preemption nominated it; status patch not seen yet
    new = mkpod("a")
    new["metadata"]["labels"] = {"x": "1"}
    n.update_nominated_pod(old, new)
    got = n.nominated_pods_for_node("n1")
    assert got == [new]


def test_update_follows_status_changes() -> None:
    n = Nominator()
    old = mkpod("a", nominated="n1")
    n.add_nominated_pod(old)
    n.update(old, mkpod("a", nominated="n2"))
    assert n.nominated_pods_for_node("n1") == [] and names(n.nominated_pods_for_node("n2")) == ["a"]
    n.update(mkpod("a", nominated="n2"), mkpod("a"))  # nomination removed from status
    assert len(n) == 0


def test_pod_getter_rejects_gone_or_bound_pods() -> None:
    live = {"a": mkpod("a"), "b": mkpod("b", node="n9")}
    n = Nominator(lambda ns, name: live.get(name))
    n.add_nominated_pod(mkpod("a"), "n1")
    n.add_nominated_pod(mkpod("b"), "n1")
    n.add_nominated_pod(mkpod("gone"), "n1")
    assert names(n.nominated_pods_for_node("n1")) == ["a"]


def test_queue_tracks_nominations_on_add_update_delete() -> None:
    q = SchedulingQueue({"default-scheduler": QueueProfile()}, clock=lambda: 0.0)
    pod = mkpod("a", nominated="n1")
    q.add(pod)
    assert names(q.nominated_pods_for_node("n1")) == ["a"]
    moved = mkpod("a", nominated="n2")
    q.update(pod, moved)
    assert q.nominated_pods_for_node("n1") == [] and q.nominated_pods_for_node("n2") == [moved]
    q.add_nominated_pod(mkpod("b"), "n2")
    assert names(q.nominated_pods_for_node("n2")) == ["a", "b"]
    q.delete(moved)
    assert names(q.nominated_pods_for_node("n2")) == ["b"]
    q.delete_nominated_pod_if_exists(mkpod("b"))
    assert q.nominated_pods_for_node("n2") == []
