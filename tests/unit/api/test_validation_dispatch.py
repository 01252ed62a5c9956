"""The validation dispatch runs each resource's built-in checks once, then the
extra validators (DRA's CEL checks), without repeating a cause."""

from kubeplane.api import validation
from kubeplane.api.resources import resource
from kubeplane.dra.validation import install

CLAIMS = resource("resourceclaims")


def test_dra_causes_follow_builtin_ones_once_and_builtin_checks_run_once(monkeypatch):
    install()
    name_fn, check, update_check = validation.VALIDATORS[CLAIMS.qualified]
    calls = []

    def counting(obj):
        calls.append(1)
        return check(obj)

    monkeypatch.setitem(validation.VALIDATORS, CLAIMS.qualified, (name_fn, counting, update_check))
    claim = {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "", "selectors": [{"cel": {"expression": "1 +"}}]}}]}}}
    causes = validation.validate_object(CLAIMS, claim)
    assert len(calls) == 1  # the DRA validator no longer re-runs the built-in checks
    fields = [(c.field, c.reason) for c in causes]
    assert fields == [("spec.devices.requests[0].exactly.deviceClassName", "FieldValueRequired"),
                      ("spec.devices.requests[0].exactly.selectors[0].cel.expression", "FieldValueInvalid")]
