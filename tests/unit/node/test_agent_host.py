"""The node agent's pure parts: host measurements, reservations, node conditions,
the pod status patch it writes."""

from __future__ import annotations

import os

import pytest

from kubeplane.api.nodestatus import carry_transitions, lease_object, node_conditions
from kubeplane.node import host
from kubeplane.node.agent import AgentConfig, _same_status, deletion_grace, status_matches, status_patch


def test_parse_reserved():
    assert host.parse_reserved("") == {}
    assert host.parse_reserved("cpu=500m, memory=1Gi,pid=100") == {"cpu": "500m", "memory": "1Gi", "pid": "100"}
    for bad, words in [("cpu", "missing value for key 'cpu'"), ("=1", "missing value"),
                       ("gpu=1", "unsupported resource 'gpu'"), ("cpu=x", "quantities must match"),
                       ("memory=-1Gi", "cannot be negative")]:
        with pytest.raises(ValueError, match=words):
            host.parse_reserved(bad)


def test_capacity_and_allocatable(tmp_path):
    mem = host.meminfo()["MemTotal"]
    cap = host.measure_capacity(str(tmp_path), 20, {"cpu": "250m", "memory": "512Mi",
                                                     "ephemeral-storage": "1Gi"})
    st = os.statvfs(str(tmp_path))
    disk = st.f_blocks * st.f_frsize
    assert cap.capacity["cpu"] == str(os.cpu_count())
    assert cap.capacity["memory"] == f"{mem // 1024}Ki"
    assert cap.capacity["pods"] == "20" and cap.allocatable["pods"] == "20"
    assert cap.allocatable["cpu"] == f"{os.cpu_count() * 1000 - 250}m"
    assert cap.allocatable["memory"] == f"{(mem - 512 * 1024 ** 2 - 100 * 1024 ** 2) // 1024}Ki"
    assert int(cap.allocatable["ephemeral-storage"]) == disk - 1024 ** 3 - disk // 10
    # a reservation larger than the host leaves nothing, not a negative quantity
    huge = host.measure_capacity(str(tmp_path), 1, {"cpu": "100000"})
    assert huge.allocatable["cpu"] == "0"


def test_validate_node_ip():
    assert host.validate_node_ip("127.0.0.1") == "127.0.0.1"
    for bad, words in [("x", "failed to parse node IP"), ("0.0.0.0", "all zeros"),
                       ("224.0.0.1", "multicast"), ("169.254.1.1", "link-local"),
                       ("203.0.113.77", "not found in the host's network interfaces")]:
        with pytest.raises(host.HostError, match=words):
            host.validate_node_ip(bad)


def test_node_info_and_addresses():
    info = host.node_info("containerd", "1.6.20", "v1.32.0-kubeplane")
    assert info["containerRuntimeVersion"] == "containerd://1.6.20"
    assert info["kernelVersion"] == os.uname().release and info["operatingSystem"] == "linux"
    assert host.node_addresses("n1", "127.0.0.1") == [{"type": "InternalIP", "address": "127.0.0.1"},
                                                       {"type": "Hostname", "address": "n1"}]


def test_conditions_and_transitions():
    first = node_conditions("2026-01-01T00:00:00Z", not_ready="container runtime is down")
    ready = {c["type"]: c for c in first}["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "KubeletNotReady",
                                                                   "container runtime is down")
    later = carry_transitions(first, node_conditions("2026-01-01T00:01:00Z"))
    by = {c["type"]: c for c in later}
    # the pressure conditions did not change: their transition time stays; Ready's moves
    assert by["MemoryPressure"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert by["MemoryPressure"]["lastHeartbeatTime"] == "2026-01-01T00:01:00Z"
    assert by["Ready"]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
    assert by["Ready"]["reason"] == "KubeletReady"
    a = {"capacity": {"cpu": "2"}, "conditions": later}
    b = {"capacity": {"cpu": "2"}, "conditions": carry_transitions(later, node_conditions("2026-01-01T00:02:00Z"))}
    assert _same_status(a, b)
    assert not _same_status(a, {**b, "capacity": {"cpu": "4"}})


def test_lease_object():
    lease = lease_object("n1", "2026-01-01T00:00:00.000000Z", node_uid="u1")
    assert lease["spec"] == {"holderIdentity": "n1", "leaseDurationSeconds": 40,
                             "renewTime": "2026-01-01T00:00:00.000000Z"}
    assert lease["metadata"]["namespace"] == "kube-node-lease"
    assert lease["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}]


def test_status_patch_and_match():
    old = {"phase": "Pending", "reason": "X", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    new = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    patch = status_patch(old, new)
    # fields only the old status has are removed; conditions merge by type (others' stay)
    assert patch == {"phase": "Running", "reason": None, "conditions": [{"type": "Ready", "status": "True"}]}
    merged = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                                 {"type": "Ready", "status": "True", "lastProbeTime": None}]}
    assert status_matches(merged, new)
    assert not status_matches(merged, {**new, "phase": "Failed"})
    assert not status_matches(merged, {"conditions": [{"type": "Ready", "status": "False"}]})


def test_deletion_grace():
    assert deletion_grace({"metadata": {"deletionGracePeriodSeconds": 5}, "spec": {}}) == 5
    assert deletion_grace({"metadata": {}, "spec": {"terminationGracePeriodSeconds": 7}}) == 7
    assert deletion_grace({"metadata": {}, "spec": {}}) == 30


def test_agent_config_paths_and_bridge():
    cfg = AgentConfig(name="n1", data_dir="/d")
    assert (cfg.pods_dir, cfg.logs_dir, cfg.images_path) == ("/d/pods", "/d/logs", "/d/images")
    assert cfg.bridge.startswith("kp-") and len(cfg.bridge) <= 15
    assert cfg.bridge != AgentConfig(name="n2", data_dir="/d").bridge
    assert AgentConfig(name="n1", data_dir="/d", cni_bridge="br9").bridge == "br9"
