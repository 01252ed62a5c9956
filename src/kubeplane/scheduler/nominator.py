"""Pods nominated to nodes by preemption, as upstream kube-scheduler's nominator.

A nominated pod is waiting for victims on its node to go away; the scheduler
counts it on that node when filtering lower-or-equal priority pods. Entries
are keyed by pod UID; a pod is nominated on at most one node. The node comes
either from an explicit override (preemption's result) or from the pod's
``status.nominatedNodeName``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

Obj = dict[str, Any]

#: pod_getter(namespace, name) -> the live pod, or None when it no longer exists.
PodGetter = Callable[[str, str], Optional[Obj]]


def _pod_of(pod_or_info: Any) -> Obj:
    """Accept a pod dict or any object carrying it in ``.pod``."""
    if isinstance(pod_or_info, dict):
        return pod_or_info
    pod = getattr(pod_or_info, "pod", None)
    if not isinstance(pod, dict):
        raise TypeError(f"expected a pod dict or an object with .pod, got {type(pod_or_info).__name__}")
    return pod


def _uid(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def nominated_node_name(pod: Obj) -> str:
    """``status.nominatedNodeName`` or ``""``."""
    return (pod.get("status") or {}).get("nominatedNodeName") or ""


class Nominator:
    """Nominated pods per node, in nomination order (thread-safe)."""

    def __init__(self, pod_getter: PodGetter | None = None) -> None:
        self._lock = threading.Lock()
        self._pod_getter = pod_getter
        # node name -> pods nominated there (insertion order)
        self._by_node: dict[str, list[Obj]] = {}
        # pod uid -> node name
        self._node_of: dict[str, str] = {}

    def add_nominated_pod(self, pod_or_info: Any, node_name: str | None = None) -> None:
        """Nominate a pod.

        ``node_name`` None uses the pod's ``status.nominatedNodeName``
        (upstream ModeNoop); a string overrides it (ModeOverride), and ``""``
        just clears the nomination. A pod the getter reports gone or already
        bound is not nominated.
        """
        pod = _pod_of(pod_or_info)
        with self._lock:
            self._add_locked(pod, node_name)

    def _add_locked(self, pod: Obj, node_name: str | None) -> None:
        self._delete_locked(pod)
        node = nominated_node_name(pod) if node_name is None else node_name
        if not node:
            return
        if self._pod_getter is not None:
            meta = pod.get("metadata") or {}
            live = self._pod_getter(meta.get("namespace", ""), meta.get("name", ""))
            if live is None or (live.get("spec") or {}).get("nodeName"):
                return
        uid = _uid(pod)
        self._node_of[uid] = node
        pods = self._by_node.setdefault(node, [])
        if not any(_uid(p) == uid for p in pods):
            pods.append(pod)

    def delete_nominated_pod_if_exists(self, pod: Obj) -> None:
        """Drop the pod's nomination, if any."""
        with self._lock:
            self._delete_locked(pod)

    def _delete_locked(self, pod: Obj) -> None:
        uid = _uid(pod)
        node = self._node_of.pop(uid, None)
        if node is None:
            return
        pods = self._by_node.get(node, [])
        for i, p in enumerate(pods):
            if _uid(p) == uid:
                del pods[i]
                break
        if not pods:
            self._by_node.pop(node, None)

    def update_nominated_pod(self, old_pod: Obj, new_pod_or_info: Any) -> None:
        """Replace the stored pod object.

        When neither version carries ``status.nominatedNodeName`` but the pod
        is nominated in memory (preemption ran, the status patch has not been
        observed yet), the in-memory nomination is kept.
        """
        new_pod = _pod_of(new_pod_or_info)
        with self._lock:
            override: str | None = None
            if not nominated_node_name(old_pod) and not nominated_node_name(new_pod):
                override = self._node_of.get(_uid(old_pod))
            self._delete_locked(old_pod)
            self._add_locked(new_pod, override)

    update = update_nominated_pod

    def nominated_pods_for_node(self, node_name: str) -> list[Obj]:
        """Pods nominated on ``node_name``, in nomination order (a copy)."""
        with self._lock:
            return list(self._by_node.get(node_name, ()))

    def nominated_node_for(self, pod: Obj) -> str | None:
        """Node the pod is nominated on, or None."""
        with self._lock:
            return self._node_of.get(_uid(pod))

    def nominated_nodes(self) -> dict[str, list[Obj]]:
        """Snapshot of all nominations, node -> pods."""
        with self._lock:
            return {n: list(ps) for n, ps in self._by_node.items()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._node_of)
