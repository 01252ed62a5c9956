"""The rule matcher shared by the admission webhooks and ValidatingAdmissionPolicy."""

from kubeplane.api.resources import resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.registry.admissionrules import Rule, object_selector_matches

DEPLOYMENTS = resource("deployments", "apps")
CMS = resource("configmaps")


def test_resource_names_narrow_a_rule() -> None:
    r = Rule.from_dict({"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                        "resourceNames": ["a"]})
    assert r.matches("UPDATE", CMS, "default", "", "a")
    assert not r.matches("UPDATE", CMS, "default", "", "b")


def test_equivalent_matches_an_older_group_exact_does_not() -> None:
    r = Rule.from_dict({"operations": ["CREATE"], "apiGroups": ["extensions"], "apiVersions": ["v1beta1"],
                        "resources": ["deployments"]})
    assert r.matches("CREATE", DEPLOYMENTS, "default", "", equivalent=True)
    assert not r.matches("CREATE", DEPLOYMENTS, "default", "")
    assert not r.matches("CREATE", resource("pods"), "default", "", equivalent=True)


def test_malformed_rule_matches_nothing() -> None:
    assert not Rule.from_dict({"operations": "CREATE", "resources": [1]}).matches("CREATE", CMS, "default", "")
    assert not Rule.from_dict(None).matches("CREATE", CMS, "default", "")


def test_object_selector_reads_new_or_old_object() -> None:
    sel = label_selector_from_dict({"matchLabels": {"app": "web"}})
    web = {"metadata": {"labels": {"app": "web"}}}
    other = {"metadata": {"labels": {"app": "db"}}}
    assert object_selector_matches(sel, web, None)
    assert object_selector_matches(sel, None, web)  # a DELETE has only the old object
    assert not object_selector_matches(sel, other, None)
    assert not object_selector_matches(sel, None, None)
    assert object_selector_matches(label_selector_from_dict({}), None, None)
