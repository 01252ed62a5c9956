import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.selectors import (
    FieldSelector,
    LabelSelector,
    field_value,
    label_selector_from_dict,
    label_selector_from_set,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"app": "web", "tier": "front", "version": "3"}


@pytest.mark.parametrize(
    "text,labels,expected",
    [
        ("", LABELS, True),
        ("app=web", LABELS, True),
        ("app==web", LABELS, True),
        ("app=db", LABELS, False),
        ("app!=db", LABELS, True),
        ("app!=web", LABELS, False),
        ("missing!=x", LABELS, True),
        ("app in (web,db)", LABELS, True),
        ("app in (db)", LABELS, False),
        ("missing in (a)", LABELS, False),
        ("app notin (db)", LABELS, True),
        ("app notin (web)", LABELS, False),
        ("missing notin (a)", LABELS, True),
        ("app", LABELS, True),
        ("missing", LABELS, False),
        ("!missing", LABELS, True),
        ("!app", LABELS, False),
        ("app=web,tier=front", LABELS, True),
        ("app=web,tier=back", LABELS, False),
        ("  app = web ,  tier  in  ( front , back )  ", LABELS, True),
        ("version>2", LABELS, True),
        ("version<3", LABELS, False),
        ("app>1", LABELS, False),
        ("app=web", None, False),
        ("!app", None, True),
        ("x=", {"x": ""}, True),
        ("x=", {}, False),
        ("x in ()", {"x": ""}, True),
        ("x in (,a)", {"x": ""}, True),
        ("x in (in, notin)", {"x": "notin"}, True),
        ("example.com/role=db", {"example.com/role": "db"}, True),
    ],
)
def test_label_selector_matching(text, labels, expected):
    assert parse_label_selector(text).matches(labels) is expected


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("b=1,a=2", "a=2,b=1"),
        ("a in (z,b,b)", "a in (b,z)"),
        ("x notin (b,a),!y,z", "x notin (a,b),!y,z"),
        ("a==1", "a==1"),
        ("a != 1", "a!=1"),
        ("n>5", "n>5"),
        ("", ""),
    ],
)
def test_label_selector_canonical_string(text, canonical):
    assert str(parse_label_selector(text)) == canonical


@pytest.mark.parametrize(
    "text,message",
    [
        ("app=web x", "found 'x', expected: ',' or 'end of string'"),
        ("app=web,", "found '', expected: identifier after ','"),
        ("=web", "found '=', expected: !, identifier, or 'end of string'"),
        ("env IN (a)", "unable to parse requirement: found 'IN', expected: in, notin, =, ==, !=, gt, lt"),
        ("x in a", "unable to parse requirement: found 'a' expected: '('"),
        ("x in (a b)", "unable to parse requirement: found 'b', expected: ',' or ')'"),
        ("!!x", "unable to parse requirement: found '!', expected: identifier"),
        ("!a=b", "found '=', expected: ',' or 'end of string'"),
        ("a=b=c", "found '=', expected: ',' or 'end of string'"),
        ("a>x", "unable to parse requirement: values[0]: Invalid value: \"x\": "
                "for 'Gt', 'Lt' operators, the value must be an integer"),
    ],
)
def test_label_selector_syntax_errors(text, message):
    with pytest.raises(StatusError) as ei:
        parse_label_selector(text)
    assert ei.value.code == 400 and ei.value.reason == "BadRequest"
    assert ei.value.message == message


def test_invalid_label_key_message_is_upstream():
    with pytest.raises(StatusError) as ei:
        parse_label_selector("a:=b")
    assert ei.value.message == (
        "unable to parse requirement: <nil>: Invalid value: \"a:\": name part must consist of alphanumeric "
        "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  "
        "or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )


def test_invalid_label_value_message_is_upstream():
    with pytest.raises(StatusError) as ei:
        parse_label_selector("app=a$b")
    assert ei.value.message.startswith(
        'unable to parse requirement: values[0][app]: Invalid value: "a$b": a valid label must be an empty '
        "string or consist of alphanumeric characters"
    )


def test_value_too_long():
    with pytest.raises(StatusError, match="must be no more than 63 characters"):
        parse_label_selector("app=" + "a" * 64)


def test_empty_and_requires_exact_match():
    assert parse_label_selector("").empty
    sel = parse_label_selector("app=web,tier in (a,b)")
    assert not sel.empty
    assert sel.requires_exact_match("app") == "web"
    assert sel.requires_exact_match("tier") is None
    assert sel.requires_exact_match("nope") is None


def test_from_dict_none_matches_nothing_and_empty_matches_everything():
    nothing = label_selector_from_dict(None)
    assert not nothing.matches({}) and not nothing.matches(LABELS)
    assert not nothing.empty and nothing.matches_nothing
    everything = label_selector_from_dict({})
    assert everything.empty and everything.matches({}) and everything.matches(LABELS)
    assert label_selector_from_dict({"matchLabels": {}, "matchExpressions": []}).empty


def test_from_dict_match_labels_and_expressions():
    sel = label_selector_from_dict({
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "back"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "version", "operator": "Exists"},
            {"key": "zone", "operator": "NotIn", "values": ["a"]},
        ],
    })
    assert sel.matches(LABELS)
    assert not sel.matches({**LABELS, "canary": "1"})
    assert not sel.matches({**LABELS, "zone": "a"})
    assert not sel.matches({"app": "web", "tier": "front"})
    assert str(sel) == "app=web,!canary,tier in (back,front),version,zone notin (a)"


@pytest.mark.parametrize(
    "sel,message",
    [
        ({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, '"Bogus" is not a valid label selector operator'),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
         "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty"),
        ({"matchLabels": {"a b": "c"}}, 'key: Invalid value: "a b": name part must consist'),
    ],
)
def test_from_dict_errors(sel, message):
    with pytest.raises(StatusError) as ei:
        label_selector_from_dict(sel)
    assert ei.value.code == 400
    assert ei.value.message.startswith(message)


def test_from_set():
    sel = label_selector_from_set({"b": "2", "a": "1"})
    assert str(sel) == "a=1,b=2"
    assert sel.matches({"a": "1", "b": "2", "c": "3"}) and not sel.matches({"a": "1"})
    assert label_selector_from_set(None).empty


def test_selectors_compare_by_content():
    assert parse_label_selector("a=1,b=2") == parse_label_selector("b=2, a=1")
    assert isinstance(hash(parse_label_selector("a")), int)
    assert LabelSelector() != label_selector_from_dict(None)


POD = {
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {"nodeName": "n1", "restartPolicy": "Always", "schedulerName": "default-scheduler",
             "serviceAccountName": "default", "hostNetwork": True},
    "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}], "nominatedNodeName": "n2"},
}


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", True),
        ("metadata.name=web", True),
        ("metadata.name==web", True),
        ("metadata.name!=web", False),
        ("metadata.namespace=default", True),
        ("spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed", True),
        ("spec.nodeName=", False),
        ("spec.hostNetwork=true", True),
        ("spec.restartPolicy=Never", False),
        ("spec.schedulerName=default-scheduler", True),
        ("spec.serviceAccountName=default", True),
        ("status.podIP=10.0.0.5", True),
        ("status.nominatedNodeName=n2", True),
    ],
)
def test_pod_field_selectors(text, expected):
    assert parse_field_selector(text, "pods").matches(POD) is expected


def test_unscheduled_pods_match_empty_node_name():
    sel = parse_field_selector("spec.nodeName=", "pods")
    assert sel.matches({"metadata": {"name": "x"}, "spec": {}})
    assert parse_field_selector("spec.hostNetwork=false", "pods").matches({"spec": {}})


def test_event_field_selectors():
    ev = {
        "metadata": {"name": "web.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default", "uid": "u1"},
        "reason": "Scheduled", "source": {"component": "default-scheduler"}, "type": "Normal",
        "reportingComponent": "default-scheduler",
    }
    sel = parse_field_selector(
        "involvedObject.name=web,involvedObject.namespace=default,involvedObject.uid=u1", "events")
    assert sel.matches(ev)
    assert parse_field_selector("source=default-scheduler,type=Normal,reason=Scheduled", "events").matches(ev)
    assert not parse_field_selector("involvedObject.kind=Node", "events").matches(ev)
    assert parse_field_selector("reportingComponent=default-scheduler", "events").matches(ev)


@pytest.mark.parametrize(
    "plural,text,obj,expected",
    [
        ("nodes", "spec.unschedulable=true", {"spec": {"unschedulable": True}}, True),
        ("nodes", "spec.unschedulable=false", {"spec": {}}, True),
        ("namespaces", "status.phase=Active", {"status": {"phase": "Active"}}, True),
        ("secrets", "type=Opaque", {"type": "Opaque"}, True),
        ("replicasets", "status.replicas=0", {"status": {}}, True),
        ("replicasets", "status.replicas=2", {"status": {"replicas": 2}}, True),
        ("jobs", "status.successful=1", {"status": {"succeeded": 1}}, True),
        ("configmaps", "metadata.name=cfg", {"metadata": {"name": "cfg"}}, True),
    ],
)
def test_per_resource_fields(plural, text, obj, expected):
    assert parse_field_selector(text, plural).matches(obj) is expected


@pytest.mark.parametrize(
    "plural,text,field",
    [
        ("pods", "spec.foo=bar", "spec.foo"),
        ("configmaps", "type=x", "type"),
        ("nodes", "status.phase=x", "status.phase"),
        ("persistentvolumeclaims", "spec.volumeName=x", "spec.volumeName"),
    ],
)
def test_unsupported_field_label(plural, text, field):
    with pytest.raises(StatusError) as ei:
        parse_field_selector(text, plural)
    assert ei.value.code == 400
    assert ei.value.message == f"field label not supported: {field}"


def test_field_selector_syntax_error():
    with pytest.raises(StatusError) as ei:
        parse_field_selector("metadata.name", "pods")
    assert ei.value.message == "invalid selector: 'metadata.name'; can't understand 'metadata.name'"


def test_field_selector_escapes_and_string():
    sel = parse_field_selector(r"metadata.name=a\,b", "configmaps")
    assert sel.matches({"metadata": {"name": "a,b"}})
    assert str(sel) == r"metadata.name=a\,b"
    assert sel.requires_exact_match("metadata.name") == "a,b"
    assert parse_field_selector("", "pods").empty
    assert isinstance(parse_field_selector("", "pods"), FieldSelector)
    with pytest.raises(StatusError, match="invalid escape sequence"):
        parse_field_selector(r"metadata.name=a\x", "pods")


def test_field_value_helper():
    assert field_value(POD, "spec.nodeName") == "n1"
    assert field_value(POD, "spec.hostNetwork", "pods") == "true"
    assert field_value(POD, "status.podIP") == "10.0.0.5"
    assert field_value({"status": {"podIP": "1.2.3.4"}}, "status.podIP", "pods") == "1.2.3.4"
    assert field_value({}, "metadata.name") == ""


def test_requirements_can_be_built_directly():
    from kubeplane.api.selectors import Requirement

    sel = LabelSelector((Requirement("tier", "in", ("b", "a", "a")), Requirement("app", "=", ("web",))))
    assert str(sel) == "app=web,tier in (a,b)"
    assert sel.matches({"app": "web", "tier": "a"}) and not sel.matches({"app": "web", "tier": "c"})
    assert parse_label_selector("env=prod").add(Requirement("canary", "!")).matches({"env": "prod"})
