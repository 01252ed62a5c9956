"""Switching from client-side to server-side apply: kubectl's server-side
apply may take over fields its last-applied annotation still describes
(upstream's lastAppliedManager), and keeps that annotation in step
(lastAppliedUpdater)."""

import copy

import orjson
import pytest

from kubeplane.api.apply import LAST_APPLIED_ANNOTATION, apply, track_update
from kubeplane.api.errors import StatusError

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"


def config(a="1", b="2", api_version="v1"):
    return {"apiVersion": api_version, "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"}, "data": {"a": a, "b": b}}


def client_side_applied(cfg):
    """The object kubectl's client-side apply creates: the config plus its
    last-applied annotation, owned by kubectl-client-side-apply."""
    obj = copy.deepcopy(cfg)
    last = copy.deepcopy(cfg)
    last["metadata"]["annotations"] = {}
    obj["metadata"]["annotations"] = {
        LAST_APPLIED_ANNOTATION: orjson.dumps(last, option=orjson.OPT_SORT_KEYS).decode() + "\n"}
    return track_update(None, obj, "kubectl-client-side-apply", T0)


def managers(obj):
    return {e["manager"]: e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


def test_kubectl_server_side_apply_takes_over_client_side_fields():
    live = client_side_applied(config())
    out = apply(live, config(a="3"), "kubectl", False, T1)
    assert out["data"] == {"a": "3", "b": "2"}
    owners = managers(out)
    assert owners["kubectl"] == {"f:data": {"f:a": {}, "f:b": {}}}
    # The client-side manager lost the changed field, keeps the shared one.
    assert "f:a" not in owners["kubectl-client-side-apply"]["f:data"]
    assert "f:b" in owners["kubectl-client-side-apply"]["f:data"]
    # The annotation now describes what was applied server-side.
    annotation = out["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]
    assert annotation == ('{"apiVersion":"v1","data":{"a":"3","b":"2"},"kind":"ConfigMap",'
                          '"metadata":{"name":"c","namespace":"default"}}\n')


def test_other_managers_still_conflict():
    live = client_side_applied(config())
    with pytest.raises(StatusError) as exc:
        apply(live, config(a="3"), "other", False, T1)
    assert exc.value.code == 409
    assert exc.value.message == 'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using v1: .data.a'


def test_fields_changed_since_the_last_client_side_apply_still_conflict():
    live = client_side_applied(config())
    edited = copy.deepcopy(live)
    edited["data"]["a"] = "5"
    edited = track_update(live, edited, "kubectl-edit", T1)
    with pytest.raises(StatusError) as exc:
        apply(edited, config(a="3", b="4"), "kubectl", False, T2)
    # b is still as last applied: allowed; a was edited since: a conflict.
    assert exc.value.message == 'Apply failed with 1 conflict: conflict with "kubectl-edit" using v1: .data.a'


def test_annotation_of_another_version_allows_nothing():
    cfg = config()
    live = client_side_applied(cfg)
    last = orjson.loads(live["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    last["apiVersion"] = "v2"
    live["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = orjson.dumps(last).decode()
    with pytest.raises(StatusError):
        apply(live, config(a="3"), "kubectl", False, T1)


def test_no_annotation_is_added_when_there_was_none():
    out = apply(None, config(), "kubectl", False, T0)
    assert "annotations" not in out["metadata"]
    out = apply(out, config(a="<&>"), "kubectl", False, T1)
    assert "annotations" not in out["metadata"]


def test_annotation_is_encoded_as_go_does():
    live = client_side_applied(config())
    out = apply(live, config(a="1", b="<&>"), "kubectl", False, T1)
    assert '"b":"\\u003c\\u0026\\u003e"' in out["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]
