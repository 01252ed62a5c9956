"""Tests for the Kubernetes protobuf request-body decoder (schema driven).

The ``data/protobuf`` fixtures are real bodies captured from kubectl v1.32;
see ``data/protobuf/README.md``. Fields that kubectl's generators never send
(env, volumes, probes, timestamps, ...) are covered with bodies built by the
small encoder below.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubeplane.api import protobuf
from kubeplane.api.errors import StatusError
from kubeplane.api.protobuf import encode_varint as _varint

DATA = Path(__file__).parent / "data" / "protobuf"
FIXTURES = sorted(p.stem for p in DATA.glob("*.pb"))


# --------------------------------------------------------------------------------------------
# A minimal encoder, for tests only.


def vi(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def st(number: int, text: str) -> bytes:
    return ld(number, text.encode())


def msg(number: int, *parts: bytes) -> bytes:
    return ld(number, b"".join(parts))


def entry(number: int, key: str, value: bytes | str) -> bytes:
    payload = value.encode() if isinstance(value, str) else value
    return msg(number, st(1, key), ld(2, payload))


def envelope(api_version: str, kind: str, raw: bytes, encoding: str = "") -> bytes:
    body = msg(1, st(1, api_version), st(2, kind)) + ld(2, raw) + st(3, encoding) + st(4, "")
    return protobuf.MAGIC + body


def quantity(number: int, text: str) -> bytes:
    return msg(number, st(1, text))


def int_or_str(number: int, value: int | str) -> bytes:
    if isinstance(value, int):
        return msg(number, vi(1, 0), vi(2, value), st(3, ""))
    return msg(number, vi(1, 1), vi(2, 0), st(3, value))


def load(name: str) -> bytes:
    return (DATA / f"{name}.pb").read_bytes()


def expect_status(exc: pytest.ExceptionInfo[StatusError], code: int, reason: str) -> str:
    assert exc.value.code == code
    assert exc.value.reason == reason
    return exc.value.message


# --------------------------------------------------------------------------------------------
# Captured kubectl bodies


def test_all_generator_fixtures_present() -> None:
    required = {"namespace", "configmap", "secret", "deployment", "service", "job", "pdb", "priorityclass"}
    assert required <= set(FIXTURES)


@pytest.mark.parametrize("name", FIXTURES)
def test_captured_body_matches_kubectl_json(name: str) -> None:
    expected = json.loads((DATA / f"{name}.json").read_text())
    assert protobuf.decode(load(name)) == expected


@pytest.mark.parametrize("name", FIXTURES)
def test_captured_body_is_protobuf_envelope(name: str) -> None:
    assert load(name).startswith(b"k8s\x00")


def test_namespace() -> None:
    assert protobuf.decode(load("namespace")) == {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "demo"}, "spec": {}, "status": {},
    }


def test_configmap_literals() -> None:
    assert protobuf.decode(load("configmap")) == {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg"}, "data": {"a": "1", "b": "hello"},
    }


def test_secret_data_is_base64() -> None:
    obj = protobuf.decode(load("secret"))
    assert obj == {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
        "data": {"pass": "czNjcjN0IQ==", "user": "YWRtaW4="},
    }


def test_deployment_full_shape() -> None:
    assert protobuf.decode(load("deployment")) == {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "nginx", "image": "nginx", "ports": [{"containerPort": 80}], "resources": {},
                }]},
            },
            "strategy": {},
        },
        "status": {},
    }


def test_service_target_port_int_and_named() -> None:
    clusterip = protobuf.decode(load("service"))
    assert clusterip["spec"]["ports"] == [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}]
    assert clusterip["spec"]["type"] == "ClusterIP"
    nodeport = protobuf.decode(load("service_nodeport"))
    assert nodeport["spec"]["ports"] == [
        {"name": "80-http", "protocol": "TCP", "port": 80, "targetPort": "http", "nodePort": 30080},
    ]


def test_pdb_int_and_percent() -> None:
    assert protobuf.decode(load("pdb"))["spec"]["minAvailable"] == 2
    pct = protobuf.decode(load("pdb_pct"))
    assert pct["spec"]["maxUnavailable"] == "50%"
    # Fields without omitempty keep their zero values, as in JSON.
    assert pct["status"] == {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}


def test_priorityclass() -> None:
    assert protobuf.decode(load("priorityclass")) == {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"},
        "value": 1000, "description": "high prio", "preemptionPolicy": "PreemptLowerPriority",
    }


def test_job_command_and_restart_policy() -> None:
    spec = protobuf.decode(load("job"))["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["command"] == ["perl", "-Mbignum=bpi", "-wle", "print bpi(20)"]


# --------------------------------------------------------------------------------------------
# Encoded bodies for fields the generators never send

OBJECT_META = msg(
    1,
    st(1, "rich"), st(2, ""), st(3, "team"), st(5, "u-1"), st(6, ""), vi(7, 0),
    msg(8, vi(1, 1767225600), vi(2, 0)),  # creationTimestamp 2026-01-01T00:00:00Z
    msg(9),  # zero deletionTimestamp: omitted
    entry(11, "app", "rich"), entry(11, "tier", ""),
    entry(12, "note", "x"),
    msg(13, st(1, "ReplicaSet"), st(3, "rs-1"), st(4, "u-0"), st(5, "apps/v1"), vi(6, 1)),
    st(14, "example.com/guard"),
    msg(17, st(1, "kubectl"), st(2, "Update"), st(3, "apps/v1"), msg(4, vi(1, 1767225600)),
        st(6, "FieldsV1"), msg(7, st(1, '{"f:metadata":{}}'))),
)

CONTAINER = msg(
    2,
    st(1, "app"), st(2, "example/app:1"), st(3, "run"), st(4, "--port"), st(4, "8080"), st(5, ""),
    msg(6, st(1, "http"), vi(3, 8080), st(4, "TCP")),
    msg(7, st(1, "MODE"), st(2, "prod")),
    msg(7, st(1, "POD_IP"), msg(3, msg(1, st(1, "v1"), st(2, "status.podIP")))),
    msg(7, st(1, "PASSWORD"), msg(3, msg(4, msg(1, st(1, "creds")), st(2, "pass"), vi(3, 0)))),
    msg(8, entry(1, "cpu", st(1, "500m")), entry(2, "memory", st(1, "128Mi"))),
    msg(9, st(1, "config"), vi(2, 1), st(3, "/etc/app")),
    msg(10, msg(1, msg(2, st(1, "/healthz"), int_or_str(2, "http"), st(4, "HTTP"))), vi(2, 5), vi(4, 10)),
    msg(11, msg(1, msg(3, int_or_str(1, 8080)))),
    st(14, "IfNotPresent"),
    msg(15),  # empty securityContext is kept as {}
    vi(16, 0), vi(17, 0), vi(18, 0), st(20, ""),
    msg(19, st(1, "CFG_"), msg(2, msg(1, st(1, "settings")))),
)

POD_SPEC = msg(
    2,
    msg(1, st(1, "config"), msg(2, msg(19, msg(1, st(1, "settings")), vi(3, 0o644)))),
    msg(1, st(1, "scratch"), msg(2, msg(2, st(1, "Memory"), quantity(2, "1Gi")))),
    msg(1, st(1, "token"), msg(2, msg(6, st(1, "tok"), msg(2, st(1, "k"), st(2, "p"))))),
    CONTAINER,
    st(3, "Always"), vi(4, 0), st(6, "ClusterFirst"), entry(7, "disk", "ssd"),
    st(8, "runner"), vi(11, 0),
    msg(14, ld(4, _varint(1000)), vi(2, 1000)),  # supplementalGroups in packed form
    st(19, "default-scheduler"),
    msg(22, st(1, "dedicated"), st(2, "Equal"), st(3, "batch"), st(4, "NoExecute"), vi(5, 300)),
    vi(21, 0), vi(25, (1 << 64) - 5),  # automountServiceAccountToken=false, priority=-5
)

RICH_DEPLOYMENT = b"".join([
    OBJECT_META,
    msg(2,
        vi(1, 0),  # replicas: 0 is a pointer value and must survive
        msg(2, msg(2, st(1, "app"), st(2, "In"), st(3, "rich"), st(3, "alt"))),
        msg(3, msg(1, entry(11, "app", "rich")), POD_SPEC),
        msg(4, st(1, "RollingUpdate"), msg(2, int_or_str(1, "25%"), int_or_str(2, 1))),
        vi(5, 0), vi(6, 10), vi(7, 0), vi(9, 600)),
    msg(3, vi(1, 4), vi(2, 1), vi(7, 1),
        msg(6, st(1, "Available"), st(2, "True"), st(4, "MinimumReplicasAvailable"), st(5, "ok"),
            msg(6, vi(1, 1767225600)), msg(7, vi(1, 1767225661)))),
])


def test_rich_deployment() -> None:
    obj = protobuf.decode(envelope("apps/v1", "Deployment", RICH_DEPLOYMENT))
    assert obj["metadata"] == {
        "name": "rich", "namespace": "team", "uid": "u-1",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": {"app": "rich", "tier": ""},
        "annotations": {"note": "x"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "rs-1", "uid": "u-0", "apiVersion": "apps/v1",
                             "controller": True}],
        "finalizers": ["example.com/guard"],
        "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "apps/v1",
                           "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:metadata": {}}}],
    }
    spec = obj["spec"]
    assert spec["replicas"] == 0
    assert spec["selector"] == {"matchExpressions": [{"key": "app", "operator": "In", "values": ["rich", "alt"]}]}
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 1}}
    assert spec["revisionHistoryLimit"] == 10 and spec["progressDeadlineSeconds"] == 600
    assert "minReadySeconds" not in spec and "paused" not in spec
    pod = spec["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "config", "configMap": {"name": "settings", "defaultMode": 420}},
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "token", "secret": {"secretName": "tok", "items": [{"key": "k", "path": "p"}]}},
    ]
    assert pod["containers"] == [{
        "name": "app", "image": "example/app:1", "command": ["run"], "args": ["--port", "8080"],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": [
            {"name": "MODE", "value": "prod"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pass", "optional": False}}},
        ],
        "resources": {"limits": {"cpu": "500m"}, "requests": {"memory": "128Mi"}},
        "volumeMounts": [{"name": "config", "readOnly": True, "mountPath": "/etc/app"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                          "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {"tcpSocket": {"port": 8080}},
        "imagePullPolicy": "IfNotPresent",
        "securityContext": {},
        "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
    }]
    assert pod["restartPolicy"] == "Always"
    assert pod["terminationGracePeriodSeconds"] == 0
    assert pod["dnsPolicy"] == "ClusterFirst"
    assert pod["nodeSelector"] == {"disk": "ssd"}
    assert pod["serviceAccountName"] == "runner"
    assert "hostNetwork" not in pod
    assert pod["securityContext"] == {"supplementalGroups": [1000], "runAsUser": 1000}
    assert pod["schedulerName"] == "default-scheduler"
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "batch",
                                   "effect": "NoExecute", "tolerationSeconds": 300}]
    assert pod["automountServiceAccountToken"] is False
    assert pod["priority"] == -5
    assert obj["status"] == {
        "observedGeneration": 4, "replicas": 1, "readyReplicas": 1,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                        "message": "ok", "lastUpdateTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:01:01Z"}],
    }


def test_configmap_binary_data_and_immutable() -> None:
    raw = msg(1, st(1, "bin")) + entry(2, "k", "") + entry(3, "blob", b"\x00\xff\x10") + vi(4, 0)
    obj = protobuf.decode(envelope("v1", "ConfigMap", raw))
    assert obj == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bin"},
                   "data": {"k": ""}, "binaryData": {"blob": "AP8Q"}, "immutable": False}


def test_map_entry_without_value_field_is_zero_value() -> None:
    raw = msg(1, st(1, "s")) + msg(2, st(1, "empty")) + st(3, "Opaque") + msg(4, st(1, "plain"))
    obj = protobuf.decode(envelope("v1", "Secret", raw))
    assert obj["data"] == {"empty": ""}
    assert obj["stringData"] == {"plain": ""}
    assert obj["type"] == "Opaque"


def test_job_pointer_zeroes_survive() -> None:
    raw = msg(2, vi(1, 0), vi(2, 3), vi(7, 0), vi(10, 1),
              msg(6, msg(1), msg(2, msg(2, st(1, "c"), st(2, "busybox")), st(3, "OnFailure"))))
    spec = protobuf.decode(envelope("batch/v1", "Job", raw))["spec"]
    assert spec["parallelism"] == 0 and spec["completions"] == 3
    assert spec["backoffLimit"] == 0 and spec["suspend"] is True
    assert spec["template"] == {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                                         "restartPolicy": "OnFailure"}}


def test_pod_kind_is_supported() -> None:
    raw = msg(1, st(1, "p")) + msg(2, msg(2, st(1, "c"), st(2, "nginx"))) + msg(3, st(1, "Pending"))
    assert protobuf.decode(envelope("v1", "Pod", raw)) == {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}, "status": {"phase": "Pending"},
    }


def test_unknown_fields_are_skipped() -> None:
    raw = msg(1, st(1, "ns"), st(99, "future")) + vi(77, 5) + ld(78, b"\x01\x02") + msg(2)
    raw += _varint(79 << 3 | 1) + b"\x00" * 8 + _varint(80 << 3 | 5) + b"\x00" * 4
    assert protobuf.decode(envelope("v1", "Namespace", raw)) == {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}, "spec": {},
    }


def test_empty_raw_gives_type_meta_only() -> None:
    assert protobuf.decode(envelope("v1", "Namespace", b"")) == {"apiVersion": "v1", "kind": "Namespace"}


def test_decode_message_generic_table() -> None:
    table: protobuf.Table = {1: protobuf.s("name"), 2: protobuf.i64("count", keep=True), 3: protobuf.rs("tags")}
    assert protobuf.decode_message(st(1, "x") + vi(2, 0) + st(3, "a") + st(3, "b"), table) == {
        "name": "x", "count": 0, "tags": ["a", "b"],
    }


def test_register_adds_a_kind() -> None:
    key = ("example.com/v1", "Widget")
    assert key not in protobuf.KINDS
    protobuf.register("example.com/v1", "Widget", {1: protobuf.m("metadata", protobuf.OBJECT_META)})
    try:
        assert protobuf.decode(envelope(*key, msg(1, st(1, "w")))) == {
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
        }
    finally:
        del protobuf.KINDS[key]


# --------------------------------------------------------------------------------------------
# Schema-driven kinds: DeleteOptions, Eviction and every served kind


def test_delete_options_from_kubectl_drain() -> None:
    # Captured from `kubectl drain --grace-period=0` and `--grace-period=5`: a pointer
    # field set to zero is encoded and must survive.
    assert protobuf.decode(load("deleteoptions_drain")) == {
        "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    assert protobuf.decode(load("deleteoptions_grace"))["gracePeriodSeconds"] == 5


def test_delete_options_full_and_in_any_group_version() -> None:
    raw = (vi(1, 30) + msg(2, st(1, "uid-1"), st(2, "7")) + vi(3, 0) + st(4, "Foreground")
           + st(5, "All") + vi(6, 1))
    expected = {"gracePeriodSeconds": 30, "preconditions": {"uid": "uid-1", "resourceVersion": "7"},
                "orphanDependents": False, "propagationPolicy": "Foreground", "dryRun": ["All"],
                "ignoreStoreReadErrorWithClusterBreakingPotential": True}
    for api_version in ("v1", "apps/v1", "meta.k8s.io/v1", "batch/v1"):
        assert protobuf.decode(envelope(api_version, "DeleteOptions", raw)) == {
            "apiVersion": api_version, "kind": "DeleteOptions", **expected}


def test_eviction() -> None:
    raw = msg(1, st(1, "web-0"), st(3, "default")) + msg(2, vi(1, 0), st(4, "Background"))
    assert protobuf.decode(envelope("policy/v1", "Eviction", raw)) == {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-0", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 0, "propagationPolicy": "Background"},
    }


def test_pod_from_kubectl_debug_copy_to() -> None:
    assert protobuf.decode(load("pod_debug_copy")) == json.loads((DATA / "pod_debug_copy.json").read_text())


def test_every_served_kind_has_a_table() -> None:
    from kubeplane.api.resources import RESOURCES

    for r in RESOURCES:
        if not {"create", "update", "patch"} & set(r.verbs):
            continue  # read-only kinds (the resource metrics) take no request bodies
        assert protobuf.kind_table(r.api_version, r.kind) is not None, r.kind
        if "list" in r.verbs:  # create-only kinds (the reviews) have no list kind
            assert protobuf.kind_table(r.api_version, r.list_kind) is not None, r.list_kind
        else:
            assert protobuf.kind_table(r.api_version, r.list_kind) is None, r.list_kind
    for api_version, kind in (("v1", "Binding"), ("autoscaling/v1", "Scale"), ("policy/v1", "Eviction")):
        assert protobuf.kind_table(api_version, kind) is not None, kind


def test_binding_from_a_client_go_scheduler() -> None:
    raw = msg(1, st(1, "p"), st(3, "default"), st(5, "u1")) + msg(2, st(1, "Node"), st(3, "n1"))
    assert protobuf.decode(envelope("v1", "Binding", raw)) == {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "target": {"kind": "Node", "name": "n1"},
    }


def test_storage_class_and_pv_inline_volume_source() -> None:
    raw = (msg(1, st(1, "fast")) + st(2, "csi.example.com") + entry(3, "type", "ssd")
           + st(4, "Delete") + st(5, "discard") + vi(6, 1) + st(7, "WaitForFirstConsumer"))
    assert protobuf.decode(envelope("storage.k8s.io/v1", "StorageClass", raw)) == {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fast"},
        "provisioner": "csi.example.com", "parameters": {"type": "ssd"}, "reclaimPolicy": "Delete",
        "mountOptions": ["discard"], "allowVolumeExpansion": True, "volumeBindingMode": "WaitForFirstConsumer",
    }
    # PersistentVolumeSpec embeds PersistentVolumeSource (field 2) inline; capacity is a Quantity map.
    spec = msg(2, entry(1, "storage", st(1, "5Gi")),
               msg(2, msg(3, st(1, "/data"), st(2, "DirectoryOrCreate"))),
               st(3, "ReadWriteOnce"), st(5, "Retain"), st(6, "fast"))
    obj = protobuf.decode(envelope("v1", "PersistentVolume", msg(1, st(1, "pv1")) + spec))
    assert obj["spec"] == {"capacity": {"storage": "5Gi"}, "hostPath": {"path": "/data", "type": "DirectoryOrCreate"},
                           "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
                           "storageClassName": "fast"}


def test_lease_micro_time_and_resource_claim() -> None:
    raw = msg(1, st(1, "l")) + msg(2, st(1, "holder"), vi(2, 15), msg(3, vi(1, 1_700_000_000), vi(2, 123_456_000)))
    assert protobuf.decode(envelope("coordination.k8s.io/v1", "Lease", raw))["spec"] == {
        "holderIdentity": "holder", "leaseDurationSeconds": 15, "acquireTime": "2023-11-14T22:13:20.123456Z"}
    request = msg(1, st(1, "gpu"), msg(2, st(1, "gpu.example.com"), st(3, "ExactCount"), vi(4, 2)))
    claim = msg(1, st(1, "c")) + msg(2, msg(1, request))
    assert protobuf.decode(envelope("resource.k8s.io/v1", "ResourceClaim", claim))["spec"] == {
        "devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.example.com", "allocationMode": "ExactCount", "count": 2}}]}}


def test_schema_data_matches_upstream_field_numbers() -> None:
    # Spot checks against upstream's generated.proto.
    pod_spec = protobuf.message_table("k8s.io.api.core.v1.PodSpec")
    assert (pod_spec[2].name, pod_spec[10].name, pod_spec[34].name) == ("containers", "nodeName", "ephemeralContainers")
    volume = protobuf.message_table("k8s.io.api.core.v1.Volume")
    assert volume[2].type == protobuf.INLINE
    meta = protobuf.message_table("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta")
    assert meta[9].type == protobuf.TIME and meta[17].repeated


# --------------------------------------------------------------------------------------------
# Errors


def test_bad_magic() -> None:
    with pytest.raises(StatusError) as exc:
        protobuf.decode(b'{"kind":"Namespace"}')
    assert "magic" in expect_status(exc, 400, "BadRequest")


def test_truncated_varint() -> None:
    body = protobuf.MAGIC + _varint(3 << 3) + b"\x80\x80"
    with pytest.raises(StatusError) as exc:
        protobuf.decode(body)
    assert "truncated varint" in expect_status(exc, 400, "BadRequest")


def test_truncated_capture() -> None:
    body = load("deployment")
    with pytest.raises(StatusError) as exc:
        protobuf.decode(body[:-10])
    assert "truncated" in expect_status(exc, 400, "BadRequest")


def test_truncated_nested_message() -> None:
    raw = msg(1, st(1, "x"))[:-1]
    with pytest.raises(StatusError) as exc:
        protobuf.decode(envelope("v1", "Namespace", raw))
    assert "truncated" in expect_status(exc, 400, "BadRequest")


def test_wrong_wire_type() -> None:
    raw = msg(1, vi(1, 7))  # metadata.name as a varint instead of a string
    with pytest.raises(StatusError) as exc:
        protobuf.decode(envelope("v1", "Namespace", raw))
    message = expect_status(exc, 400, "BadRequest")
    assert "metadata.name" in message and "wire type 0" in message


def test_invalid_wire_type_number() -> None:
    body = protobuf.MAGIC + _varint(2 << 3 | 3)  # group start: not supported
    with pytest.raises(StatusError) as exc:
        protobuf.decode(body)
    assert "wire type 3" in expect_status(exc, 400, "BadRequest")


def test_invalid_utf8_string() -> None:
    raw = msg(1, ld(1, b"\xff\xfe"))
    with pytest.raises(StatusError) as exc:
        protobuf.decode(envelope("v1", "Namespace", raw))
    assert "UTF-8" in expect_status(exc, 400, "BadRequest")


def test_content_encoding_rejected() -> None:
    with pytest.raises(StatusError) as exc:
        protobuf.decode(envelope("v1", "Namespace", b"", encoding="gzip"))
    assert "gzip" in expect_status(exc, 400, "BadRequest")


def test_unsupported_kind_is_415() -> None:
    # Custom resources have no protobuf form (as upstream).
    with pytest.raises(StatusError) as exc:
        protobuf.decode(envelope("example.com/v1", "Widget", msg(1, st(1, "w"))))
    message = expect_status(exc, 415, "UnsupportedMediaType")
    assert "Widget" in message and "protobuf is not supported" in message
    assert "application/json" in message
    assert exc.value.to_status()["code"] == 415


def test_errors_are_status_errors_not_python_errors() -> None:
    body = load("secret")
    # Every prefix of a valid body either decodes or raises a StatusError.
    for cut in range(len(protobuf.MAGIC), len(body)):
        try:
            result: Any = protobuf.decode(body[:cut])
        except StatusError as exc:
            assert exc.code in (400, 415)
        else:
            assert isinstance(result, dict)


# --------------------------------------------------------------------------------------------
# Content types


@pytest.mark.parametrize("content_type, expected", [
    ("application/vnd.kubernetes.protobuf", True),
    ("application/vnd.kubernetes.protobuf; charset=utf-8", True),
    ("Application/VND.Kubernetes.Protobuf", True),
    ("application/vnd.kubernetes.protobuf;stream=watch", True),
    ("application/json", False),
    ("application/merge-patch+json", False),
    ("", False),
    (None, False),
])
def test_is_protobuf(content_type: str | None, expected: bool) -> None:
    assert protobuf.is_protobuf(content_type) is expected
