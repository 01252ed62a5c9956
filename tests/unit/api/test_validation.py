import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubeplane.api.errors import Cause
from kubeplane.api.resources import resource
from kubeplane.api.validation import (
    extra_validators,
    is_dns1123_label,
    is_qualified_name,
    is_valid_port_name,
    register_extra_validator,
    validate_object,
)

SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)


def pod(**spec_overrides):
    spec = {"containers": [{"name": "c", "image": "nginx"}]}
    spec.update(spec_overrides)
    return {"metadata": {"name": "web", "namespace": "default"}, "spec": spec}


def causes(plural, obj, old=None):
    return [(c.field, c.reason) for c in validate_object(resource(plural), obj, old)]


def only(plural, obj, old=None):
    got = validate_object(resource(plural), obj, old)
    assert len(got) == 1, got
    return got[0]


# --------------------------------------------------------------------------- metadata

def test_valid_pod_has_no_errors():
    assert validate_object(resource("pods"), pod()) == []


def test_name_required_unless_generate_name():
    obj = pod()
    del obj["metadata"]["name"]
    c = only("pods", obj)
    assert (c.field, c.reason, c.message) == (
        "metadata.name", "FieldValueRequired", "Required value: name or generateName is required")


def test_generate_name_allows_trailing_dash_but_name_still_required():
    obj = pod()
    obj["metadata"] = {"generateName": "web-", "namespace": "default"}
    assert causes("pods", obj) == [("metadata.name", "FieldValueRequired")]


@pytest.mark.parametrize(
    "plural,name,message",
    [
        ("pods", "Web", SUBDOMAIN_MSG),
        ("configmaps", "a_b", SUBDOMAIN_MSG),
        ("namespaces", "a.b", LABEL_MSG),
        ("services", "1abc", DNS1035_MSG),
        ("nodes", "-node", SUBDOMAIN_MSG),
        ("pods", "a" * 254, "must be no more than 253 characters"),
        ("namespaces", "a" * 64, "must be no more than 63 characters"),
    ],
)
def test_name_format_per_resource(plural, name, message):
    res = resource(plural)
    obj = {"metadata": {"name": name}}
    if res.namespaced:
        obj["metadata"]["namespace"] = "default"
    got = [c for c in validate_object(res, obj) if c.field == "metadata.name"]
    assert got and got[0].reason == "FieldValueInvalid"
    assert got[0].message == f'Invalid value: "{name}": {message}'


def test_pod_and_node_names_may_contain_dots_but_namespaces_may_not():
    assert "metadata.name" not in dict(causes("nodes", {"metadata": {"name": "node-1.example.com"}}))
    assert ("metadata.name", "FieldValueInvalid") in causes("namespaces", {"metadata": {"name": "a.b"}})


def test_namespace_required_for_namespaced_and_forbidden_for_cluster_scoped():
    obj = pod()
    del obj["metadata"]["namespace"]
    assert causes("pods", obj) == [("metadata.namespace", "FieldValueRequired")]
    assert causes("nodes", {"metadata": {"name": "n", "namespace": "x"}}) == [
        ("metadata.namespace", "FieldValueForbidden")]
    obj = pod()
    obj["metadata"]["namespace"] = "Bad_NS"
    assert causes("pods", obj) == [("metadata.namespace", "FieldValueInvalid")]


@pytest.mark.parametrize(
    "labels,expected",
    [
        ({"app": "web", "example.com/tier": "a_b.c-1"}, []),
        ({"a b": "x"}, [("metadata.labels", "FieldValueInvalid")]),
        ({"app": "-x"}, [("metadata.labels", "FieldValueInvalid")]),
        ({"app": "x" * 64}, [("metadata.labels", "FieldValueInvalid")]),
        ({"a/b/c": "x"}, [("metadata.labels", "FieldValueInvalid")]),
        ({"/a": "x"}, [("metadata.labels", "FieldValueInvalid")]),
        ({"app": ""}, []),
    ],
)
def test_labels(labels, expected):
    obj = pod()
    obj["metadata"]["labels"] = labels
    assert causes("pods", obj) == expected


def test_label_value_message():
    obj = pod()
    obj["metadata"]["labels"] = {"app": "x" * 64}
    assert only("pods", obj).message == f'Invalid value: "{"x" * 64}": must be no more than 63 characters'


def test_annotations_key_syntax_and_total_size():
    obj = pod()
    obj["metadata"]["annotations"] = {"Example.COM/Key": "ok", "bad key": "v"}
    assert causes("pods", obj) == [("metadata.annotations", "FieldValueInvalid")]
    obj["metadata"]["annotations"] = {"big": "x" * (256 * 1024)}
    c = only("pods", obj)
    assert (c.field, c.reason) == ("metadata.annotations", "FieldValueTooLong")
    assert "262144" in c.message


def test_finalizers():
    obj = pod()
    obj["metadata"]["finalizers"] = ["example.com/guard", "kubernetes", "orphan"]
    assert causes("pods", obj) == []
    obj["metadata"]["finalizers"] = ["custom"]
    c = only("pods", obj)
    assert (c.field, c.reason) == ("metadata.finalizers", "FieldValueInvalid")
    assert c.message.endswith("name is neither a standard finalizer name nor is it fully qualified")
    obj["metadata"]["finalizers"] = ["orphan", "foregroundDeletion"]
    assert only("pods", obj).message.endswith("finalizer orphan and foregroundDeletion cannot be both set")
    obj["metadata"]["finalizers"] = ["bad name/x"]
    assert causes("pods", obj) == [("metadata.finalizers", "FieldValueInvalid")]


def test_owner_references_fields_required():
    obj = pod()
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "", "kind": "", "name": "", "uid": ""}]
    assert causes("pods", obj) == [
        ("metadata.ownerReferences.apiVersion", "FieldValueInvalid"),
        ("metadata.ownerReferences.kind", "FieldValueInvalid"),
        ("metadata.ownerReferences.name", "FieldValueInvalid"),
        ("metadata.ownerReferences.uid", "FieldValueInvalid"),
    ]
    ok = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": True}
    obj["metadata"]["ownerReferences"] = [ok, {**ok, "name": "rs2"}]
    c = only("pods", obj)
    assert c.field == "metadata.ownerReferences"
    assert "Only one reference can have Controller set to true" in c.message


def test_name_and_namespace_immutable_on_update():
    old = pod()
    new = copy.deepcopy(old)
    new["metadata"]["name"] = "other"
    c = only("pods", new, old)
    assert (c.field, c.reason, c.message) == ("metadata.name", "FieldValueInvalid",
                                              'Invalid value: "other": field is immutable')


def test_update_checks_changed_metadata_and_skips_only_what_is_unchanged():
    old = pod()
    old["metadata"].update(labels={"app": "web"}, annotations={"a": "b"}, finalizers=["x/y"])
    assert causes("pods", copy.deepcopy(old), old) == []
    # each part is checked as soon as it differs from the stored one
    for key, bad, field in (("labels", {"app": "-bad-"}, "metadata.labels"),
                            ("annotations", {"-bad-": "x"}, "metadata.annotations"),
                            ("finalizers", ["nope"], "metadata.finalizers"),
                            ("ownerReferences", [{"apiVersion": "v1", "kind": "K"}], "metadata.ownerReferences")):
        new = copy.deepcopy(old)
        new["metadata"][key] = bad
        assert any(f.startswith(field) for f, _ in causes("pods", new, old)), key


def test_update_with_unchanged_spec_skips_the_spec_check_but_not_a_changed_one():
    old = pvc()
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "n1"}
    assert causes("persistentvolumeclaims", new, old) == []
    # equal by == but not the same JSON (true vs 1) counts as changed, so it is checked
    p_old = pod(hostNetwork=1)
    p_new = pod(hostNetwork=True)
    assert p_old == p_new
    from kubeplane.api.meta import same_json
    assert not same_json(p_new["spec"], p_old["spec"])
    bad = pod(containers=[])
    assert ("spec.containers", "FieldValueRequired") in causes("pods", bad, pod())


# --------------------------------------------------------------------------- pods

@pytest.mark.parametrize(
    "spec,expected",
    [
        ({"containers": []}, [("spec.containers", "FieldValueRequired")]),
        ({"containers": [{"image": "x"}]}, [("spec.containers[0].name", "FieldValueRequired")]),
        ({"containers": [{"name": "Bad_Name", "image": "x"}]}, [("spec.containers[0].name", "FieldValueInvalid")]),
        ({"containers": [{"name": "c"}]}, [("spec.containers[0].image", "FieldValueRequired")]),
        ({"containers": [{"name": "c", "image": "x"}, {"name": "c", "image": "y"}]},
         [("spec.containers[1].name", "FieldValueDuplicate")]),
        ({"containers": [{"name": "c", "image": "x"}], "initContainers": [{"name": "c", "image": "y"}]},
         [("spec.initContainers[0].name", "FieldValueDuplicate")]),
        ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 70000}]}]},
         [("spec.containers[0].ports[0].containerPort", "FieldValueInvalid")]),
        ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 0}]}]},
         [("spec.containers[0].ports[0].containerPort", "FieldValueRequired")]),
        ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "protocol": "HTTP"}]}]},
         [("spec.containers[0].ports[0].protocol", "FieldValueNotSupported")]),
        ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": -1}]}]},
         [("spec.containers[0].ports[0].hostPort", "FieldValueInvalid")]),
        ({"containers": [{"name": "c", "image": "x",
                          "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "http"}]}]},
         [("spec.containers[0].ports[1].name", "FieldValueDuplicate")]),
        ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "name": "HTTP"}]}]},
         [("spec.containers[0].ports[0].name", "FieldValueInvalid")] * 2),  # charset and "one letter"
        ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "name": "web-port-name-too-long"}]}]},
         [("spec.containers[0].ports[0].name", "FieldValueInvalid")]),
        ({"restartPolicy": "Sometimes"}, [("spec.restartPolicy", "FieldValueNotSupported")]),
        ({"restartPolicy": ""}, [("spec.restartPolicy", "FieldValueRequired")]),
        ({"dnsPolicy": "Bogus"}, [("spec.dnsPolicy", "FieldValueNotSupported")]),
        ({"activeDeadlineSeconds": 0}, [("spec.activeDeadlineSeconds", "FieldValueInvalid")]),
        ({"nodeSelector": {"disk": "ssd!"}}, [("spec.nodeSelector", "FieldValueInvalid")]),
        ({"nodeName": "Node_1"}, [("spec.nodeName", "FieldValueInvalid")]),
    ],
)
def test_pod_spec_errors(spec, expected):
    obj = pod()
    obj["spec"] = {**obj["spec"], **spec}
    assert causes("pods", obj) == expected


def test_unsupported_restart_policy_message():
    c = only("pods", pod(restartPolicy="Sometimes"))
    assert c.message == 'Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never"'


def test_resources():
    def with_res(res):
        return pod(containers=[{"name": "c", "image": "x", "resources": res}])

    assert causes("pods", with_res({"requests": {"cpu": "100m", "memory": "1Gi"},
                                    "limits": {"cpu": "1", "memory": "1Gi"}})) == []
    c = only("pods", with_res({"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}))
    assert (c.field, c.reason) == ("spec.containers[0].resources.requests", "FieldValueInvalid")
    assert c.message == 'Invalid value: "2": must be less than or equal to cpu limit of 1500m'
    c = only("pods", with_res({"limits": {"memory": "lots"}}))
    assert (c.field, c.reason) == ("spec.containers[0].resources.limits[memory]", "FieldValueInvalid")
    assert "quantities must match the regular expression" in c.message
    c = only("pods", with_res({"requests": {"cpu": "-1"}}))
    assert (c.field, c.message) == ("spec.containers[0].resources.requests[cpu]",
                                    'Invalid value: "-1": must be greater than or equal to 0')
    c = only("pods", with_res({"requests": {"gpu": "1"}}))
    assert c.message.endswith("must be a standard resource for containers")
    # extended resources may not be overcommitted
    assert causes("pods", with_res({"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "1"}})) == []
    assert causes("pods", with_res({"requests": {"example.com/gpu": "1"}})) == [
        ("spec.containers[0].resources.limits", "FieldValueRequired")]
    c = only("pods", with_res({"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "2"}}))
    assert c.message.endswith("must be equal to example.com/gpu limit of 2")


def test_volumes_and_mounts():
    ok = pod(volumes=[{"name": "data", "emptyDir": {}}],
             containers=[{"name": "c", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}])
    assert causes("pods", ok) == []
    dup = pod(volumes=[{"name": "data", "emptyDir": {}}, {"name": "data", "emptyDir": {}}])
    assert causes("pods", dup) == [("spec.volumes[1].name", "FieldValueDuplicate")]
    no_type = pod(volumes=[{"name": "data"}])
    c = only("pods", no_type)
    assert (c.field, c.message) == ("spec.volumes[0]", "Required value: must specify a volume type")
    missing = pod(containers=[{"name": "c", "image": "x", "volumeMounts": [{"name": "nope", "mountPath": "/d"}]}])
    c = only("pods", missing)
    assert (c.field, c.reason, c.message) == (
        "spec.containers[0].volumeMounts[0].name", "FieldValueNotFound", 'Not found: "nope"')
    two_mounts = pod(volumes=[{"name": "a", "emptyDir": {}}],
                     containers=[{"name": "c", "image": "x", "volumeMounts": [
                         {"name": "a", "mountPath": "/d"}, {"name": "a", "mountPath": "/d"}]}])
    assert causes("pods", two_mounts) == [("spec.containers[0].volumeMounts[1].mountPath", "FieldValueInvalid")]
    pvc = pod(volumes=[{"name": "a", "persistentVolumeClaim": {}}])
    assert causes("pods", pvc) == [("spec.volumes[0].persistentVolumeClaim.claimName", "FieldValueRequired")]


@pytest.mark.parametrize(
    "tol,expected",
    [
        ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, []),
        ({"operator": "Exists"}, []),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}, []),
        ({"key": "k", "operator": "Exists", "value": "v"}, [("spec.tolerations[0].operator", "FieldValueInvalid")]),
        ({"key": "k", "operator": "Like"}, [("spec.tolerations[0].operator", "FieldValueNotSupported")]),
        ({"key": "k", "effect": "Sometimes"}, [("spec.tolerations[0].effect", "FieldValueNotSupported")]),
        ({"operator": "Equal", "value": "v"}, [("spec.tolerations[0].operator", "FieldValueInvalid")]),
        ({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}, [("spec.tolerations[0].effect", "FieldValueInvalid")]),
        ({"key": "bad key"}, [("spec.tolerations[0].key", "FieldValueInvalid")]),
    ],
)
def test_tolerations(tol, expected):
    assert causes("pods", pod(tolerations=[tol])) == expected


def test_exists_with_value_message():
    c = only("pods", pod(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]))
    assert c.message.endswith("value must be empty when `operator` is 'Exists'")


def test_affinity_and_spread():
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]}]}}}
    assert causes("pods", pod(affinity=aff)) == [
        ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
         ".nodeSelectorTerms[0].matchExpressions[0].values", "FieldValueRequired")]
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}}]}}
    assert causes("pods", pod(affinity=anti)) == [
        ("spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
         "FieldValueRequired")]
    tsc = [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]
    assert causes("pods", pod(topologySpreadConstraints=tsc)) == [
        ("spec.topologySpreadConstraints[0].maxSkew", "FieldValueInvalid"),
        ("spec.topologySpreadConstraints[0].whenUnsatisfiable", "FieldValueNotSupported"),
    ]


def test_pod_resource_claims():
    spec = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}
    assert causes("pods", pod(**spec)) == []
    spec["containers"][0]["resources"]["claims"] = [{"name": "tpu"}]
    assert causes("pods", pod(**spec)) == [("spec.containers[0].resources.claims[0]", "FieldValueNotFound")]
    spec = {"resourceClaims": [{"name": "gpu"}]}
    assert causes("pods", pod(**spec)) == [("spec.resourceClaims[0]", "FieldValueRequired")]


POD_UPDATE_MSG = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


def test_pod_update_allows_image_and_tolerations_additions():
    old = pod(tolerations=[{"key": "a", "operator": "Exists"}])
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "nginx:2"
    new["spec"]["tolerations"].append({"key": "b", "operator": "Exists"})
    new["spec"]["activeDeadlineSeconds"] = 30
    new["metadata"]["labels"] = {"x": "y"}
    assert validate_object(resource("pods"), new, old) == []


def test_pod_update_forbids_other_spec_changes():
    old = pod()
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    c = only("pods", new, old)
    assert (c.field, c.reason, c.message) == ("spec", "FieldValueForbidden", POD_UPDATE_MSG)


def test_pod_update_toleration_removal_and_container_count():
    old = pod(tolerations=[{"key": "a", "operator": "Exists"}])
    new = copy.deepcopy(old)
    new["spec"]["tolerations"] = []
    c = only("pods", new, old)
    assert (c.field, c.message) == (
        "spec.tolerations", "Forbidden: existing toleration can not be modified except its tolerationSeconds")
    new = copy.deepcopy(old)
    new["spec"]["containers"].append({"name": "d", "image": "x"})
    c = only("pods", new, old)
    assert (c.field, c.reason) == ("spec.containers", "FieldValueForbidden")


def test_pod_update_deadline_and_scheduling_gates():
    old = pod(activeDeadlineSeconds=30, schedulingGates=[{"name": "example.com/gate"}])
    new = copy.deepcopy(old)
    new["spec"]["activeDeadlineSeconds"] = 60
    assert causes("pods", new, old) == [("spec.activeDeadlineSeconds", "FieldValueInvalid")]
    new = copy.deepcopy(old)
    new["spec"]["schedulingGates"] = []
    assert causes("pods", new, old) == []
    new["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    assert causes("pods", new, old) == [("spec.schedulingGates", "FieldValueForbidden")]


# --------------------------------------------------------------------------- storage

def pvc(**spec):
    base = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    base.update(spec)
    return {"metadata": {"name": "data", "namespace": "default"}, "spec": base}


def test_pvc_create():
    assert causes("persistentvolumeclaims", pvc()) == []
    c = only("persistentvolumeclaims", pvc(accessModes=[]))
    assert (c.field, c.reason, c.message) == (
        "spec.accessModes", "FieldValueRequired", "Required value: at least 1 access mode is required")
    assert causes("persistentvolumeclaims", pvc(resources={})) == [("spec.resources[storage]", "FieldValueRequired")]
    assert causes("persistentvolumeclaims", pvc(resources={"requests": {"storage": "0"}})) == [
        ("spec.resources.requests[storage]", "FieldValueInvalid")]
    assert causes("persistentvolumeclaims", pvc(accessModes=["ReadWriteSometimes"])) == [
        ("spec.accessModes", "FieldValueNotSupported")]
    assert causes("persistentvolumeclaims", pvc(volumeMode="Raw")) == [("spec.volumeMode", "FieldValueNotSupported")]


def test_pvc_update():
    old = pvc()
    new = copy.deepcopy(old)
    new["spec"]["accessModes"] = ["ReadWriteMany"]
    c = only("persistentvolumeclaims", new, old)
    assert (c.field, c.reason) == ("spec", "FieldValueForbidden")
    assert c.message == ("Forbidden: spec is immutable after creation except resources.requests and "
                         "volumeAttributesClassName for bound claims")
    # binding sets volumeName once
    new = copy.deepcopy(old)
    new["spec"]["volumeName"] = "pv1"
    assert causes("persistentvolumeclaims", new, old) == []
    # resize only for bound claims
    new = copy.deepcopy(old)
    new["spec"]["resources"]["requests"]["storage"] = "2Gi"
    assert causes("persistentvolumeclaims", new, old) == [("spec", "FieldValueForbidden")]
    old["status"] = {"phase": "Bound", "capacity": {"storage": "1Gi"}}
    assert causes("persistentvolumeclaims", new, old) == []
    new["spec"]["resources"]["requests"]["storage"] = "512Mi"
    assert causes("persistentvolumeclaims", new, old) == [
        ("spec.resources.requests.storage", "FieldValueForbidden")]


def pv(**spec):
    base = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/d"}}
    base.update(spec)
    return {"metadata": {"name": "pv1"}, "spec": base}


def test_pv():
    assert causes("persistentvolumes", pv()) == []
    assert causes("persistentvolumes", pv(capacity={})) == [
        ("spec.capacity", "FieldValueRequired"), ("spec.capacity", "FieldValueNotSupported")]
    assert causes("persistentvolumes", pv(accessModes=[])) == [("spec.accessModes", "FieldValueRequired")]
    no_src = pv()
    del no_src["spec"]["hostPath"]
    c = only("persistentvolumes", no_src)
    assert (c.field, c.message) == ("spec", "Required value: must specify a volume type")
    assert causes("persistentvolumes", pv(csi={"driver": "d", "volumeHandle": "h"})) == [
        ("spec.csi", "FieldValueForbidden")]
    local = pv(local={"path": "/mnt"})
    del local["spec"]["hostPath"]
    c = only("persistentvolumes", local)
    assert (c.field, c.message) == ("spec.nodeAffinity", "Required value: Local volume requires node affinity")
    local["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}
    assert causes("persistentvolumes", local) == []
    assert causes("persistentvolumes", pv(persistentVolumeReclaimPolicy="Keep")) == [
        ("spec.persistentVolumeReclaimPolicy", "FieldValueNotSupported")]
    old = pv()
    new = pv(hostPath={"path": "/other"})
    assert causes("persistentvolumes", new, old) == [("spec.persistentvolumesource", "FieldValueForbidden")]


def sc(**fields):
    return {"metadata": {"name": "fast"}, "provisioner": "example.com/csi", **fields}


def test_storage_class():
    assert causes("storageclasses", sc(reclaimPolicy="Delete", volumeBindingMode="WaitForFirstConsumer")) == []
    obj = sc()
    del obj["provisioner"]
    assert causes("storageclasses", obj) == [("provisioner", "FieldValueRequired")]
    assert causes("storageclasses", sc(reclaimPolicy="Recycle")) == [("reclaimPolicy", "FieldValueNotSupported")]
    assert causes("storageclasses", sc(volumeBindingMode="Later")) == [("volumeBindingMode", "FieldValueNotSupported")]
    old = sc(parameters={"a": "1"})
    assert causes("storageclasses", sc(parameters={"a": "2"}), old) == [("parameters", "FieldValueForbidden")]
    assert causes("storageclasses", sc(provisioner="other.io/x", parameters={"a": "1"}), old) == [
        ("provisioner", "FieldValueForbidden")]
    assert causes("storageclasses", sc(parameters={"a": "1"}, volumeBindingMode="WaitForFirstConsumer"), old) == [
        ("volumeBindingMode", "FieldValueInvalid")]


# --------------------------------------------------------------------------- workloads

def deployment(selector=None, labels=None, **spec):
    selector = {"matchLabels": {"app": "web"}} if selector is None else selector
    labels = {"app": "web"} if labels is None else labels
    body = {"replicas": 2, "selector": selector,
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}
    body.update(spec)
    return {"metadata": {"name": "web", "namespace": "default"}, "spec": body}


def test_valid_deployment_and_replicaset():
    assert causes("deployments", deployment()) == []
    assert causes("replicasets", deployment()) == []


def test_selector_must_match_template():
    c = only("deployments", deployment(labels={"app": "other"}))
    assert (c.field, c.reason) == ("spec.template.metadata.labels", "FieldValueInvalid")
    assert c.message == 'Invalid value: map[string]string{"app":"other"}: `selector` does not match template `labels`'


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"selector": {}}, [("spec.selector", "FieldValueInvalid")]),
        ({"replicas": -1}, [("spec.replicas", "FieldValueInvalid")]),
        ({"strategy": {"type": "Big"}}, [("spec.strategy.type", "FieldValueNotSupported")]),
        ({"strategy": {"type": "Recreate", "rollingUpdate": {}}}, [("spec.strategy.rollingUpdate", "FieldValueForbidden")]),
        ({"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "0%"}}},
         [("spec.strategy.rollingUpdate.maxUnavailable", "FieldValueInvalid")]),
        ({"strategy": {"rollingUpdate": {"maxSurge": "150%"}}}, [("spec.strategy.rollingUpdate.maxSurge", "FieldValueInvalid")]),
        ({"selector": {"matchExpressions": [{"key": "app", "operator": "Within", "values": ["web"]}]}},
         [("spec.selector.matchExpressions[0].operator", "FieldValueInvalid"), ("spec.selector", "FieldValueInvalid")]),
    ],
)
def test_deployment_errors(kwargs, expected):
    assert causes("deployments", deployment(**kwargs)) == expected


def test_deployment_missing_selector_and_template_pod_errors():
    obj = deployment()
    del obj["spec"]["selector"]
    assert causes("deployments", obj) == [("spec.selector", "FieldValueRequired")]
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"][0]["image"] = ""
    obj["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    assert causes("deployments", obj) == [
        ("spec.template.spec.containers[0].image", "FieldValueRequired"),
        ("spec.template.spec.restartPolicy", "FieldValueNotSupported"),
    ]


def test_deployment_selector_immutable():
    old = deployment()
    new = deployment(selector={"matchLabels": {"app": "web", "v": "2"}}, labels={"app": "web", "v": "2"})
    c = only("deployments", new, old)
    assert (c.field, c.reason) == ("spec.selector", "FieldValueInvalid")
    assert c.message.endswith(": field is immutable")
    scaled = deployment(replicas=5)
    assert causes("deployments", scaled, old) == []


def test_job_restart_policy_and_immutable_template():
    job = {"metadata": {"name": "j", "namespace": "default"},
           "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}], "restartPolicy": "Never"}}}}
    assert causes("jobs", job) == []
    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    # upstream: Always (or none) is "Required value: valid values: ...", others are not supported
    assert causes("jobs", bad) == [("spec.template.spec.restartPolicy", "FieldValueRequired")]
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Sometimes"
    # (the pod template's own check and the Job's, as upstream reports both)
    assert set(causes("jobs", bad)) == {("spec.template.spec.restartPolicy", "FieldValueNotSupported")}
    changed = copy.deepcopy(job)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "y"
    assert causes("jobs", changed, job) == [("spec.template", "FieldValueInvalid")]


# --------------------------------------------------------------------------- core

def svc(**spec):
    body = {"ports": [{"port": 80}]}
    body.update(spec)
    return {"metadata": {"name": "web", "namespace": "default"}, "spec": body}


@pytest.mark.parametrize(
    "spec,expected",
    [
        ({}, []),
        ({"ports": []}, [("spec.ports", "FieldValueRequired")]),
        ({"ports": [], "clusterIP": "None"}, []),
        ({"ports": [{"port": 0}]}, [("spec.ports[0].port", "FieldValueInvalid")]),
        ({"ports": [{"port": 80, "protocol": "ICMP"}]}, [("spec.ports[0].protocol", "FieldValueNotSupported")]),
        ({"ports": [{"port": 80, "name": "a"}, {"port": 81}]}, [("spec.ports[1].name", "FieldValueRequired")]),
        ({"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "a"}]}, [("spec.ports[1].name", "FieldValueDuplicate")]),
        ({"type": "Magic"}, [("spec.type", "FieldValueNotSupported")]),
        ({"type": "ExternalName", "ports": []}, [("spec.externalName", "FieldValueRequired")]),
        ({"ports": [{"port": 80, "targetPort": "Web_Port"}]}, [("spec.ports[0].targetPort", "FieldValueInvalid")]),
        ({"ports": [{"port": 80, "nodePort": 30000}]}, [("spec.ports[0].nodePort", "FieldValueForbidden")]),
        ({"sessionAffinity": "Sticky"}, [("spec.sessionAffinity", "FieldValueNotSupported")]),
    ],
)
def test_service(spec, expected):
    assert causes("services", svc(**spec)) == expected


def test_service_type_message_lists_sorted_values():
    c = only("services", svc(type="Magic"))
    assert c.message == ('Unsupported value: "Magic": supported values: "ClusterIP", "ExternalName", '
                         '"LoadBalancer", "NodePort"')


def test_config_map_and_secret_keys():
    cm = {"metadata": {"name": "cfg", "namespace": "default"}, "data": {"good.key_1": "v", "bad key": "v"}}
    c = only("configmaps", cm)
    assert (c.field, c.reason) == ("data[bad key]", "FieldValueInvalid")
    assert "[-._a-zA-Z0-9]+" in c.message
    cm = {"metadata": {"name": "cfg", "namespace": "default"}, "data": {"..x": "v"}}
    assert only("configmaps", cm).message.endswith("must not start with '..'")
    sec = {"metadata": {"name": "s", "namespace": "default"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}}
    assert causes("secrets", sec) == [("data[tls.key]", "FieldValueRequired")]
    old = {"metadata": {"name": "s", "namespace": "default"}, "type": "Opaque", "data": {"a": "eA=="}}
    new = copy.deepcopy(old)
    new["type"] = "example.com/other"
    assert causes("secrets", new, old) == [("type", "FieldValueInvalid")]


def test_immutable_config_map():
    old = {"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "1"}, "immutable": True}
    new = copy.deepcopy(old)
    new["data"]["a"] = "2"
    c = only("configmaps", new, old)
    assert (c.field, c.message) == ("data", "Forbidden: field is immutable when `immutable` is set")


def test_node_taints():
    node = {"metadata": {"name": "n1"}, "spec": {"taints": [
        {"key": "k", "effect": "NoSchedule"}, {"key": "k", "effect": "NoSchedule"}, {"key": "j", "effect": "Never"},
        {"key": "i"}]}}
    got = validate_object(resource("nodes"), node)
    assert [(c.field, c.reason) for c in got] == [
        ("spec.taints[1]", "FieldValueDuplicate"),
        ("spec.taints[2].effect", "FieldValueNotSupported"),
        ("spec.taints[3].effect", "FieldValueRequired"),
    ]
    assert got[0].message.endswith("taints must be unique by key and effect pair")


def test_event_namespace_must_match():
    ev = {"metadata": {"name": "e", "namespace": "default"}, "involvedObject": {"kind": "Pod", "namespace": "other"}}
    assert causes("events", ev) == [("involvedObject.namespace", "FieldValueInvalid")]
    ev["involvedObject"] = {"kind": "Node", "name": "n1"}
    assert causes("events", ev) == []


def test_lease_and_priority_class():
    lease = {"metadata": {"name": "n1", "namespace": "kube-node-lease"}, "spec": {"leaseDurationSeconds": 0}}
    assert causes("leases", lease) == [("spec.leaseDurationSeconds", "FieldValueInvalid")]
    pc = {"metadata": {"name": "system-mine"}, "value": 5}
    assert causes("priorityclasses", pc) == [("metadata.name", "FieldValueForbidden")]
    pc = {"metadata": {"name": "high"}, "value": 1000}
    assert causes("priorityclasses", pc) == []
    assert causes("priorityclasses", {**pc, "value": 2000}, pc) == [("value", "FieldValueForbidden")]


def test_pdb_both_set():
    pdb = {"metadata": {"name": "p", "namespace": "default"},
           "spec": {"minAvailable": 1, "maxUnavailable": "10%", "selector": {"matchLabels": {"a": "b"}}}}
    assert causes("poddisruptionbudgets", pdb) == [("spec", "FieldValueInvalid")]


# --------------------------------------------------------------------------- DRA

def claim(*requests, **devices):
    return {"metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": list(requests), **devices}}}


def test_resource_claim_requests():
    good = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
    assert causes("resourceclaims", claim(good)) == []
    assert causes("resourceclaims", claim(good, good)) == [("spec.devices.requests[1].name", "FieldValueDuplicate")]
    assert causes("resourceclaims", claim({"name": "Bad", "exactly": {"deviceClassName": "x"}})) == [
        ("spec.devices.requests[0].name", "FieldValueInvalid")]
    c = only("resourceclaims", claim({"name": "gpu"}))
    assert (c.field, c.message) == (
        "spec.devices.requests[0]", "Required value: exactly one of `exactly` or `firstAvailable` is required")
    both = {"name": "gpu", "exactly": {"deviceClassName": "x"},
            "firstAvailable": [{"name": "a", "deviceClassName": "x"}]}
    assert causes("resourceclaims", claim(both)) == [("spec.devices.requests[0]", "FieldValueInvalid")]
    assert causes("resourceclaims", claim({"name": "gpu", "exactly": {}})) == [
        ("spec.devices.requests[0].exactly.deviceClassName", "FieldValueRequired")]
    assert causes("resourceclaims", claim({"name": "gpu", "exactly": {"deviceClassName": "x", "allocationMode": "Some"}})) == [
        ("spec.devices.requests[0].exactly.allocationMode", "FieldValueNotSupported")]
    assert causes("resourceclaims", claim(good, constraints=[{"requests": ["tpu"], "matchAttribute": "a/b"}])) == [
        ("spec.devices.constraints[0].requests[0]", "FieldValueInvalid")]


def test_resource_claim_spec_immutable():
    old = claim({"name": "gpu", "exactly": {"deviceClassName": "x"}})
    new = claim({"name": "gpu", "exactly": {"deviceClassName": "y"}})
    c = only("resourceclaims", new, old)
    assert (c.field, c.reason) == ("spec", "FieldValueInvalid")
    assert c.message.endswith(": field is immutable")
    relabeled = copy.deepcopy(old)
    relabeled["metadata"]["labels"] = {"a": "b"}
    assert causes("resourceclaims", relabeled, old) == []


def test_resource_slice_and_device_class():
    sl = {"metadata": {"name": "s"}, "spec": {"driver": "gpu.example.com", "pool": {"name": "p", "resourceSliceCount": 1},
                                              "nodeName": "n1", "devices": [{"name": "d0"}, {"name": "d0"}]}}
    assert causes("resourceslices", sl) == [("spec.devices[1].name", "FieldValueDuplicate")]
    sl["spec"]["devices"] = [{"name": "d0"}]
    sl["spec"]["allNodes"] = True
    assert causes("resourceslices", sl) == [("spec", "FieldValueInvalid")]
    del sl["spec"]["allNodes"]
    del sl["spec"]["nodeName"]
    assert causes("resourceslices", sl) == [("spec", "FieldValueRequired")]
    dc = {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": ""}}]}}
    assert causes("deviceclasses", dc) == [("spec.selectors[0].cel.expression", "FieldValueRequired")]


def test_extra_validator_hook():
    key = "deviceclasses.resource.k8s.io"
    before = list(extra_validators.get(key, []))
    extra_validators[key] = []  # only this test's validator (DRA's CEL check may be installed)
    seen = []

    def check(res, obj, old):
        seen.append((res.kind, old is None))
        return [Cause("FieldValueInvalid", "Invalid value: \"x\": compile error", "spec.selectors[0].cel.expression")]

    register_extra_validator(key, check)
    try:
        dc = {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": "x"}}]}}
        assert causes("deviceclasses", dc) == [("spec.selectors[0].cel.expression", "FieldValueInvalid")]
        assert seen == [("DeviceClass", True)]
    finally:
        extra_validators[key] = before


# --------------------------------------------------------------------------- string checks

def test_string_checks():
    assert is_dns1123_label("my-name") == []
    assert is_dns1123_label("My") != []
    assert is_qualified_name("example.com/MyName") == []
    assert is_qualified_name("Example.com/x")[0].startswith("prefix part a lowercase RFC 1123 subdomain")
    assert is_qualified_name("a/") == ["name part must be non-empty",
                                       is_qualified_name("a/-")[0]]
    assert is_valid_port_name("http") == []
    assert is_valid_port_name("123") == ["must contain at least one letter (a-z)"]
    assert is_valid_port_name("a--b") == ["must not contain consecutive hyphens"]


# --------------------------------------------------------------------------- robustness and misc

from kubeplane.api.resources import RESOURCES  # noqa: E402


@pytest.mark.parametrize("res", RESOURCES, ids=lambda r: r.qualified)
@pytest.mark.parametrize(
    "junk",
    [
        {"metadata": "x", "spec": "y", "data": [1], "status": 3},
        {"metadata": {"name": 5, "labels": ["a"], "annotations": "b", "finalizers": "c", "ownerReferences": {}},
         "spec": {"containers": "x", "volumes": {}, "tolerations": 5, "selector": [], "template": "t",
                  "devices": {"requests": "r"}, "ports": "p", "taints": {}, "capacity": [], "accessModes": "a"}},
    ],
)
def test_malformed_objects_yield_causes_not_exceptions(res, junk):
    got = validate_object(res, junk, None) + validate_object(res, junk, junk)
    assert all(isinstance(c, Cause) for c in got)
    if junk["metadata"] == "x":
        assert ("metadata.name", "FieldValueRequired") in [(c.field, c.reason) for c in got]


def test_namespace_spec_finalizers():
    ns = {"metadata": {"name": "team-a"}, "spec": {"finalizers": ["kubernetes", "custom"]}}
    assert causes("namespaces", ns) == [("spec.finalizers[1]", "FieldValueInvalid")]


def test_csi_objects():
    node = {"metadata": {"name": "n1"}, "spec": {"drivers": [{"name": "d", "nodeID": "n1"}, {"name": "d"}]}}
    assert causes("csinodes", node) == [("spec.drivers[1].name", "FieldValueDuplicate"),
                                        ("spec.drivers[1].nodeID", "FieldValueRequired")]
    cap = {"metadata": {"name": "c", "namespace": "default"}, "capacity": "lots"}
    assert causes("csistoragecapacities", cap) == [("storageClassName", "FieldValueRequired"),
                                                   ("capacity", "FieldValueInvalid")]


def test_resource_claim_template_paths():
    tmpl = {"metadata": {"name": "t", "namespace": "default"},
            "spec": {"metadata": {"labels": {"bad key": "x"}},
                     "spec": {"devices": {"requests": [{"name": "gpu"}]}}}}
    assert causes("resourceclaimtemplates", tmpl) == [
        ("spec.metadata.labels", "FieldValueInvalid"),
        ("spec.spec.devices.requests[0]", "FieldValueRequired"),
    ]


def test_multiple_causes_are_reported_together():
    obj = {"metadata": {"name": "Bad", "namespace": "default"},
           "spec": {"containers": [{"name": "c"}], "restartPolicy": "Sometimes"}}
    assert causes("pods", obj) == [
        ("metadata.name", "FieldValueInvalid"),
        ("spec.containers[0].image", "FieldValueRequired"),
        ("spec.restartPolicy", "FieldValueNotSupported"),
    ]


def test_go_repr_matches_upstream_value_printing():
    from kubeplane.api.validation import go_repr

    assert go_repr({"b": "2", "a": "1"}) == 'map[string]string{"a":"1", "b":"2"}'
    assert go_repr(["x", "y"]) == '[]string{"x", "y"}'
    assert go_repr("web") == '"web"' and go_repr(-1) == "-1" and go_repr(None) == "null"
    assert go_repr(True) == "true"


def test_pod_spec_validation_memo_returns_the_same_causes_and_fresh_lists():
    from kubeplane.api.validation import core as v

    bad = {"containers": [{"name": "Bad_Name", "image": ""}], "restartPolicy": "Sometimes"}
    good = {"containers": [{"name": "c", "image": "i"}]}
    for spec in (bad, good, {}):
        first = v.validate_pod_spec(spec)
        again = v.validate_pod_spec(dict(spec))
        assert first == again == v._validate_pod_spec(spec, "spec")
        assert first is not again
        again.append("x")
        assert v.validate_pod_spec(spec) == first
    assert v.validate_pod_spec(bad)  # invalid specs stay invalid when served from the memo
    assert v.validate_pod_spec(bad, "spec.template.spec")[0].field.startswith("spec.template.spec")


def test_pod_spec_memo_is_shared_by_pods_mounting_their_own_claims():
    from kubeplane.api.validation import core as v

    def spec(claim: str, volume: str = "data", mount: str = "data") -> dict:
        return {"volumes": [{"name": volume, "persistentVolumeClaim": {"claimName": claim}}],
                "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": mount, "mountPath": "/d"}]}]}

    v._pod_spec_memo.clear()
    for i in range(5):
        assert v.validate_pod_spec(spec(f"claim-{i}")) == [] == v._validate_pod_spec(spec(f"claim-{i}"), "spec")
    assert len(v._pod_spec_memo) == 1
    # The volumes' own errors and the mounts' references still count.
    for s in (spec(""), spec("c", volume="other"), spec("c", mount="nope"), spec("c", volume="Bad_Name")):
        got = v.validate_pod_spec(s)
        assert got == v._validate_pod_spec(s, "spec") and got
    assert [c.field for c in v.validate_pod_spec(spec("c", volume="other"))] == \
        ["spec.containers[0].volumeMounts[0].name"]
    assert [c.field for c in v.validate_pod_spec(spec(""))] == ["spec.volumes[0].persistentVolumeClaim.claimName"]


def test_pod_update_with_an_unchanged_spec_takes_the_short_path_with_the_same_result():
    from kubeplane.api.validation import core as v

    old = {"spec": {"containers": [{"name": "c", "image": "i"}], "activeDeadlineSeconds": 30,
                    "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]}}
    same = {"spec": {"containers": [{"name": "c", "image": "i"}], "activeDeadlineSeconds": 30,
                     "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]}}
    assert v._validate_pod_update(same, old) == []
    changed = {"spec": dict(same["spec"], activeDeadlineSeconds=60)}
    assert [c.field for c in v._validate_pod_update(changed, old)] == ["spec.activeDeadlineSeconds"]
    out_of_range = {"spec": dict(old["spec"], activeDeadlineSeconds=-1)}
    assert [c.field for c in v._validate_pod_update(out_of_range, out_of_range)] == ["spec.activeDeadlineSeconds"]
    true_vs_one = {"spec": dict(old["spec"], hostNetwork=True)}
    one = {"spec": dict(old["spec"], hostNetwork=1)}
    # not JSON-identical, so the full comparison decides (it normalises values as before)
    assert v._validate_pod_update(true_vs_one, one) == []
    assert [c.field for c in v._validate_pod_update({"spec": dict(old["spec"], hostNetwork=True)}, old)] == ["spec"]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False) | st.sampled_from(["", "a", "1"]),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(["a", "b"]), kids, max_size=2),
    max_leaves=8,
)


@given(_JSON, _JSON)
def test_same_json_is_equality_of_the_encodings(a, b) -> None:
    import orjson

    from kubeplane.api.meta import same_json

    assert same_json(a, b) == (orjson.dumps(a) == orjson.dumps(b))
    assert same_json(a, a)


def test_same_json_tells_apart_values_python_calls_equal() -> None:
    from kubeplane.api.meta import same_json

    for a, b in [(1, 1.0), (1, True), (0, False), (0.0, -0.0), ({"a": 1}, {"a": 1.0}), ([True], [1])]:
        assert not same_json(a, b) and not same_json(b, a)
    for a, b in [("x", "x"), (7, 7), (True, True), (1.5, 1.5), ({"a": [1, "b"]}, {"a": [1, "b"]})]:
        assert same_json(a, b)


@pytest.mark.parametrize("containers,init,want", [
    ([{}], [], "BestEffort"),
    ([{"requests": {"cpu": "0", "memory": "0Mi"}, "limits": {"cpu": "0.0"}}], [], "BestEffort"),  # zero is unset
    ([{"requests": {"cpu": "100m"}}], [], "Burstable"),
    ([{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1024Mi"}}], [],
     "Guaranteed"),  # equal quantities written differently
    ([{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}], [], "Burstable"),
    ([{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}, {}], [], "Burstable"),
    ([{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}],
     [{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}], "Guaranteed"),
    ([{"limits": {"cpu": "1"}}], [], "Burstable"),  # memory not limited
    ([{"requests": {"ephemeral-storage": "1Gi"}}], [], "BestEffort"),  # not a QoS resource
    ([{"requests": {"cpu": "not-a-quantity"}}], [], "BestEffort"),  # left to validation
])
def test_pod_qos_class_as_upstream(containers, init, want) -> None:
    from kubeplane.api.qos import pod_qos_class

    def c(res: dict) -> dict:
        return {"name": "c", "image": "i", "resources": res}

    spec = {"containers": [c(r) for r in containers], "initContainers": [c(r) for r in init]}
    assert pod_qos_class(spec) == want
