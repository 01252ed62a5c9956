"""Strategic merge patch directives, with the semantics of apimachinery's
strategicpatch package as the API server applies it (parallel lists merged,
unmatched nulls ignored)."""

import copy

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.patch import strategic_merge_patch

DEPLOY = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "finalizers": ["x", "y", "z"]},
    "spec": {
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
        "template": {"spec": {
            "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}, {"name": "c", "image": "i"}],
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "w", "configMap": {"name": "cm"}}],
        }},
    },
}


def smp(patch, obj=DEPLOY):
    before = copy.deepcopy(obj)
    before_patch = copy.deepcopy(patch)
    out = strategic_merge_patch(obj, patch, "apps", "Deployment")
    assert obj == before and patch == before_patch
    return out


def tmpl(out):
    return out["spec"]["template"]["spec"]


def test_retain_keys_on_a_map_field_clears_unlisted_fields():
    out = smp({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}})
    assert out["spec"]["strategy"] == {"type": "Recreate"}


def test_retain_keys_in_list_items_as_kubectl_sends_them():
    # kubectl apply after changing a volume from emptyDir to hostPath.
    out = smp({"spec": {"template": {"spec": {
        "$setElementOrder/volumes": [{"name": "v"}, {"name": "w"}],
        "volumes": [{"$retainKeys": ["hostPath", "name"], "emptyDir": None, "hostPath": {"path": "/d"},
                     "name": "v"}]}}}})
    assert tmpl(out)["volumes"] == [{"name": "v", "hostPath": {"path": "/d"}},
                                    {"name": "w", "configMap": {"name": "cm"}}]


def test_retain_keys_must_list_every_field_the_patch_sets():
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": {}}}})
    assert (exc.value.code, exc.value.message) == (400, "invalid patch format of retainKeys")
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"strategy": {"$retainKeys": "type", "type": "Recreate"}}})
    assert (exc.value.code, exc.value.message) == (400, "invalid patch format of retainKeys")
    # Nulls need not be listed.
    out = smp({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": None}}})
    assert out["spec"]["strategy"] == {"type": "Recreate"}


def test_patch_directive_in_maps():
    out = smp({"spec": {"strategy": {"$patch": "replace", "type": "Recreate"}}})
    assert out["spec"]["strategy"] == {"type": "Recreate"}
    out = smp({"spec": {"strategy": {"$patch": "delete"}}})
    assert out["spec"]["strategy"] == {}
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"strategy": {"$patch": "merge", "type": "Recreate"}}})
    assert exc.value.code == 400 and exc.value.message.startswith("unknown patch type: merge in map")


def test_patch_directive_in_merging_lists():
    out = smp({"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}, {"name": "n", "image": "j"}]}}}})
    assert tmpl(out)["containers"] == [{"name": "n", "image": "j"}]
    out = smp({"spec": {"template": {"spec": {"containers": [{"$patch": "delete", "name": "b"}]}}}})
    assert [c["name"] for c in tmpl(out)["containers"]] == ["a", "c"]
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"template": {"spec": {"containers": [{"$patch": "merge", "name": "b"}]}}}})
    assert exc.value.message == "merging lists cannot yet be specified in the patch"
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}})
    assert "does not contain declared merge key: name" in exc.value.message


def test_delete_from_primitive_list():
    out = smp({"metadata": {"$deleteFromPrimitiveList/finalizers": ["y", "absent"]}})
    assert out["metadata"]["finalizers"] == ["x", "z"]
    # Nothing to delete from: the directive adds nothing.
    out = smp({"metadata": {"$deleteFromPrimitiveList/finalizers": ["y"]}}, obj={"metadata": {}})
    assert out["metadata"] == {}
    # Together with additions to the same list (what kubectl apply sends).
    out = smp({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"], "finalizers": ["w"]}})
    assert sorted(out["metadata"]["finalizers"]) == ["w", "y", "z"]


def test_set_element_order_for_maps_and_server_only_items():
    out = smp({"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}],
        "containers": [{"name": "c", "image": "x"}]}}}})
    # c and a take the listed order; b (only on the server) keeps its place
    # before c, where the server had it.
    assert [(c["name"], c["image"]) for c in tmpl(out)["containers"]] == [("b", "i"), ("c", "x"), ("a", "i")]


def test_set_element_order_for_primitives():
    out = smp({"metadata": {"$setElementOrder/finalizers": ["z", "x"]}})
    # z and x swap; y (not listed) stays before z, where the server had it.
    assert out["metadata"]["finalizers"] == ["y", "z", "x"]


def test_set_element_order_must_agree_with_the_patch_list():
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "c"}],
            "containers": [{"name": "c", "image": "x"}, {"name": "a", "image": "y"}]}}}})
    assert exc.value.code == 400 and "doesn't match $setElementOrder list" in exc.value.message
    with pytest.raises(StatusError) as exc:
        smp({"spec": {"template": {"spec": {"$setElementOrder/containers": {"name": "a"}}}}})
    assert exc.value.message == "invalid patch format of setElementOrder list"


def test_set_element_order_for_a_list_the_server_does_not_have():
    out = smp({"spec": {"template": {"spec": {
        "$setElementOrder/initContainers": [{"name": "i2"}, {"name": "i1"}],
        "initContainers": [{"name": "i2", "image": "b"}, {"$patch": "delete", "name": "i0"},
                           {"name": "i1", "image": "a"}]}}}})
    assert tmpl(out)["initContainers"] == [{"name": "i2", "image": "b"}, {"name": "i1", "image": "a"}]


def test_values_new_to_the_original_lose_their_directives():
    out = smp({"spec": {"template": {"spec": {"nodeSelector": {"$patch": "delete"},
                                              "affinity": {"nodeAffinity": {"$patch": "replace"}}}}}})
    assert "nodeSelector" not in tmpl(out) and tmpl(out)["affinity"] == {}


def test_type_changes_take_the_patch_and_lists_of_lists_fail():
    out = smp({"spec": {"strategy": "Recreate"}})
    assert out["spec"]["strategy"] == "Recreate"
    with pytest.raises(StatusError) as exc:
        smp({"metadata": {"finalizers": [["x"]]}}, obj={"metadata": {"finalizers": []}})
    assert (exc.value.code, exc.value.message) == (422, "lists of lists are not supported")
    with pytest.raises(StatusError) as exc:
        smp({"metadata": {"finalizers": [["x"]]}})
    assert exc.value.code == 400 and "list element types are not identical" in exc.value.message


def test_atomic_lists_are_replaced_even_with_directives_inside():
    obj = {"spec": {"template": {"spec": {"tolerations": [{"key": "a"}, {"key": "b"}]}}}}
    out = smp({"spec": {"template": {"spec": {"tolerations": [{"key": "c"}]}}}}, obj=obj)
    assert tmpl(out)["tolerations"] == [{"key": "c"}]


# Ordering cases of the kind upstream's strategicpatch tests check (the live
# list, the patch kubectl computes, the merged list), on a merge list of
# primitives (finalizers) and a merge list keyed by name (containers).
PRIMITIVE_ORDER_CASES = [
    (["a", "b", "d"], {"$setElementOrder/finalizers": ["a", "b", "c"], "finalizers": ["c"]}, ["a", "b", "c", "d"]),
    (["a", "d", "b"], {"$setElementOrder/finalizers": ["c", "a", "b"], "finalizers": ["c"]}, ["c", "a", "d", "b"]),
    (["a", "b", "c"], {"$setElementOrder/finalizers": ["b", "a"], "$deleteFromPrimitiveList/finalizers": ["c"]},
     ["b", "a"]),
    (["a", "b", "c"], {"$setElementOrder/finalizers": ["d", "b", "a"], "finalizers": ["d"],
                       "$deleteFromPrimitiveList/finalizers": ["c"]}, ["d", "b", "a"]),
    (["a", "b", "z", "c", "d"], {"$setElementOrder/finalizers": ["b", "a", "d", "c"]}, ["b", "a", "z", "d", "c"]),
]


@pytest.mark.parametrize("live,patch,merged", PRIMITIVE_ORDER_CASES)
def test_order_of_merged_primitive_lists(live, patch, merged):
    out = strategic_merge_patch({"metadata": {"finalizers": live}}, {"metadata": patch}, "", "Pod")
    assert out["metadata"]["finalizers"] == merged


def named(*items):
    return [{"name": i} if isinstance(i, str) else {"name": i[0], "image": i[1]} for i in items]


KEYED_ORDER_CASES = [
    (named("a", ("b", "x")), {"$setElementOrder/containers": named("c", "a", "b"), "containers": named(("c", "y"))},
     named(("c", "y"), "a", ("b", "x"))),
    (named("a", "b"), {"$setElementOrder/containers": named("a", "d", "b", "c"),
                       "containers": named(("d", "4"), ("c", "3"))},
     named("a", ("d", "4"), "b", ("c", "3"))),
    (named("a", "b", "c"), {"$setElementOrder/containers": named("b", "a"),
                            "containers": [{"name": "c", "$patch": "delete"}]}, named("b", "a")),
    (named("a", "b", "c"), {"$setElementOrder/containers": named("d", "b", "a"),
                            "containers": [{"name": "d", "image": "4"}, {"name": "c", "$patch": "delete"}]},
     named(("d", "4"), "b", "a")),
    (named("a", "b", "g", "i", "h", "c", "d"), {"$setElementOrder/containers": named("b", "a", "d", "c")},
     named("b", "a", "g", "i", "h", "d", "c")),
    (named("a", ("b", "x"), "c"), {"$setElementOrder/containers": named("b", "c", "a"),
                                   "containers": named(("c", "z"))},
     named(("b", "x"), ("c", "z"), "a")),
]


@pytest.mark.parametrize("live,patch,merged", KEYED_ORDER_CASES)
def test_order_of_merged_keyed_lists(live, patch, merged):
    out = strategic_merge_patch({"spec": {"containers": live}}, {"spec": patch}, "", "Pod")
    assert out["spec"]["containers"] == merged
