import copy

import orjson
import pytest

from kubeplane.api.apply import (
    BEFORE_FIRST_APPLY,
    apply,
    fields_from_v1,
    fields_to_v1,
    path_string,
    track_update,
)
from kubeplane.api.errors import StatusError

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"


def deployment(image="nginx:1", replicas=2, labels=None):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": labels or {"app": "web"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": image,
                                                  "ports": [{"containerPort": 80}]}]}},
        },
    }


def entry(obj, manager):
    found = [e for e in obj["metadata"]["managedFields"] if e["manager"] == manager]
    assert len(found) == 1, obj["metadata"]["managedFields"]
    return found[0]


def test_create_by_apply_records_fieldsv1_like_upstream():
    obj = apply(None, deployment(), "kubectl", False, T0)
    assert obj["spec"]["replicas"] == 2
    (e,) = obj["metadata"]["managedFields"]
    assert {k: e[k] for k in ("manager", "operation", "apiVersion", "time", "fieldsType")} == {
        "manager": "kubectl", "operation": "Apply", "apiVersion": "apps/v1", "time": T0,
        "fieldsType": "FieldsV1"}
    f = e["fieldsV1"]
    assert f["f:metadata"] == {"f:labels": {"f:app": {}}}
    assert f["f:spec"]["f:selector"] == {}  # atomic LabelSelector
    assert f["f:spec"]["f:template"]["f:spec"]["f:containers"] == {
        'k:{"name":"c"}': {
            ".": {}, "f:image": {}, "f:name": {},
            "f:ports": {'k:{"containerPort":80,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}},
        }
    }


def test_reapply_changes_image_and_removes_dropped_label():
    obj = apply(None, deployment(labels={"app": "web", "tier": "fe"}), "kubectl", False, T0)
    obj = apply(obj, deployment(image="nginx:2"), "kubectl", False, T1)
    assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:2"
    assert obj["metadata"]["labels"] == {"app": "web"}
    assert entry(obj, "kubectl")["time"] == T1
    assert "f:tier" not in entry(obj, "kubectl")["fieldsV1"]["f:metadata"]["f:labels"]


def test_noop_reapply_keeps_time():
    obj = apply(None, deployment(), "kubectl", False, T0)
    again = apply(obj, deployment(), "kubectl", False, T1)
    assert entry(again, "kubectl")["time"] == T0
    assert again == obj


def test_dropped_field_owned_by_another_manager_stays():
    obj = apply(None, deployment(labels={"app": "web", "tier": "fe"}), "a", False, T0)
    obj = apply(obj, {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "web", "labels": {"tier": "fe"}}}, "b", False, T1)
    obj = apply(obj, deployment(), "a", False, T2)
    assert obj["metadata"]["labels"] == {"app": "web", "tier": "fe"}


def test_two_appliers_conflict_on_replicas_then_force_takes_over():
    obj = apply(None, deployment(replicas=2), "a", False, T0)
    other = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
             "spec": {"replicas": 5}}
    with pytest.raises(StatusError) as exc:
        apply(obj, other, "b", False, T1)
    status = exc.value.to_status()
    assert status["code"] == 409 and status["reason"] == "Conflict"
    assert status["message"] == 'Apply failed with 1 conflict: conflict with "a": .spec.replicas'
    assert status["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "a"', "field": ".spec.replicas"}]

    forced = apply(obj, other, "b", True, T1)
    assert forced["spec"]["replicas"] == 5
    assert "f:replicas" not in entry(forced, "a")["fieldsV1"]["f:spec"]
    assert "f:replicas" in entry(forced, "b")["fieldsV1"]["f:spec"]


def test_same_value_is_shared_without_conflict():
    obj = apply(None, deployment(replicas=2), "a", False, T0)
    obj = apply(obj, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                      "spec": {"replicas": 2}}, "b", False, T1)
    assert "f:replicas" in entry(obj, "a")["fieldsV1"]["f:spec"]
    assert "f:replicas" in entry(obj, "b")["fieldsV1"]["f:spec"]


def test_update_by_other_manager_then_apply_conflicts_with_upstream_message():
    obj = apply(None, deployment(replicas=2), "kubectl", False, T0)
    scaled = copy.deepcopy(obj)
    scaled["spec"]["replicas"] = 7
    scaled = track_update(obj, scaled, "kubectl-client-side-apply", T1)
    assert "f:replicas" in entry(scaled, "kubectl-client-side-apply")["fieldsV1"]["f:spec"]
    assert "f:replicas" not in entry(scaled, "kubectl")["fieldsV1"]["f:spec"]
    assert entry(scaled, "kubectl-client-side-apply")["operation"] == "Update"
    with pytest.raises(StatusError) as exc:
        apply(scaled, deployment(replicas=3), "kubectl", False, T2)
    assert exc.value.message == (
        'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" '
        "using apps/v1: .spec.replicas")
    assert exc.value.causes[0].field == ".spec.replicas"


def test_multiple_conflicts_message():
    obj = apply(None, deployment(), "a", False, T0)
    with pytest.raises(StatusError) as exc:
        apply(obj, deployment(image="x", replicas=9), "b", False, T1)
    assert exc.value.message == (
        'Apply failed with 2 conflicts: conflicts with "a":\n- .spec.replicas\n'
        '- .spec.template.spec.containers[name="c"].image')


def test_track_update_on_create_marks_added_maps_and_skips_system_fields():
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "uid": "u", "resourceVersion": "5", "labels": {"a": "b"}},
           "spec": {"containers": [{"name": "c", "image": "i"}]},
           "status": {"phase": "Pending"}}
    out = track_update(None, pod, "kubectl-create", T0)
    (e,) = out["metadata"]["managedFields"]
    assert e["operation"] == "Update" and e["apiVersion"] == "v1"
    assert e["fieldsV1"] == {
        "f:metadata": {"f:labels": {".": {}, "f:a": {}}},
        "f:spec": {"f:containers": {'k:{"name":"c"}': {".": {}, "f:image": {}, "f:name": {}}}},
    }
    status = track_update(out, {**out, "status": {"phase": "Running"}}, "kubelet", T1,
                          subresource="status")
    e = entry(status, "kubelet")
    assert e["subresource"] == "status" and e["fieldsV1"] == {"f:status": {"f:phase": {}}}


def test_track_update_without_changes_adds_no_manager_and_removal_drops_ownership():
    obj = apply(None, deployment(labels={"app": "web", "x": "1"}), "kubectl", False, T0)
    same = track_update(obj, copy.deepcopy(obj), "other", T1)
    assert [e["manager"] for e in same["metadata"]["managedFields"]] == ["kubectl"]
    edited = copy.deepcopy(obj)
    del edited["metadata"]["labels"]["x"]
    edited = track_update(obj, edited, "kubectl-label", T1)
    assert "f:x" not in entry(edited, "kubectl")["fieldsV1"]["f:metadata"]["f:labels"]


def test_unchanged_owners_keep_their_stored_tree_and_sent_trees_are_rendered_canonically():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b", "c": "d"}},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    created = track_update(None, pod, "creator", T0)
    status = track_update(created, {**created, "status": {"phase": "Running"}}, "kubelet", T1,
                          subresource="status")
    # The creator's fields did not change: the new version shares its tree, time kept.
    assert entry(status, "creator")["fieldsV1"] is entry(created, "creator")["fieldsV1"]
    assert entry(status, "creator")["time"] == T0
    # A client sends the same ownership with keys in another order: stored in canonical order.
    sent = copy.deepcopy(status)
    tree = entry(sent, "creator")["fieldsV1"]
    labels = tree["f:metadata"]["f:labels"]
    tree["f:metadata"]["f:labels"] = {k: labels[k] for k in reversed(list(labels))}
    sent["metadata"]["labels"]["c"] = "e"  # kubelet takes over label c
    out = track_update(status, sent, "kubelet", "2026-01-01T00:00:02Z")
    stored = entry(out, "creator")["fieldsV1"]
    assert list(stored["f:metadata"]["f:labels"]) == [".", "f:a"]
    unchanged = copy.deepcopy(out)
    unchanged["metadata"]["labels"]["c"] = "f"
    tree = entry(unchanged, "creator")["fieldsV1"]
    tree["f:metadata"]["f:labels"] = {"f:a": {}, ".": {}}  # same paths, other order
    again = track_update(out, unchanged, "kubelet", "2026-01-01T00:00:03Z")
    assert list(entry(again, "creator")["fieldsV1"]["f:metadata"]["f:labels"]) == [".", "f:a"]


def test_first_apply_on_untracked_object_sees_before_first_apply_owner():
    live = deployment(replicas=4)
    with pytest.raises(StatusError) as exc:
        apply(live, deployment(replicas=1), "kubectl", False, T0)
    assert f'"{BEFORE_FIRST_APPLY}" using apps/v1' in exc.value.message


def test_status_in_applied_config_is_ignored_on_main_resource_and_managed_fields_rejected():
    cfg = {**deployment(), "status": {"replicas": 99}}
    obj = apply(None, cfg, "kubectl", False, T0)
    assert "status" not in obj
    assert "f:status" not in entry(obj, "kubectl")["fieldsV1"]
    bad = deployment()
    bad["metadata"]["managedFields"] = []
    with pytest.raises(StatusError) as exc:
        apply(None, bad, "kubectl", False, T0)
    assert exc.value.code == 400 and exc.value.message == "metadata.managedFields must be nil"


def test_set_lists_and_paths_round_trip():
    obj = apply(None, {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "c", "finalizers": ["a/b"]}, "data": {"k": "v"}},
                "m", False, T0)
    f = entry(obj, "m")["fieldsV1"]
    assert f == {"f:data": {"f:k": {}}, "f:metadata": {"f:finalizers": {'v:"a/b"': {}}}}
    assert fields_to_v1(fields_from_v1(f)) == f
    assert path_string(("f:metadata", "f:finalizers", 'v:"a/b"')) == '.metadata.finalizers[="a/b"]'
    assert path_string(("f:spec", "f:ports", 'k:{"port":80,"protocol":"TCP"}')) == \
        '.spec.ports[port=80,protocol="TCP"]'


def test_create_fast_path_matches_general_tracking():
    """The one-pass FieldsV1 for creates equals the general path's result."""
    from kubeplane.api import apply as ssa

    objs = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}, "uid": "u",
                                                           "annotations": {}, "finalizers": ["x/y"]},
         "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                                  "env": [{"name": "A", "value": "1"}], "resources": {}}],
                  "tolerations": [{"key": "k", "operator": "Exists"}], "nodeSelector": {"z": "1"}},
         "status": {"phase": "Pending"}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}},
                  "template": {"metadata": {"labels": {"app": "d"}},
                               "spec": {"containers": [{"name": "c", "image": "i"}]}},
                  "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
         "spec": {"ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
                  "selector": {"a": "b"}, "clusterIPs": ["10.0.0.1"]}},
        {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "default",
                                                             "annotations": {'we"ird\\key': "x", "a/b": ""}},
         "involvedObject": {"kind": "Pod", "name": "p", "uid": "u"}, "reason": "R", "count": 1,
         "source": {}, "related": None},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv", "labels": {}},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                  "claimRef": {"name": "c", "namespace": "d"}, "csi": {"driver": "x", "volumeHandle": "h"},
                  "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "k", "operator": "In", "values": ["a", "b"]}]}]}}},
         "status": {"phase": "Bound"}},
    ]
    for obj in objs:
        for sub in ("", "status"):
            schema = ssa._schema_of(obj)
            general = ssa.fields_to_v1(ssa._tracked(ssa._flatten(obj, schema), sub))
            fast = ssa._owned_fields_v1(obj, schema, sub)
            assert orjson.dumps(fast) == orjson.dumps(general)  # same trees, same order at every level
            # a second time through the memos
            assert orjson.dumps(ssa._owned_fields_v1(obj, schema, sub)) == orjson.dumps(general)
    # objects written alike share one tree; another shape gets its own
    events = [{"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"e{i}", "namespace": "default"},
               "involvedObject": {"kind": "Pod", "name": f"p{i}", "uid": f"u{i}"}, "reason": f"R{i}",
               "count": i} for i in range(3)]
    schema = ssa._schema_of(events[0])
    trees = [ssa._owned_fields_v1(e, schema, "") for e in events]
    assert trees[0] is trees[1] is trees[2]
    assert trees[0] == ssa.fields_to_v1(ssa._tracked(ssa._flatten(events[2], schema), ""))
    labelled = {**events[0], "metadata": {**events[0]["metadata"], "labels": {"x": "y"}}}
    other = ssa._owned_fields_v1(labelled, schema, "")
    assert other is not trees[0] and other["f:metadata"] == {"f:labels": {".": {}, "f:x": {}}}


def test_owned_fields_of_objects_differing_in_values_share_levels_not_values() -> None:
    """Pods that differ only in values (each its own claim and node) get the
    reference FieldsV1 every time, through memos of their levels' shapes; the
    memo by JSON text admits a value on its second sight only, so values seen
    once do not push out the shared ones."""
    from kubeplane.api import apply as ssa

    def pod(i: int) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "default"},
                "spec": {"nodeName": f"n{i}", "containers": [{"name": "c", "image": "i"}],
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": f"claim-{i}"}}],
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "k", "operator": "In", "values": [f"z{i}"]}]}]}}}}}

    schema = ssa._schema_of(pod(0))
    want = ssa.fields_to_v1(ssa._tracked(ssa._flatten(pod(0), schema), ""))
    trees = [ssa._owned_fields_v1(pod(i), schema, "") for i in range(200)]
    assert all(orjson.dumps(t) == orjson.dumps(want) for t in trees)
    assert trees[0] is trees[-1]  # one shape, one shared tree

    def memoized(value: bytes) -> bool:
        return any(value in k[4] for k in ssa._owned_memo)

    # each pod's volumes and affinity were seen once: none of them entered the memo
    assert not any(memoized(f'"claim-{i}"'.encode()) or memoized(f'"z{i}"'.encode()) for i in range(200))
    # a value seen twice is admitted (objects made from one template)
    ssa._owned_fields_v1(pod(7), schema, "")
    assert memoized(b'"claim-7"') and memoized(b'"z7"')
    assert orjson.dumps(ssa._owned_fields_v1(pod(7), schema, "")) == orjson.dumps(want)


def _reference_compare(old, new, schema, sub):
    """The straightforward comparison: flatten both objects completely."""
    from kubeplane.api import apply as ssa
    from kubeplane.api.patch import json_equal

    a = ssa._tracked(ssa._flatten(old, schema), sub)
    b = ssa._tracked(ssa._flatten(new, schema), sub)
    modified = {p for p in set(a) & set(b)
                if a[p][0] != b[p][0] or (a[p][0] == ssa._LEAF and not json_equal(a[p][1], b[p][1]))}
    return set(b) - set(a), modified, set(a) - set(b)


def _random_pod(rng):
    containers = [{"name": f"c{i}", "image": rng.choice(["a", "b"]),
                   "ports": [{"containerPort": rng.choice([80, 81]), "protocol": "TCP"}][:rng.randint(0, 1)],
                   "env": [{"name": n, "value": rng.choice(["1", "2"])} for n in rng.sample("XYZ", rng.randint(0, 2))],
                   "resources": {"requests": {"cpu": rng.choice(["1", "2"])}} if rng.random() < 0.7 else {}}
                  for i in range(rng.randint(1, 2))]
    spec = {"containers": containers, "nodeSelector": {"z": rng.choice(["1", "2"])} if rng.random() < 0.5 else {},
            "priority": rng.choice([0, 1, True, 1.0]),
            "tolerations": [{"key": k, "operator": "Exists"} for k in rng.sample("kl", rng.randint(0, 2))]}
    if rng.random() < 0.3:
        spec["nodeName"] = rng.choice(["n1", "n2"])
    md = {"name": "p", "namespace": "d", "labels": {k: rng.choice(["x", "y"]) for k in rng.sample("abc", 2)},
          "finalizers": rng.sample(["f/1", "f/2", "f/3"], rng.randint(0, 2)), "resourceVersion": str(rng.randint(1, 9))}
    status = {"phase": rng.choice(["Pending", "Running"]),
              "conditions": [{"type": t, "status": rng.choice(["True", "False"])} for t in rng.sample(["A", "B"], 2)]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec, "status": status}


@pytest.mark.parametrize("seed", range(10))
def test_pruned_compare_and_memoized_fields_equal_the_full_computation(seed):
    """Skipping equal subtrees, and memoizing FieldsV1 decoding/encoding, change nothing:
    random pod pairs (including true vs 1 vs 1.0, reordered keys) compared both ways."""
    import random

    from kubeplane.api import apply as ssa

    rng = random.Random(seed)
    for _ in range(150):
        old = _random_pod(rng)
        new = _random_pod(rng) if rng.random() < 0.5 else copy.deepcopy(old)
        if rng.random() < 0.5:
            new["spec"] = copy.deepcopy(old["spec"])
            new["spec"]["priority"] = rng.choice([0, 1, True, 1.0])
        if rng.random() < 0.3:
            new["metadata"]["labels"] = dict(reversed(list(new["metadata"]["labels"].items())))
        schema = ssa._schema_of(old)
        for sub in ("", "status"):
            assert ssa._compare(old, new, schema, sub) == _reference_compare(old, new, schema, sub)
        paths = ssa._flatten(new, schema)
        tree = ssa.fields_to_v1(ssa._tracked(paths, ""))
        assert ssa._fields_from_v1_memo(tree) == (frozenset(ssa.fields_from_v1(tree)), True)  # canonical
        fields = ssa.fields_from_v1(tree)
        assert ssa._fields_to_v1_memo(fields) == tree
        # One shared tree per path set, known by identity as a stored object's tree.
        shared = ssa._fields_to_v1_memo(fields)
        assert ssa._fields_to_v1_memo(set(fields)) is shared
        assert ssa._stored_fields(shared) == (frozenset(fields), True)
        assert ssa._stored_fields(tree) == (frozenset(fields), True)  # another object, equal content


def test_sent_managed_fields_are_read_as_sent_each_time() -> None:
    """Trees a client sends are not taken for stored ones: the same dict, changed
    between two writes, is decoded anew."""
    old = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"},
           "data": {"a": "1", "b": "2"}}
    tree = {"f:data": {"f:a": {}}}
    sent = [{"manager": "m", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": tree}]

    def owned(entries: list) -> dict:
        return {e["manager"]: e["fieldsV1"] for e in entries}

    out = track_update(old, {**old, "metadata": {**old["metadata"], "managedFields": sent}}, "x",
                           "2026-01-01T00:00:00Z")
    assert owned(out["metadata"]["managedFields"]) == {"m": {"f:data": {"f:a": {}}}}
    tree["f:data"]["f:b"] = {}
    out = track_update(old, {**old, "metadata": {**old["metadata"], "managedFields": sent}}, "x",
                           "2026-01-01T00:00:00Z")
    assert owned(out["metadata"]["managedFields"]) == {"m": {"f:data": {"f:a": {}, "f:b": {}}}}
