"""Pod cgroups: the limits upstream's pod container manager gives a pod, the QoS
hierarchy, cgroup v1 and v2 files (on a directory tree standing in for /sys/fs/cgroup)."""

from __future__ import annotations

import json

import pytest

from kubeplane.node.cgroups import (Hierarchy, PodCgroups, ResourceConfig, mounted_hierarchies,
                                    node_allocatable_config, pod_resource_config, runtime_cgroup_driver)


def _pod(containers, *, uid="u1", init=(), **spec):
    def c(i, r, **kw):
        out = {"name": f"c{i}", "image": "busybox", **kw}
        if r:
            out["resources"] = r
        return out

    body = {"metadata": {"name": "p", "namespace": "default", "uid": uid},
            "spec": {"containers": [c(i, r) for i, r in enumerate(containers)], **spec}}
    if init:
        body["spec"]["initContainers"] = [c(f"i{i}", r, **kw) for i, (r, kw) in enumerate(init)]
    return body


def test_guaranteed_pod_gets_shares_quota_and_memory():
    r = {"requests": {"cpu": "500m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}}
    cfg = pod_resource_config(_pod([r, r]))
    assert (cfg.cpu_shares, cfg.cpu_quota, cfg.cpu_period, cfg.memory) == (1024, 100000, 100000, 128 << 20)
    assert cfg.hugepages == {}  # every huge page size limited to 0


def test_burstable_pod_gets_limits_only_when_every_container_declares_them():
    limited = {"requests": {"cpu": "100m"}, "limits": {"cpu": "1", "memory": "32Mi"}}
    cfg = pod_resource_config(_pod([limited]))
    assert (cfg.cpu_shares, cfg.cpu_quota, cfg.cpu_period, cfg.memory) == (102, 100000, 100000, 32 << 20)
    # one container without limits: neither quota nor memory limit for the pod
    cfg = pod_resource_config(_pod([limited, {"requests": {"cpu": "100m"}}]))
    assert (cfg.cpu_shares, cfg.cpu_quota, cfg.cpu_period, cfg.memory) == (204, None, None, None)
    # an init container without a memory limit counts too
    cfg = pod_resource_config(_pod([limited], init=[({"limits": {"cpu": "1"}}, {})]))
    assert cfg.cpu_quota == 100000 and cfg.memory is None
    # pod-level limits declare them for the whole pod
    cfg = pod_resource_config(_pod([{"requests": {"cpu": "100m"}}], resources={"limits": {"memory": "1Gi"}}))
    assert cfg.memory == 1 << 30 and cfg.cpu_quota is None


def test_init_containers_sidecars_and_overhead():
    main = {"requests": {"cpu": "200m"}, "limits": {"cpu": "200m", "memory": "10Mi"}}
    init = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "memory": "100Mi"}}
    sidecar = {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m", "memory": "5Mi"}}
    pod = _pod([main], init=[(init, {}), (sidecar, {"restartPolicy": "Always"})], overhead={"cpu": "50m"})
    cfg = pod_resource_config(pod)
    # requests max(1 core init, 200m + 100m sidecar) + 50m overhead; limits likewise
    assert cfg.cpu_shares == 1075 and cfg.cpu_quota == 105000 and cfg.memory == 100 << 20


def test_best_effort_pod_gets_the_least_shares_and_no_limits():
    cfg = pod_resource_config(_pod([None]))
    assert (cfg.cpu_shares, cfg.cpu_quota, cfg.memory) == (2, None, None)


def test_huge_pages():
    r = {"requests": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "20Mi"},
         "limits": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "20Mi"}}
    assert pod_resource_config(_pod([r])).hugepages == {2 << 20: 20 << 20}


def test_node_allocatable():
    cfg = node_allocatable_config({"cpu": "4", "memory": "8Gi", "pods": "110"}, {"cpu": "500m", "memory": "1Gi"})
    assert cfg.cpu_shares == 3584 and cfg.memory == 7 << 30 and cfg.cpu_quota is None


def test_mounted_hierarchies(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
        "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,xattr,name=systemd 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
        "proc /proc proc rw 0 0\n")
    got = mounted_hierarchies(str(mounts))
    assert got == [Hierarchy("/sys/fs/cgroup/cpu,cpuacct", frozenset({"cpu", "cpuacct"})),
                   Hierarchy("/sys/fs/cgroup/memory", frozenset({"memory"})),
                   Hierarchy("/sys/fs/cgroup/systemd", frozenset({"name=systemd"})),
                   Hierarchy("/sys/fs/cgroup/unified", frozenset())]  # hybrid: placement only
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\n")
    assert mounted_hierarchies(str(mounts)) == [
        Hierarchy(str(v2), frozenset({"cpuset", "cpu", "io", "memory", "pids"}), v2=True)]


def _v1_tree(tmp_path):
    hs = []
    for name, ctrls in (("cpu", {"cpu"}), ("memory", {"memory"}), ("cpuset", {"cpuset"}),
                        ("hugetlb", {"hugetlb"}), ("unified", set())):
        d = tmp_path / name
        d.mkdir()
        hs.append(Hierarchy(str(d), frozenset(ctrls)))
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-3\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    (tmp_path / "hugetlb" / "hugetlb.2MB.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "hugetlb" / "hugetlb.1GB.limit_in_bytes").write_text("9223372036854771712\n")
    return hs


def _read(path) -> str:
    with open(path) as f:
        return f.read().strip()


def test_v1_tree_with_qos_cgroups_and_pod_limits(tmp_path):
    cg = PodCgroups("/node-a", node_config=ResourceConfig(cpu_shares=4096, memory=8 << 30),
                    hierarchies=_v1_tree(tmp_path))
    burstable = _pod([{"requests": {"cpu": "250m", "hugepages-2Mi": "4Mi"},
                       "limits": {"cpu": "500m", "memory": "64Mi", "hugepages-2Mi": "4Mi"}}], uid="b1")
    guaranteed = _pod([{"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}],
                      uid="g1")
    guaranteed["status"] = {"qosClass": "Guaranteed"}
    assert cg.ensure_pod(burstable) == "/node-a/kubepods/burstable/podb1"
    assert cg.ensure_pod(guaranteed) == "/node-a/kubepods/podg1"
    assert cg.pod_name(_pod([None], uid="e1")) == "/node-a/kubepods/besteffort/pode1"
    cpu, mem, cpuset, huge = (tmp_path / n / "node-a" / "kubepods" for n in ("cpu", "memory", "cpuset", "hugetlb"))
    assert _read(cpu / "cpu.shares") == "4096" and _read(mem / "memory.limit_in_bytes") == str(8 << 30)
    assert _read(cpu / "besteffort" / "cpu.shares") == "2"
    assert _read(cpu / "burstable" / "cpu.shares") == "256"  # its one pod's 250m
    b = cpu / "burstable" / "podb1"
    assert (_read(b / "cpu.shares"), _read(b / "cpu.cfs_period_us"), _read(b / "cpu.cfs_quota_us")) == \
        ("256", "100000", "50000")
    assert _read(mem / "burstable" / "podb1" / "memory.limit_in_bytes") == str(64 << 20)
    assert _read(huge / "burstable" / "podb1" / "hugetlb.2MB.limit_in_bytes") == str(4 << 20)
    assert _read(huge / "burstable" / "podb1" / "hugetlb.1GB.limit_in_bytes") == "0"
    assert _read(cpu / "podg1" / "cpu.cfs_quota_us") == "100000"
    assert _read(mem / "podg1" / "memory.limit_in_bytes") == str(1 << 30)
    # v1 cpusets take their parent's cpus and memory nodes, down the path
    assert _read(cpuset / "burstable" / "podb1" / "cpuset.cpus") == "0-3"
    assert _read(cpuset / "cpuset.mems") == "0"
    assert (tmp_path / "unified" / "node-a" / "kubepods" / "burstable" / "podb1").is_dir()
    assert cg.pod_uids() == {"b1", "g1"}
    # made once: a pod's cgroup is not written again on later syncs
    (b / "cpu.shares").write_text("7")
    cg.ensure_pod(burstable)
    assert _read(b / "cpu.shares") == "7"
    cg.forget("b1")
    assert _read(cpu / "burstable" / "cpu.shares") == "2"


def test_v2_tree_enables_controllers_and_writes_v2_files(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids io\n")
    h = Hierarchy(str(root), frozenset({"cpu", "memory", "pids", "io"}), v2=True)
    cg = PodCgroups("/", node_config=ResourceConfig(cpu_shares=2048, memory=1 << 30), hierarchies=[h])
    pod = _pod([{"requests": {"cpu": "100m"}, "limits": {"cpu": "200m", "memory": "32Mi"}}], uid="x")
    assert cg.ensure_pod(pod) == "/kubepods/burstable/podx"
    assert _read(root / "cgroup.subtree_control") == "+cpu +io +memory +pids"
    kp = root / "kubepods"
    assert _read(kp / "cpu.weight") == str(1 + (2046 * 9999) // 262142) and _read(kp / "memory.max") == str(1 << 30)
    pod_dir = kp / "burstable" / "podx"
    assert _read(pod_dir / "cpu.max") == "20000 100000" and _read(pod_dir / "memory.max") == str(32 << 20)
    assert _read(pod_dir / "cpu.weight") == str(1 + (100 * 9999) // 262142)
    be = _pod([None], uid="y")
    cg.ensure_pod(be)
    assert not (kp / "besteffort" / "pody" / "cpu.max").exists()


def test_runtime_cgroup_driver():
    def info(cfg):
        return {"config": json.dumps(cfg)}

    runc = {"containerd": {"defaultRuntimeName": "runc", "runtimes": {"runc": {"options": None}}}}
    assert runtime_cgroup_driver(info(runc)) == "cgroupfs"
    runc["containerd"]["runtimes"]["runc"]["options"] = {"SystemdCgroup": True}
    assert runtime_cgroup_driver(info(runc)) == "systemd"
    assert runtime_cgroup_driver(info({"systemdCgroup": True})) == "systemd"
    assert runtime_cgroup_driver({}) == "cgroupfs"


def test_no_hierarchy_is_an_error():
    from kubeplane.node.cgroups import CgroupError

    with pytest.raises(CgroupError):
        PodCgroups("/", hierarchies=[])
