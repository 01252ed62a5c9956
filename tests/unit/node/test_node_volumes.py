"""The node's pod volumes in a temporary pods directory: files, modes, links, updates, errors."""

from __future__ import annotations

import base64
import os
import stat
import uuid

import pytest

from kubeplane.api.resources import resource
from kubeplane.node.cri.client import pb
from kubeplane.node.volumes import (
    AtomicWriter,
    FileProjection,
    VolumeError,
    VolumeManager,
    extract_field_path,
    find_container,
    format_map,
    mounts_under,
    pod_field_value,
    resource_field_value,
    validate_path,
)

CMS = resource("configmaps")
SECRETS = resource("secrets")
NODES = resource("nodes")
PVCS = resource("persistentvolumeclaims")
PVS = resource("persistentvolumes")



def _pod(volumes, mounts=None, *, name="p", containers=None, **spec):
    mounts = mounts if mounts is not None else [{"name": v["name"], "mountPath": f"/v/{v['name']}"} for v in volumes]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4()),
                         "labels": {"app": "web", "tier": "front"}, "annotations": {"note": 'say "hi"\n'}},
            "spec": {"nodeName": "n1", "volumes": volumes,
                     "containers": containers or [{"name": "c", "image": "busybox", "volumeMounts": mounts}],
                     **spec}}


@pytest.fixture
async def vm(inprocess_client, tmp_path):
    m = VolumeManager(inprocess_client, str(tmp_path / "pods"), node_name="n1",
                      local_volumes_dir=str(tmp_path / "local"), resync_seconds=3600)
    yield m
    await m.close()
    for uid in m.pod_uids_on_disk():
        await m.teardown(uid)
    assert not mounts_under(str(tmp_path))


def _read(path):
    with open(path) as f:
        return f.read()


# ------------------------------------------------------------------ atomic writer


def test_atomic_writer_layout_update_and_prune(tmp_path):
    w = AtomicWriter(str(tmp_path))
    assert w.write({"a": FileProjection(b"1", 0o600), "d/b": FileProjection(b"2")})
    first = os.readlink(tmp_path / "..data")
    assert first.startswith("..") and (tmp_path / first).is_dir()
    assert os.readlink(tmp_path / "a") == "..data/a" and os.readlink(tmp_path / "d") == "..data/d"
    assert _read(tmp_path / "d" / "b") == "2"
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / first).st_mode) == 0o755
    # the same content: nothing is written
    assert not w.write({"a": FileProjection(b"1", 0o600), "d/b": FileProjection(b"2")})
    assert os.readlink(tmp_path / "..data") == first
    # new content, one name gone: a new directory swapped in, the old one and the old name removed
    assert w.write({"a": FileProjection(b"one")})
    second = os.readlink(tmp_path / "..data")
    assert second != first and not (tmp_path / first).exists()
    assert _read(tmp_path / "a") == "one" and not os.path.lexists(tmp_path / "d")
    assert sorted(os.listdir(tmp_path)) == sorted(["..data", second, "a"])


@pytest.mark.parametrize("path, message", [
    ("", 'invalid path: must not be empty: ""'),
    ("/etc/x", "invalid path: must be relative path: /etc/x"),
    ("a/../b", "invalid path: must not contain '..': a/../b"),
    ("..data/x", "invalid path: must not start with '..': ..data/x"),
    ("x" * 256, "invalid path: filenames must be less than or equal to 255 characters"),
])
def test_payload_paths_are_checked(path, message, tmp_path):
    with pytest.raises(ValueError) as e:
        validate_path(path)
    assert str(e.value) == message
    with pytest.raises(ValueError):
        AtomicWriter(str(tmp_path)).write({path: FileProjection(b"")})
    assert os.listdir(tmp_path) == []


def test_format_map():
    assert format_map({"b": "2", "a": 'x"y'}) == 'a="x\\"y"\nb="2"'
    pod = _pod([])
    assert extract_field_path(pod, "metadata.labels") == 'app="web"\ntier="front"'
    assert extract_field_path(pod, "metadata.annotations['note']") == 'say "hi"\n'
    assert extract_field_path(pod, "metadata.labels['missing']") == ""
    with pytest.raises(ValueError, match="unsupported fieldPath: spec.nodeName"):
        extract_field_path(pod, "spec.nodeName")
    with pytest.raises(ValueError, match='fieldPath "metadata.name\\[\'x\'\\]" does not support subscript'):
        extract_field_path(pod, "metadata.name['x']")


def test_env_field_and_resource_refs():
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"app": "x"}},
           "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                    "containers": [{"name": "a"}, {"name": "b", "resources": {"limits": {"cpu": "0"}}}]}}
    assert pod_field_value(pod, "metadata.labels['app']", ["10.0.0.1"], ["1.2.3.4"]) == "x"
    assert pod_field_value(pod, "status.podIP", ["10.0.0.1"], []) == "10.0.0.1"
    assert pod_field_value(pod, "status.hostIPs", [], ["1.2.3.4", "fd00::1"]) == "1.2.3.4,fd00::1"
    assert pod_field_value(pod, "spec.nodeName", [], []) == "n1"
    with pytest.raises(ValueError, match="invalid key subscript"):
        pod_field_value(pod, "metadata.labels['a b']", [], [])
    c = {"name": "a", "resources": {"limits": {"memory": "128Mi"}, "requests": {"cpu": "250m"}}}
    assert resource_field_value({"resource": "limits.memory", "divisor": "1Mi"}, c, {}) == "128"
    assert resource_field_value({"resource": "requests.cpu", "divisor": "1m"}, c, {}) == "250"
    assert resource_field_value({"resource": "requests.cpu"}, c, {}) == "1"
    assert resource_field_value({"resource": "limits.cpu"}, c, {"cpu": "4"}) == "4"
    # a zero limit is unset: the node's allocatable stands in (upstream's MergeContainerResourceLimits)
    assert resource_field_value({"resource": "limits.cpu"}, find_container(pod, "b"), {"cpu": "4"}) == "4"
    with pytest.raises(ValueError, match="unsupported container resource : limits.nvidia.com/gpu"):
        resource_field_value({"resource": "limits.nvidia.com/gpu"}, c, {})
    with pytest.raises(ValueError, match="container c not found"):
        find_container(pod, "c")


def test_resource_field_values():
    c = {"resources": {"limits": {"cpu": "250m", "memory": "64Mi"}, "requests": {"cpu": "100m"}}}
    assert resource_field_value({"resource": "limits.cpu"}, c) == "1"  # rounded up to whole cores
    assert resource_field_value({"resource": "limits.cpu", "divisor": "1m"}, c) == "250"
    assert resource_field_value({"resource": "limits.memory", "divisor": "1Mi"}, c) == "64"
    assert resource_field_value({"resource": "requests.memory"}, c) == "0"
    alloc = {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "10Gi"}
    assert resource_field_value({"resource": "limits.ephemeral-storage", "divisor": "1Gi"}, c, alloc) == "10"
    with pytest.raises(ValueError, match="unsupported container resource : limits.gpu"):
        resource_field_value({"resource": "limits.gpu"}, c)


# ------------------------------------------------------------- configMap, secret


async def test_config_map_files_modes_and_update_in_place(vm, inprocess_client):
    await inprocess_client.create(CMS, {"metadata": {"name": "cfg"}, "data": {"a.conf": "A=1", "b": "B"},
                                        "binaryData": {"bin": base64.b64encode(b"\x00\x01").decode()}}, "default")
    pod = _pod([{"name": "all", "configMap": {"name": "cfg", "defaultMode": 0o640}},
                {"name": "some", "configMap": {"name": "cfg", "items": [
                    {"key": "a.conf", "path": "conf/app.conf", "mode": 0o600}]}}])
    await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    all_dir = vm.volume_dir(uid, "kubernetes.io~configmap", "all")
    some_dir = vm.volume_dir(uid, "kubernetes.io~configmap", "some")
    assert sorted(n for n in os.listdir(all_dir) if not n.startswith("..")) == ["a.conf", "b", "bin"]
    assert _read(os.path.join(all_dir, "a.conf")) == "A=1"
    with open(os.path.join(all_dir, "bin"), "rb") as f:
        assert f.read() == b"\x00\x01"
    assert stat.S_IMODE(os.stat(os.path.join(all_dir, "b")).st_mode) == 0o640
    assert os.listdir(some_dir).count("conf") == 1
    assert _read(os.path.join(some_dir, "conf", "app.conf")) == "A=1"
    assert stat.S_IMODE(os.stat(os.path.join(some_dir, "conf", "app.conf")).st_mode) == 0o600
    ms = vm.mounts(pod, pod["spec"]["containers"][0])
    assert [(m.container_path, m.host_path, m.readonly) for m in ms] == [
        ("/v/all", all_dir, True), ("/v/some", some_dir, True)]

    # the source changes: the files follow, through a new ..data
    before = os.readlink(os.path.join(all_dir, "..data"))
    cm = await inprocess_client.get(CMS, "cfg", "default")
    cm["data"] = {"a.conf": "A=2"}
    cm.pop("binaryData")
    await inprocess_client.update(CMS, cm)
    await vm.setup(pod)  # a sync of the unchanged pod: ready volumes are the resync's
    assert _read(os.path.join(all_dir, "a.conf")) == "A=1"
    await vm.refresh()
    assert _read(os.path.join(all_dir, "a.conf")) == "A=2"
    assert not os.path.lexists(os.path.join(all_dir, "b"))
    assert os.readlink(os.path.join(all_dir, "..data")) != before
    assert _read(os.path.join(some_dir, "conf", "app.conf")) == "A=2"
    await vm.teardown(uid)
    assert not os.path.exists(vm.pod_dir(uid))


async def test_config_map_errors_and_optional(vm, inprocess_client):
    with pytest.raises(VolumeError) as e:
        await vm.setup(_pod([{"name": "cfg", "configMap": {"name": "nope"}}]))
    assert e.value.reason == "FailedMount"
    assert e.value.message == 'MountVolume.SetUp failed for volume "cfg" : configmap "nope" not found'

    pod = _pod([{"name": "cfg", "configMap": {"name": "nope", "optional": True}}])
    await vm.setup(pod)
    d = vm.volume_dir(pod["metadata"]["uid"], "kubernetes.io~configmap", "cfg")
    assert [n for n in os.listdir(d) if not n.startswith("..")] == []

    await inprocess_client.create(CMS, {"metadata": {"name": "cfg"}, "data": {"a": "1"}}, "default")
    with pytest.raises(VolumeError) as e:
        await vm.setup(_pod([{"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "zz", "path": "z"}]}}]))
    assert e.value.message == ('MountVolume.SetUp failed for volume "cfg" : '
                               'configmap references non-existent config key: zz')


async def test_secret_on_tmpfs_decoded_and_torn_down(vm, inprocess_client):
    await inprocess_client.create(SECRETS, {"metadata": {"name": "s"}, "data": {
        "password": base64.b64encode(b"hunter2").decode()}}, "default")
    pod = _pod([{"name": "sec", "secret": {"secretName": "s", "defaultMode": 0o400}}])
    await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    d = vm.volume_dir(uid, "kubernetes.io~secret", "sec")
    assert d in mounts_under(vm.pod_dir(uid))
    assert _read(os.path.join(d, "password")) == "hunter2"
    assert stat.S_IMODE(os.stat(os.path.join(d, "password")).st_mode) == 0o400
    await vm.setup(pod)  # again: the same tmpfs, not a second one
    assert [p for p in mounts_under(vm.pod_dir(uid))] == [d]
    with pytest.raises(VolumeError, match='volume "x" : references non-existent secret key: nokey'):
        await vm.setup(_pod([{"name": "x", "secret": {"secretName": "s", "items": [{"key": "nokey", "path": "k"}]}}]))
    await vm.teardown(uid)
    assert mounts_under(vm.pod_dir(uid)) == [] and not os.path.exists(vm.pod_dir(uid))


# -------------------------------------------------------------------- downwardAPI


async def test_downward_api_files_follow_the_pod(vm, inprocess_client):
    await inprocess_client.create(NODES, {"metadata": {"name": "n1"}, "status": {
        "allocatable": {"cpu": "3", "memory": "2Gi"}}})
    pod = _pod([{"name": "info", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o600},
        {"path": "sub/note", "fieldRef": {"fieldPath": "metadata.annotations['note']"}},
        {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}},
        {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
    ]}}])
    await vm.setup(pod)
    d = vm.volume_dir(pod["metadata"]["uid"], "kubernetes.io~downward-api", "info")
    assert _read(os.path.join(d, "labels")) == 'app="web"\ntier="front"'
    assert _read(os.path.join(d, "name")) == "p"
    assert stat.S_IMODE(os.stat(os.path.join(d, "name")).st_mode) == 0o600
    assert _read(os.path.join(d, "sub", "note")) == 'say "hi"\n'
    assert _read(os.path.join(d, "cpu")) == "3" and _read(os.path.join(d, "mem")) == "2048"
    pod["metadata"]["labels"]["tier"] = "back"
    await vm.setup(pod)
    assert _read(os.path.join(d, "labels")) == 'app="web"\ntier="back"'

    with pytest.raises(VolumeError, match="unsupported fieldPath: status.podIP"):
        await vm.setup(_pod([{"name": "bad", "downwardAPI": {"items": [
            {"path": "ip", "fieldRef": {"fieldPath": "status.podIP"}}]}}]))


# ------------------------------------------------------------------------ emptyDir


async def test_empty_dirs(vm):
    pod = _pod([{"name": "disk", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "3Mi"}},
                {"name": "unused", "emptyDir": {}}],
               mounts=[{"name": "disk", "mountPath": "/d"}, {"name": "mem", "mountPath": "/m"}])
    await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    disk = vm.volume_dir(uid, "kubernetes.io~empty-dir", "disk")
    mem = vm.volume_dir(uid, "kubernetes.io~empty-dir", "mem")
    assert stat.S_IMODE(os.stat(disk).st_mode) == 0o777
    assert mounts_under(vm.pod_dir(uid)) == [mem]
    sv = os.statvfs(mem)
    assert sv.f_blocks * sv.f_frsize == 3 * 1024 * 1024
    assert not os.path.exists(vm.volume_dir(uid, "kubernetes.io~empty-dir", "unused"))
    with open(os.path.join(disk, "keep"), "w") as f:
        f.write("x")
    await vm.setup(pod)  # a second sync keeps the data
    assert _read(os.path.join(disk, "keep")) == "x"
    ms = vm.mounts(pod, pod["spec"]["containers"][0])
    assert [(m.container_path, m.readonly, m.propagation) for m in ms] == [
        ("/d", False, pb.PROPAGATION_PRIVATE), ("/m", False, pb.PROPAGATION_PRIVATE)]

    # the pod's memory limit is smaller than sizeLimit: it wins
    limited = _pod([{"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
                   containers=[{"name": "c", "image": "b", "resources": {"limits": {"memory": "2Mi"}},
                                "volumeMounts": [{"name": "mem", "mountPath": "/m"}]}])
    await vm.setup(limited)
    sv = os.statvfs(vm.volume_dir(limited["metadata"]["uid"], "kubernetes.io~empty-dir", "mem"))
    assert sv.f_blocks * sv.f_frsize == 2 * 1024 * 1024

    with pytest.raises(VolumeError, match='storage medium "HugePages-2Mi" is not supported on this node'):
        await vm.setup(_pod([{"name": "h", "emptyDir": {"medium": "HugePages-2Mi"}}]))


async def test_fs_group_owns_the_volumes(vm, inprocess_client):
    await inprocess_client.create(CMS, {"metadata": {"name": "cfg"}, "data": {"a": "1"}}, "default")
    pod = _pod([{"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 0o600}},
                {"name": "scratch", "emptyDir": {}}],
               securityContext={"fsGroup": 4321})
    await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    f = os.stat(os.path.join(vm.volume_dir(uid, "kubernetes.io~configmap", "cfg"), "a"))
    assert f.st_gid == 4321 and stat.S_IMODE(f.st_mode) == 0o640
    d = os.stat(vm.volume_dir(uid, "kubernetes.io~empty-dir", "scratch"))
    assert d.st_gid == 4321 and d.st_mode & stat.S_ISGID


# ------------------------------------------------------------------------ hostPath


async def test_host_path_types(vm, tmp_path):
    made = tmp_path / "host" / "made"
    afile = tmp_path / "host" / "f"
    pod = _pod([{"name": "d", "hostPath": {"path": str(made), "type": "DirectoryOrCreate"}},
                {"name": "f", "hostPath": {"path": str(afile), "type": "FileOrCreate"}},
                {"name": "any", "hostPath": {"path": "/nonexistent/at/all"}}])
    await vm.setup(pod)
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o755 and afile.is_file()
    ms = vm.mounts(pod, pod["spec"]["containers"][0])
    assert [m.host_path for m in ms] == [str(made), str(afile), "/nonexistent/at/all"]
    cases = [
        ({"path": str(afile), "type": "Directory"}, f"hostPath type check failed: {afile} is not a directory"),
        ({"path": str(made), "type": "File"}, f"hostPath type check failed: {made} is not a file"),
        ({"path": str(made), "type": "Socket"}, f"hostPath type check failed: {made} is not a socket file"),
        ({"path": "/dev/null", "type": "BlockDevice"}, "hostPath type check failed: /dev/null is not a block device"),
        ({"path": str(made), "type": "CharDevice"}, f"hostPath type check failed: {made} is not a character device"),
        ({"path": str(made), "type": "Weird"}, "Weird is an invalid volume type"),
        ({"path": "/a/../etc"}, "invalid HostPath `/a/../etc`: must not contain '..'"),
        ({"path": str(tmp_path / "no" / "dir" / "f"), "type": "FileOrCreate"},
         f"open {tmp_path / 'no' / 'dir' / 'f'}: no such file or directory"),
    ]
    for src, message in cases:
        with pytest.raises(VolumeError) as e:
            await vm.setup(_pod([{"name": "h", "hostPath": src}]))
        assert e.value.message == f'MountVolume.SetUp failed for volume "h" : {message}'
    await vm.setup(_pod([{"name": "h", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}]))


# ----------------------------------------------------------------------------- PVC


async def _bound_claim(client, name, pv_spec, *, volume_mode=None):
    claim = await client.create(PVCS, {"metadata": {"name": name}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
        **({"volumeMode": volume_mode} if volume_mode else {})}}, "default")
    await client.create(PVS, {"metadata": {"name": f"pv-{name}"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "claimRef": {"namespace": "default", "name": name, "uid": claim["metadata"]["uid"]}, **pv_spec}})
    claim["spec"]["volumeName"] = f"pv-{name}"
    claim = await client.update(PVCS, claim)
    claim["status"] = {"phase": "Bound"}
    return await client.update(PVCS, claim, subresource="status")


async def test_claims_of_local_and_host_path_volumes(vm, inprocess_client, tmp_path):
    await _bound_claim(inprocess_client, "data", {"csi": {"driver": "kubeplane.io/local", "volumeHandle": "pvc-123"}})
    hp = tmp_path / "hp"
    await _bound_claim(inprocess_client, "host", {"hostPath": {"path": str(hp), "type": "DirectoryOrCreate"}})
    pod = _pod([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "host", "persistentVolumeClaim": {"claimName": "host", "readOnly": True}}])
    await vm.setup(pod)
    ms = vm.mounts(pod, pod["spec"]["containers"][0])
    local = tmp_path / "local" / "pvc-123"
    assert local.is_dir() and stat.S_IMODE(local.stat().st_mode) == 0o777 and hp.is_dir()
    assert [(m.host_path, m.readonly) for m in ms] == [(str(local), False), (str(hp), True)]

    await inprocess_client.create(PVCS, {"metadata": {"name": "pending"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}, "default")
    for claim, text in (("pending", "PVC is not bound"),
                        ("gone", 'failed to fetch PVC from API server: persistentvolumeclaims "gone" not found')):
        with pytest.raises(VolumeError) as e:
            await vm.setup(_pod([{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]))
        assert e.value.message == (f"Unable to attach or mount volumes: unmounted volumes=[v], unattached "
                                   f"volumes=[v]: error processing PVC default/{claim}: {text}")
    await _bound_claim(inprocess_client, "nfs", {"nfs": {"server": "x", "path": "/"}})
    with pytest.raises(VolumeError, match="PV pv-nfs: nfs volumes are not supported on this node"):
        await vm.setup(_pod([{"name": "v", "persistentVolumeClaim": {"claimName": "nfs"}}]))
    await _bound_claim(inprocess_client, "blk", {"hostPath": {"path": str(tmp_path)}, "volumeMode": "Block"},
                       volume_mode="Block")
    with pytest.raises(VolumeError, match="volume v has volumeMode Block, but is specified in volumeMounts"):
        await vm.setup(_pod([{"name": "v", "persistentVolumeClaim": {"claimName": "blk"}}]))


# ------------------------------------------------------------------- mounts, subPath


async def test_sub_paths_are_bind_mounted_and_stay_inside(vm, inprocess_client, tmp_path):
    await inprocess_client.create(CMS, {"metadata": {"name": "cfg"}, "data": {"app.conf": "x=1"}}, "default")
    mounts = [{"name": "scratch", "mountPath": "/data", "subPath": "a/b"},
              {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
              {"name": "scratch", "mountPath": "/mine", "subPathExpr": "$(POD)/x"},
              {"name": "scratch", "mountPath": "/shared", "mountPropagation": "HostToContainer", "readOnly": True}]
    env = [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    pod = _pod([{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "cfg"}}],
               containers=[{"name": "c", "image": "b", "env": env, "volumeMounts": mounts}])
    await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    scratch = vm.volume_dir(uid, "kubernetes.io~empty-dir", "scratch")
    ms = vm.mounts(pod, pod["spec"]["containers"][0])
    sub = os.path.join(vm.pod_dir(uid), "volume-subpaths")
    assert [m.host_path for m in ms] == [f"{sub}/scratch/c/0", f"{sub}/cfg/c/1", f"{sub}/scratch/c/2", scratch]
    assert [m.readonly for m in ms] == [False, True, False, True]
    assert ms[3].propagation == pb.PROPAGATION_HOST_TO_CONTAINER
    assert os.path.isdir(os.path.join(scratch, "a", "b")) and os.path.isdir(os.path.join(scratch, "p", "x"))
    assert _read(ms[1].host_path) == "x=1"
    with open(os.path.join(ms[0].host_path, "through"), "w") as f:
        f.write("bind")
    assert _read(os.path.join(scratch, "a", "b", "through")) == "bind"
    vm.mounts(pod, pod["spec"]["containers"][0])  # a restarted container: the same mounts, made again
    assert len([p for p in mounts_under(sub)]) == 3

    # a symlink that leaves the volume is refused
    os.symlink("/etc", os.path.join(scratch, "escape"))
    bad = dict(pod["spec"]["containers"][0], volumeMounts=[{"name": "scratch", "mountPath": "/x", "subPath": "escape"}])
    with pytest.raises(VolumeError) as e:
        vm.mounts(pod, bad)
    assert e.value.reason == "CreateContainerConfigError"
    assert e.value.message == 'failed to prepare subPath for volumeMount "scratch" of container "c"'
    for m, text in (({"subPathExpr": "$(NOPE)"}, "missing value for NOPE"),
                    ({"subPath": "a/../../x"}, "unable to provision SubPath `a/../../x`: must not contain '..'"),
                    ({"mountPropagation": "Sideways"}, 'invalid MountPropagation mode: "Sideways"'),
                    ({"recursiveReadOnly": "Enabled", "readOnly": True},
                     'volume "scratch" requested recursive read-only mode, but it is not supported by the runtime')):
        c = dict(pod["spec"]["containers"][0], volumeMounts=[{"name": "scratch", "mountPath": "/x", **m}])
        with pytest.raises(VolumeError) as e:
            vm.mounts(pod, c)
        assert e.value.message == text
    with pytest.raises(VolumeError, match='cannot find volume "zzz" to mount into container "c"'):
        vm.mounts(pod, dict(pod["spec"]["containers"][0], volumeMounts=[{"name": "zzz", "mountPath": "/z"}]))
    await vm.teardown(uid)
    assert mounts_under(str(tmp_path)) == [] and not os.path.exists(vm.pod_dir(uid))


async def test_unsupported_volume_types_are_refused(vm):
    with pytest.raises(VolumeError) as e:
        await vm.setup(_pod([{"name": "n", "nfs": {"server": "s", "path": "/"}}]))
    assert e.value.message == 'MountVolume.SetUp failed for volume "n" : volume type nfs is not supported on this node'
    with pytest.raises(VolumeError) as e:
        await vm.setup(_pod([{"name": "a", "configMap": {"name": "x"}}, {"name": "ok", "emptyDir": {}},
                             {"name": "b", "secret": {"secretName": "y"}}]))
    assert e.value.messages == ['MountVolume.SetUp failed for volume "a" : configmap "x" not found',
                                'MountVolume.SetUp failed for volume "b" : secret "y" not found']
    assert e.value.message == "; ".join(e.value.messages)


async def test_empty_dir_usage_and_its_limit(vm):
    pod = _pod([{"name": "scratch", "emptyDir": {"sizeLimit": "64Ki"}}, {"name": "free", "emptyDir": {}}])
    await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    scratch = vm.volume_dir(uid, "kubernetes.io~empty-dir", "scratch")
    assert vm.empty_dir_limit_exceeded(pod) is None
    with open(os.path.join(scratch, "small"), "wb") as f:
        f.write(os.urandom(16 * 1024))
        f.flush()
        os.fsync(f.fileno())
    assert vm.empty_dir_limit_exceeded(pod) is None
    with open(os.path.join(scratch, "big"), "wb") as f:
        f.write(os.urandom(128 * 1024))
        f.flush()
        os.fsync(f.fileno())
    usage = vm.volume_usage(uid)
    assert usage["scratch"] >= 144 * 1024 and usage["free"] < 64 * 1024
    assert vm.empty_dir_limit_exceeded(pod) == 'Usage of EmptyDir volume "scratch" exceeds the limit "64Ki". '


async def test_a_source_gone_after_set_up_keeps_the_files_and_tells(inprocess_client, tmp_path):
    from kubeplane.client.events import EventRecorder

    recorder = EventRecorder(inprocess_client, "kubelet", host="n1")
    vm = VolumeManager(inprocess_client, str(tmp_path / "pods"), node_name="n1", resync_seconds=3600,
                       recorder=recorder)
    try:
        await inprocess_client.create(CMS, {"metadata": {"name": "cfg"}, "data": {"k": "v"}}, "default")
        pod = _pod([{"name": "cfg", "configMap": {"name": "cfg"}}])
        await vm.setup(pod)
        await inprocess_client.delete(CMS, "cfg", "default")
        await vm.refresh()
        await vm.setup(pod)  # the volume stays ready: the containers keep running with the files they have
        d = vm.volume_dir(pod["metadata"]["uid"], "kubernetes.io~configmap", "cfg")
        assert _read(os.path.join(d, "k")) == "v"
        assert vm.mounts(pod, pod["spec"]["containers"][0])[0].host_path == d
        await recorder.flush()
        events = (await inprocess_client.list(resource("events"), "default"))["items"]
        assert [(e["reason"], e["message"], e["type"]) for e in events] == [
            ("FailedMount", 'MountVolume.SetUp failed for volume "cfg" : configmap "cfg" not found', "Warning")]
        with pytest.raises(ValueError):
            await vm.teardown("../x")
    finally:
        await vm.close()
        await recorder.close()
        for uid in vm.pod_uids_on_disk():
            await vm.teardown(uid)


async def test_immutable_sources_are_read_once(vm, inprocess_client):
    await inprocess_client.create(CMS, {"metadata": {"name": "fixed"}, "data": {"k": "1"}, "immutable": True},
                                  "default")
    await inprocess_client.create(CMS, {"metadata": {"name": "moving"}, "data": {"k": "1"}}, "default")
    pod = _pod([{"name": "fixed", "configMap": {"name": "fixed"}}, {"name": "moving", "configMap": {"name": "moving"}}])
    await vm.setup(pod)
    uid = pod["metadata"]["uid"]
    # an immutable ConfigMap can only be deleted and made again: the node keeps what it read
    await inprocess_client.delete(CMS, "fixed", "default")
    await inprocess_client.create(CMS, {"metadata": {"name": "fixed"}, "data": {"k": "2"}}, "default")
    await inprocess_client.patch(CMS, "moving", {"data": {"k": "2"}}, "default")
    await vm.refresh()
    assert _read(os.path.join(vm.volume_dir(uid, "kubernetes.io~configmap", "fixed"), "k")) == "1"
    assert _read(os.path.join(vm.volume_dir(uid, "kubernetes.io~configmap", "moving"), "k")) == "2"
    await vm.teardown(uid)
    other = _pod([{"name": "fixed", "configMap": {"name": "fixed"}}])
    await vm.setup(other)  # no pod of the namespace left in between: read again
    assert _read(os.path.join(vm.volume_dir(other["metadata"]["uid"], "kubernetes.io~configmap", "fixed"), "k")) == "2"


async def test_generic_ephemeral_volume_claims_must_belong_to_the_pod(vm, inprocess_client, tmp_path):
    pod = _pod([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}], name="eph")
    claim = await _bound_claim(inprocess_client, "eph-scratch", {"csi": {"driver": "kubeplane.io/local",
                                                                         "volumeHandle": "pvc-eph"}})
    with pytest.raises(VolumeError) as e:
        await vm.setup(pod)
    assert e.value.message == "PVC default/eph-scratch was not created for pod default/eph (pod is not owner)"
    claim["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "eph",
                                             "uid": pod["metadata"]["uid"], "controller": True}]
    await inprocess_client.update(PVCS, claim)
    await vm.setup(pod)
    [m] = vm.mounts(pod, pod["spec"]["containers"][0])
    assert m.host_path == str(tmp_path / "local" / "pvc-eph") and not m.readonly


async def test_fs_group_on_claims_and_its_change_policy(vm, inprocess_client, tmp_path):
    await _bound_claim(inprocess_client, "data", {"csi": {"driver": "kubeplane.io/local", "volumeHandle": "pvc-fs"}})
    local = tmp_path / "local" / "pvc-fs"

    def pod(policy=None):
        sc = {"fsGroup": 555, **({"fsGroupChangePolicy": policy} if policy else {})}
        return _pod([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}], securityContext=sc)

    await vm.setup(pod())
    assert local.stat().st_gid == 555 and local.stat().st_mode & stat.S_ISGID
    (local / "f").write_text("x")
    os.chown(local / "f", -1, 0)
    await vm.setup(pod("OnRootMismatch"))  # the root is right: nothing below it is looked at
    assert (local / "f").stat().st_gid == 0
    await vm.setup(pod("Always"))
    assert (local / "f").stat().st_gid == 555 and stat.S_IMODE((local / "f").stat().st_mode) & 0o660 == 0o660
    ro = _pod([{"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}],
              securityContext={"fsGroup": 777})
    await vm.setup(ro)  # read-only: the volume's ownership is left alone
    assert local.stat().st_gid == 555 and vm.mounts(ro, ro["spec"]["containers"][0])[0].readonly
