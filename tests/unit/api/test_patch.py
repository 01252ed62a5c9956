import copy

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.patch import (
    json_patch,
    list_strategy,
    merge_patch,
    strategic_merge_patch,
)

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "labels": {"a": "1", "b": "2"}, "finalizers": ["x/f"]},
    "spec": {
        "containers": [
            {"name": "c", "image": "nginx:1", "args": ["a", "b"],
             "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
             "ports": [{"containerPort": 80}]},
            {"name": "side", "image": "busybox"},
        ],
        "tolerations": [{"key": "k1", "operator": "Exists"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
    },
}


# -- RFC 6902 ---------------------------------------------------------------

def test_json_patch_ops_and_pointer_escaping():
    obj = {"metadata": {"annotations": {"a/b": "1", "m~n": "2"}}, "list": [1, 2]}
    out = json_patch(obj, [
        {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "x"},
        {"op": "remove", "path": "/metadata/annotations/m~0n"},
        {"op": "add", "path": "/list/-", "value": 3},
        {"op": "add", "path": "/list/0", "value": 0},
        {"op": "copy", "from": "/list/1", "path": "/copied"},
        {"op": "move", "from": "/copied", "path": "/moved"},
        {"op": "test", "path": "/moved", "value": 1},
    ])
    assert out == {"metadata": {"annotations": {"a/b": "x"}}, "list": [0, 1, 2, 3], "moved": 1}
    assert obj["metadata"]["annotations"] == {"a/b": "1", "m~n": "2"}  # input untouched


@pytest.mark.parametrize("ops", [
    [{"op": "test", "path": "/a", "value": 2}],
    [{"op": "remove", "path": "/missing"}],
    [{"op": "replace", "path": "/missing", "value": 1}],
    [{"op": "add", "path": "/x/y/z", "value": 1}],
    [{"op": "add", "path": "/l/5", "value": 1}],
    [{"op": "frobnicate", "path": "/a"}],
    [{"op": "test", "path": "/a", "value": True}],
])
def test_json_patch_failures_are_generic_422(ops):
    with pytest.raises(StatusError) as exc:
        json_patch({"a": 1, "l": []}, ops)
    assert exc.value.code == 422 and exc.value.reason == "Invalid"
    assert exc.value.message == "the server rejected our request due to an error in our request"
    assert exc.value.to_status().get("details") is None


def test_json_patch_body_must_be_a_list():
    with pytest.raises(StatusError) as exc:
        json_patch({}, {"op": "add"})
    assert exc.value.code == 400


# -- RFC 7386 ---------------------------------------------------------------

def test_merge_patch_null_deletes_and_lists_replace():
    obj = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"l": [1, 2], "m": {"x": 1}}}
    out = merge_patch(obj, {"metadata": {"labels": {"a": None, "c": "3"}},
                            "spec": {"l": [3], "m": {"y": {"z": None, "w": 1}}}})
    assert out == {"metadata": {"labels": {"b": "2", "c": "3"}},
                   "spec": {"l": [3], "m": {"x": 1, "y": {"w": 1}}}}
    assert obj["spec"]["l"] == [1, 2]


# -- strategic merge patch ----------------------------------------------------

def smp(patch, obj=POD):
    before = copy.deepcopy(obj)
    out = strategic_merge_patch(obj, patch, "", "Pod")
    assert obj == before
    return out


def test_smp_merges_containers_by_name_and_env_by_name():
    out = smp({"spec": {"containers": [
        {"name": "c", "image": "nginx:2", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]},
        {"name": "new", "image": "redis"},
    ]}})
    cs = out["spec"]["containers"]
    # Items the patch names come first, in the patch's order; "side" (only on the
    # server) goes after them as it is not before any of them on the server.
    assert [c["name"] for c in cs] == ["c", "new", "side"]
    assert cs[0]["image"] == "nginx:2" and cs[0]["args"] == ["a", "b"]
    assert cs[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}]


def test_smp_atomic_lists_replace_and_null_deletes_keys():
    out = smp({"metadata": {"labels": {"a": None}},
               "spec": {"tolerations": [{"key": "k2", "operator": "Exists"}],
                        "containers": [{"name": "c", "args": ["z"]}]}})
    assert out["metadata"]["labels"] == {"b": "2"}
    assert out["spec"]["tolerations"] == [{"key": "k2", "operator": "Exists"}]
    assert out["spec"]["containers"][0]["args"] == ["z"]


def test_smp_kubectl_apply_delete_and_set_element_order():
    # The body kubectl sends when an env var is removed from the manifest.
    out = smp({"spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "c"}],
                        "containers": [{"$setElementOrder/env": [{"name": "B"}], "name": "c",
                                        "env": [{"$patch": "delete", "name": "A"}]}]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["side", "c"]
    assert out["spec"]["containers"][1]["env"] == [{"name": "B", "value": "2"}]


def test_smp_replace_directives_and_primitive_lists():
    out = smp({"metadata": {"finalizers": ["y/g"], "labels": {"$patch": "replace", "z": "9"}},
               "spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "i"}]}})
    # A merged primitive list puts the patch's items first.
    assert out["metadata"]["finalizers"] == ["y/g", "x/f"]
    assert out["metadata"]["labels"] == {"z": "9"}
    assert out["spec"]["containers"] == [{"name": "only", "image": "i"}]
    out = smp({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/f"]}})
    assert out["metadata"]["finalizers"] == []


def test_smp_retain_keys_clears_other_fields():
    out = smp({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "hostPath"],
                                      "hostPath": {"path": "/d"}}]}})
    assert out["spec"]["volumes"] == [{"name": "v", "hostPath": {"path": "/d"}}]
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name"], "hostPath": {"path": "/d"}}]}})
    assert exc.value.code == 400 and exc.value.message == "invalid patch format of retainKeys"


def test_smp_errors():
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"containers": [{"image": "no-name"}]}})
    assert exc.value.code == 400 and "merge key: name" in exc.value.message
    with pytest.raises(StatusError) as exc:
        smp({"metadata": {"$deleteFromPrimitiveListfinalizers": ["x"]}})
    assert exc.value.message == "invalid patch format of primitive list"
    # A deletion list that is not a list does not match the field's type: ignored.
    assert smp({"metadata": {"$deleteFromPrimitiveList/finalizers": "x"}})["metadata"]["finalizers"] == ["x/f"]
    with pytest.raises(StatusError) as exc:
        strategic_merge_patch({}, {"spec": {}}, "example.com", "Widget")
    assert exc.value.code == 415 and exc.value.reason == "UnsupportedMediaType"


def test_smp_pod_template_in_deployment_and_conditions():
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "a",
                                                           "ports": [{"containerPort": 80}]}]}}},
           "status": {"conditions": [{"type": "Available", "status": "False"},
                                     {"type": "Progressing", "status": "True"}]}}
    out = strategic_merge_patch(dep, {
        "spec": {"template": {"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 81}]}]}}},
        "status": {"conditions": [{"type": "Available", "status": "True"}]},
    }, "apps", "Deployment")
    assert out["spec"]["template"]["spec"]["containers"][0]["ports"] == [{"containerPort": 81}, {"containerPort": 80}]
    assert out["status"]["conditions"] == [{"type": "Available", "status": "True"},
                                           {"type": "Progressing", "status": "True"}]


def test_merge_key_table_scope():
    assert list_strategy("", "Pod", ("spec", "tolerations")).smp_merge is False
    assert list_strategy("", "Service", ("spec", "ports")).ssa_keys == ("port", "protocol")
    assert list_strategy("", "Node", ("status", "addresses")).smp_key == "type"
    assert list_strategy("batch", "Job", ("spec", "template", "spec", "initContainers", "*", "env")).smp_key == "name"
    assert list_strategy("resource.k8s.io", "ResourceClaim", ("status", "reservedFor")).smp_key == "uid"
    assert list_strategy("example.com", "Widget", ("metadata", "ownerReferences")).ssa_keys == ("uid",)
