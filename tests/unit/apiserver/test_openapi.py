"""OpenAPI v3 documents and strict field validation."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver import openapi
from kubeplane.apiserver.openapi import check_fields, enforce, v3_document, v3_index

SCHEMA_PREFIX = "#/components/schemas/"


def _pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": "default",
            "labels": {"app": "web", "tier": "frontend"},
            "annotations": {"note": "x"},
            "creationTimestamp": None,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
                 "uid": "u1", "controller": True},
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "web",
                    "image": "nginx:1.27",
                    "command": ["nginx", "-g", "daemon off;"],
                    "env": [{"name": "A", "value": "1"},
                            {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "128Mi"},
                                  "requests": {"cpu": 0.25, "memory": 64000000}},
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"},
                                       "periodSeconds": 5},
                    "livenessProbe": {"tcpSocket": {"port": 80}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
            ],
            "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}],
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
            "terminationGracePeriodSeconds": 30,
            "restartPolicy": "Always",
        },
        "status": {},
    }


# ------------------------------------------------------------------ documents


def test_index_lists_every_served_group_version_with_stable_hash() -> None:
    index = v3_index()
    keys = set(index["paths"])
    expected = {("api/" + v) if not g else f"apis/{g}/{v}" for g, v in CATALOGUE.group_versions()}
    assert keys == expected
    url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/apps/v1?hash=")
    assert len(url.split("hash=")[1]) == 128
    assert v3_index() == index
    plain = v3_index(base_url_hash_ok=False)
    assert plain["paths"]["api/v1"]["serverRelativeURL"] == "/openapi/v3/api/v1"


def test_unknown_group_version_has_no_document() -> None:
    assert v3_document("apps", "v1beta1") is None
    assert v3_document("nope.example.com", "v1") is None
    assert openapi.v3_document_bytes("nope.example.com", "v1") is None


def test_apps_document_has_patch_with_field_validation_and_gvk() -> None:
    doc = v3_document("apps", "v1")
    assert doc is not None
    assert doc["openapi"] == "3.0.0"
    op = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert op["x-kubernetes-group-version-kind"] == {"group": "apps", "kind": "Deployment", "version": "v1"}
    assert op["x-kubernetes-action"] == "patch"
    names = {p["name"] for p in op["parameters"]}
    assert {"fieldValidation", "dryRun", "fieldManager", "force"} <= names
    assert "application/strategic-merge-patch+json" in op["requestBody"]["content"]
    scale = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"]["put"]
    assert scale["x-kubernetes-group-version-kind"] == {"group": "autoscaling", "kind": "Scale", "version": "v1"}
    post = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments"]["post"]
    assert "fieldValidation" in {p["name"] for p in post["parameters"]}


def test_every_kind_has_a_patch_operation_with_field_validation() -> None:
    for group, version in CATALOGUE.group_versions():
        doc = v3_document(group, version)
        assert doc is not None
        found = set()
        for ops in doc["paths"].values():
            patch = ops.get("patch")
            if patch and any(p["name"] == "fieldValidation" for p in patch["parameters"]):
                found.add(patch["x-kubernetes-group-version-kind"]["kind"])
        # create-only kinds (the reviews) have no patch
        kinds = {r.kind for r in CATALOGUE.in_group_version(group, version) if "patch" in r.verbs}
        assert kinds <= found, (group, version, kinds - found)
        assert not found & {r.kind for r in CATALOGUE.in_group_version(group, version) if "patch" not in r.verbs}


def test_create_only_kinds_have_one_post_and_the_token_subresource_is_documented() -> None:
    doc = v3_document("authentication.k8s.io", "v1")
    assert doc is not None
    assert set(doc["paths"]) == {"/apis/authentication.k8s.io/v1/tokenreviews",
                                 "/apis/authentication.k8s.io/v1/selfsubjectreviews"}
    assert set(doc["paths"]["/apis/authentication.k8s.io/v1/tokenreviews"]) == {"parameters", "post"}
    core = v3_document("", "v1")
    token = core["paths"]["/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"]["post"]
    assert token["x-kubernetes-group-version-kind"] == {"group": "authentication.k8s.io", "kind": "TokenRequest",
                                                        "version": "v1"}
    assert "io.k8s.api.authentication.v1.TokenRequest" in core["components"]["schemas"]


def test_operations_are_well_formed() -> None:
    """Every parameter has a typed schema and every operation a GVK, action and responses."""
    for group, version in CATALOGUE.group_versions():
        doc = v3_document(group, version)
        assert doc is not None
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                params = op if method == "parameters" else op["parameters"]
                for param in params:
                    assert param["in"] in ("query", "path"), (path, param)
                    assert isinstance(param["schema"], dict), (path, method, param)
                    assert param["schema"]["type"] in ("string", "integer", "boolean")
                if method == "parameters":
                    continue
                assert method in ("get", "put", "post", "patch", "delete"), (path, method)
                assert set(op["x-kubernetes-group-version-kind"]) == {"group", "version", "kind"}
                assert op["x-kubernetes-action"]
                assert "200" in op["responses"]


def test_components_are_closed_under_refs_and_carry_gvk() -> None:
    doc = v3_document("", "v1")
    assert doc is not None
    comps = doc["components"]["schemas"]
    pod = comps["io.k8s.api.core.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Pod", "version": "v1"}]
    assert pod["properties"]["spec"]["allOf"][0]["$ref"] == SCHEMA_PREFIX + "io.k8s.api.core.v1.PodSpec"
    assert "description" in pod and pod["type"] == "object"
    container = comps["io.k8s.api.core.v1.Container"]
    assert container["required"] == ["name"]
    assert container["properties"]["image"]["type"] == "string"

    refs: set[str] = set()
    openapi._refs(doc, refs)
    assert refs <= set(comps), refs - set(comps)
    # apps/v1 documents do not drag in unrelated groups
    apps = v3_document("apps", "v1")
    assert apps is not None
    assert not any(".resource.v1." in n for n in apps["components"]["schemas"])
    assert "io.k8s.api.core.v1.PodSpec" in apps["components"]["schemas"]


def test_special_types_follow_upstream_shapes() -> None:
    comps = openapi.schemas()
    assert comps[openapi.INT_OR_STRING]["x-kubernetes-int-or-string"] is True
    assert comps[openapi.TIME] == {**comps[openapi.TIME], "type": "string", "format": "date-time"}
    assert {"type": "string"} in comps[openapi.QUANTITY]["oneOf"]
    limits = comps["io.k8s.api.core.v1.ResourceRequirements"]["properties"]["limits"]
    assert limits["additionalProperties"]["$ref"] == SCHEMA_PREFIX + openapi.QUANTITY
    raw = comps["io.k8s.apimachinery.pkg.runtime.RawExtension"]
    assert raw["x-kubernetes-preserve-unknown-fields"] is True
    secret = comps["io.k8s.api.core.v1.Secret"]["properties"]["data"]
    assert secret["additionalProperties"] == {"type": "string", "format": "byte"}
    lease = comps["io.k8s.api.coordination.v1.LeaseSpec"]["properties"]["renewTime"]
    assert lease["allOf"][0]["$ref"] == SCHEMA_PREFIX + openapi.MICRO_TIME


def test_resource_v1_kinds_present() -> None:
    for kind in ("ResourceClaim", "ResourceClaimTemplate", "ResourceSlice", "DeviceClass"):
        name = openapi.schema_name("resource.k8s.io", "v1", kind)
        assert name == f"io.k8s.api.resource.v1.{kind}"
    request = openapi.schemas()["io.k8s.api.resource.v1.DeviceRequest"]
    assert request["required"] == ["name"]
    assert v3_document("resource.k8s.io", "v1") is not None


def test_document_is_a_copy() -> None:
    doc = v3_document("", "v1")
    assert doc is not None
    doc["paths"].clear()
    again = v3_document("", "v1")
    assert again is not None and again["paths"]


def test_data_file_matches_generator() -> None:
    pytest.importorskip("kubernetes")
    from kubeplane.apiserver import gen_schemas

    assert gen_schemas.main(["--check"]) == 0


# ------------------------------------------------------------------ validation


def test_valid_pod_has_no_problems() -> None:
    assert check_fields(_pod(), "", "v1", "Pod") == []


def test_unknown_fields_in_nested_lists_and_maps() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["imagePullpolicy"] = "Always"
    pod["spec"]["containers"][0]["ports"][0]["bogus"] = 1
    pod["spec"]["volumes"][0]["emptyDir"]["x"] = True
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["extra"] = "y"
    pod["metadata"]["ownerReferences"][0]["oops"] = 1
    pod["top"] = 1
    problems = check_fields(pod, "", "v1", "Pod")
    assert problems == [
        'unknown field "metadata.ownerReferences[0].oops"',
        'unknown field "spec.containers[0].ports[0].bogus"',
        'unknown field "spec.containers[0].imagePullpolicy"',
        'unknown field "spec.volumes[0].emptyDir.x"',
        'unknown field "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution'
        '.nodeSelectorTerms[0].matchExpressions[0].extra"',
        'unknown field "top"',
    ]


def test_unknown_field_inside_deployment_template() -> None:
    deploy = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}},
                 "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                 "template": {"metadata": {"labels": {"app": "d"}},
                              "spec": {"containers": [{"name": "c", "image": "i", "foo": 1}]}}},
    }
    assert check_fields(deploy, "apps", "v1", "Deployment") == [
        'unknown field "spec.template.spec.containers[0].foo"'
    ]


def test_label_values_must_be_strings() -> None:
    pod = _pod()
    pod["metadata"]["labels"]["n"] = 1
    assert check_fields(pod, "", "v1", "Pod") == [
        "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"
    ]
    pod["metadata"]["labels"]["n"] = True
    assert "bool into Go struct field ObjectMeta.metadata.labels" in check_fields(pod, "", "v1", "Pod")[0]


def test_wrong_scalar_and_container_types() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "80"
    pod["spec"]["terminationGracePeriodSeconds"] = 1.5
    pod["spec"]["nodeSelector"] = ["a"]
    problems = check_fields(pod, "", "v1", "Pod")
    assert problems == [
        "json: cannot unmarshal string into Go struct field ContainerPort.spec.containers.ports"
        ".containerPort of type int32",
        "json: cannot unmarshal array into Go struct field PodSpec.spec.nodeSelector of type "
        "map[string]string",
        "json: cannot unmarshal number 1.5 into Go struct field PodSpec.spec."
        "terminationGracePeriodSeconds of type int64",
    ]
    pod = _pod()
    pod["spec"] = "nope"
    assert check_fields(pod, "", "v1", "Pod") == [
        "json: cannot unmarshal string into Go struct field Pod.spec of type v1.PodSpec"
    ]


def test_preserve_unknown_fields_accepts_anything() -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}],
            "config": [{"opaque": {"driver": "gpu.example.com",
                                   "parameters": {"anything": [1, {"deep": None}], "x": "y"}}}],
        }},
    }
    assert check_fields(claim, "resource.k8s.io", "v1", "ResourceClaim") == []
    claim["spec"]["devices"]["requests"][0]["exactly"]["nope"] = 1
    assert check_fields(claim, "resource.k8s.io", "v1", "ResourceClaim") == [
        'unknown field "spec.devices.requests[0].exactly.nope"'
    ]
    pod = _pod()
    pod["metadata"]["managedFields"] = [{"manager": "m", "fieldsV1": {"f:spec": {"f:x": {}}}}]
    assert check_fields(pod, "", "v1", "Pod") == []


def test_int_or_string_accepts_both_and_rejects_others() -> None:
    pod = _pod()
    probe = pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    for ok in (8080, "http", None):
        probe["port"] = ok
        assert check_fields(pod, "", "v1", "Pod") == []
    probe["port"] = True
    assert check_fields(pod, "", "v1", "Pod") == ["json: cannot unmarshal bool into Go value of type int32"]
    probe["port"] = 1.5
    assert check_fields(pod, "", "v1", "Pod") == [
        "json: cannot unmarshal number 1.5 into Go value of type int32"
    ]


def test_quantities_time_and_bytes() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "lots"
    assert check_fields(pod, "", "v1", "Pod")[0].startswith("quantities must match")
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1Qi"
    assert check_fields(pod, "", "v1", "Pod")[0].startswith("quantities must match")
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1e3"
    assert check_fields(pod, "", "v1", "Pod") == []
    pod["metadata"]["creationTimestamp"] = "2026-11-29T10:40:40+00:00"
    assert check_fields(pod, "", "v1", "Pod") == []
    pod["metadata"]["creationTimestamp"] = "yesterday"
    assert check_fields(pod, "", "v1", "Pod")[0].startswith('parsing time "yesterday"')
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
              "data": {"k": "aGVsbG8="}, "stringData": {"p": "plain"}}
    assert check_fields(secret, "", "v1", "Secret") == []
    secret["data"]["k"] = "not base64!"
    assert check_fields(secret, "", "v1", "Secret") == ["illegal base64 data at input byte 3"]


def test_unknown_kind_is_not_validated() -> None:
    assert check_fields({"anything": 1}, "example.com", "v1", "Widget") == []


def test_check_fields_does_not_mutate_input() -> None:
    pod = _pod()
    pod["spec"]["x"] = 1
    before = copy.deepcopy(pod)
    check_fields(pod, "", "v1", "Pod")
    assert pod == before


# ------------------------------------------------------------------ enforce


def test_enforce_strict_raises_with_upstream_message() -> None:
    problems = ['unknown field "spec.foo"', 'unknown field "x"']
    with pytest.raises(StatusError) as info:
        enforce(problems, "Strict")
    assert info.value.code == 400 and info.value.reason == "BadRequest"
    assert info.value.message == 'strict decoding error: unknown field "spec.foo", unknown field "x"'
    with pytest.raises(StatusError) as info:
        enforce(problems, "Strict", kind="Pod", version="v1")
    assert info.value.message == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.foo", unknown field "x"'
    )


def test_enforce_warn_ignore_and_default() -> None:
    problems = ['unknown field "spec.foo"']
    assert enforce(problems, "Warn") == problems
    assert enforce(problems, "") == problems
    assert enforce(problems, "Ignore") == []
    assert enforce([], "Strict") == []
    assert openapi.warning_header(problems[0]) == '299 - "unknown field \\"spec.foo\\""'
    with pytest.raises(StatusError):
        enforce(problems, "strict")


def test_enforce_type_errors_fail_in_every_mode() -> None:
    pod = _pod()
    pod["metadata"]["labels"]["n"] = 1
    pod["spec"]["foo"] = 1
    problems = check_fields(pod, "", "v1", "Pod")
    for mode in ("Strict", "Warn", "Ignore"):
        with pytest.raises(StatusError) as info:
            enforce(problems, mode, kind="Pod", version="v1")
        assert info.value.code == 400
        assert info.value.message == (
            'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal number into '
            "Go struct field ObjectMeta.metadata.labels of type string"
        )


def test_validation_timing() -> None:
    pod = _pod()
    check_fields(pod, "", "v1", "Pod")  # compile
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        check_fields(pod, "", "v1", "Pod")
    per_call_ms = (time.perf_counter() - start) / n * 1000
    print(f"\ncheck_fields(typical pod): {per_call_ms:.4f} ms per call")
    start = time.perf_counter()
    v3_document("", "v1")
    print(f"v3_document(core/v1) cached copy: {(time.perf_counter() - start) * 1000:.2f} ms")
