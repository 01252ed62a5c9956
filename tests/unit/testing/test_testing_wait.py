"""kubeplane.testing's wait conditions (kubectl wait's --for) and manifest reading."""

from __future__ import annotations

import pytest

from kubeplane.testing import JsonPath, ManifestError, load_documents, resolve_resource
from kubeplane.testing._wait import format_value, make_predicate, parse_for

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "generation": 2, "labels": {"app.kubernetes.io/name": "web"}},
    "spec": {"containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 80}]},
                            {"name": "b", "image": "y"}]},
    "status": {
        "phase": "Running",
        "observedGeneration": 2,
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "PodScheduled", "status": "True", "observedGeneration": 1},
            {"type": "Initialized", "status": "False"},
        ],
        "containerStatuses": [{"name": "a", "ready": True, "restartCount": 0}],
    },
}


def met(**kw) -> bool:
    kw.setdefault("for_", None)
    kw.setdefault("condition", None)
    kw.setdefault("jsonpath", None)
    kw.setdefault("delete", False)
    return make_predicate(**kw).met(POD)


def test_condition_names_statuses_and_case():
    assert met(condition="Ready")
    assert met(condition="ready")
    assert met(condition="condition=Ready=true")
    assert not met(condition="Ready=False")
    assert met(condition="Initialized=False")
    assert not met(condition="Initialized")
    assert not met(condition="Missing")


def test_condition_older_than_the_generation_is_not_met():
    # PodScheduled says it observed generation 1 while the object is at 2.
    assert not met(condition="PodScheduled")
    stale = {**POD, "status": {**POD["status"], "observedGeneration": 1}}
    assert not make_predicate(for_=None, condition="Ready", jsonpath=None, delete=False).met(stale)


def test_jsonpath_values_and_presence():
    assert met(jsonpath="{.status.phase}=Running")
    assert not met(jsonpath="{.status.phase}=Pending")
    assert met(jsonpath='{.status.conditions[?(@.type=="Ready")].status}=True')
    assert met(jsonpath="{.status.containerStatuses[0].ready}=true")
    assert met(jsonpath="{.status.containerStatuses[0].restartCount}=0")
    assert met(jsonpath="{.metadata.labels['app.kubernetes.io/name']}=web")
    assert met(jsonpath="{.status.phase}")
    assert not met(jsonpath="{.status.podIP}")
    assert met(for_="jsonpath={.spec.containers[-1].name}=b")


def test_jsonpath_refuses_ambiguous_and_nested_values():
    with pytest.raises(ValueError, match="more than one value"):
        met(jsonpath="{.spec.containers[*].name}=a")
    with pytest.raises(ValueError, match="nested object"):
        met(jsonpath="{.status}=x")
    with pytest.raises(ValueError, match="value after equal sign"):
        met(jsonpath="{.status.phase}=")
    with pytest.raises(ValueError, match="cannot be empty"):
        met(jsonpath="{}")
    with pytest.raises(ValueError, match="unclosed"):
        met(jsonpath="{.status.phase=Running")


def test_jsonpath_relaxed_forms_as_kubectl():
    # Braces and the leading dot may go, the value may be quoted, == stays inside filters.
    assert met(jsonpath=".status.phase=Running")
    assert met(jsonpath="status.phase=Running")
    assert met(jsonpath="{status.phase}='Running'")
    assert met(jsonpath='.status.conditions[?(@.type=="Ready")].status="True"')
    assert not met(jsonpath="status.phase=Pending")
    assert met(jsonpath="status.phase")


def test_jsonpath_finds():
    assert JsonPath(".spec.containers[*].name").find(POD) == ["a", "b"]
    assert JsonPath(".spec.containers[0:1].image").find(POD) == ["x"]
    assert JsonPath("..containerPort").find(POD) == [80]
    assert JsonPath(".status.conditions[?(@.status!='True')].type").find(POD) == ["Initialized"]
    assert JsonPath(".status.conditions[?(@.observedGeneration)].type").find(POD) == ["PodScheduled"]
    assert JsonPath(".status.conditions[?(@.observedGeneration < 2)].type").find(POD) == ["PodScheduled"]
    assert JsonPath(".spec.missing[0]").find(POD) == []
    with pytest.raises(ValueError):
        JsonPath(".a[?(@.b ~= 1)]")


def test_format_value_prints_as_kubectl():
    assert [format_value(v) for v in (True, False, 3, 2.0, 1.5, "x", None)] == \
        ["true", "false", "3", "2", "1.5", "x", "<nil>"]


def test_for_syntax_and_conflicting_options():
    assert parse_for("delete").delete
    assert parse_for("create").met({})
    with pytest.raises(ValueError, match="unrecognized condition"):
        parse_for("ready")
    with pytest.raises(ValueError, match="not condition and jsonpath"):
        make_predicate(for_=None, condition="Ready", jsonpath="{.a}", delete=False)
    with pytest.raises(TypeError):
        make_predicate(for_=None, condition=3, jsonpath=None, delete=False)


def test_callable_condition_is_marked_as_the_callers():
    p = make_predicate(for_=None, condition=lambda o: o["status"]["phase"] == "Running", jsonpath=None,
                       delete=False)
    assert p.user and p.met(POD)


def test_resolve_resource_names_as_kubectl():
    assert resolve_resource("pods")[0].kind == "Pod"
    assert resolve_resource("po")[0].kind == "Pod"
    assert resolve_resource("Pod")[0].kind == "Pod"
    res, name = resolve_resource("deployments.apps/web")
    assert (res.kind, res.group, name) == ("Deployment", "apps", "web")
    assert resolve_resource("deploy", "web") == (res, "web")
    with pytest.raises(ValueError, match="two names"):
        resolve_resource("deploy/a", "b")
    with pytest.raises(ValueError, match='resource type "widgets"'):
        resolve_resource("widgets")


def test_manifests_from_text_files_and_directories(tmp_path):
    text = """
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
---
# only a comment
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}
- {apiVersion: v1, kind: Secret, metadata: {name: c}}
"""
    assert [d["metadata"]["name"] for d, _ in load_documents(text)] == ["a", "b", "c"]
    (tmp_path / "2.yaml").write_text(text)
    (tmp_path / "1.json").write_text('{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}')
    (tmp_path / "notes.txt").write_text("not a manifest")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "x.yml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    names = [d["metadata"]["name"] for d, _ in load_documents(tmp_path)]
    assert names == ["n", "a", "b", "c"]
    assert [d["metadata"]["name"] for d, _ in load_documents(str(tmp_path), recursive=True)][-1] == "x"
    docs = load_documents(str(tmp_path / "2.yaml"))
    assert docs[0][1] == str(tmp_path / "2.yaml")
    assert load_documents({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}})[0][1] == "<object>"


def test_manifest_errors(tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        load_documents(str(tmp_path / "missing.yaml"))
    with pytest.raises(ManifestError, match="apiVersion and kind"):
        load_documents("metadata: {name: a}\n")
    with pytest.raises(ManifestError, match="error parsing"):
        load_documents("a: [\n")
    with pytest.raises(ManifestError, match="not an object"):
        load_documents("- 1\n- 2\n")
    with pytest.raises(ManifestError, match="no .yaml"):
        load_documents(tmp_path)
