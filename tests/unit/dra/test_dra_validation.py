"""Validation of DeviceClass, ResourceClaim, ResourceClaimTemplate and ResourceSlice."""

from __future__ import annotations

import copy

from kubeplane.dra.validation import validate_dra


def fields(causes):
    return [c.field for c in causes]


def claim(requests, constraints=None):
    d = {"requests": requests}
    if constraints is not None:
        d["constraints"] = constraints
    return {"metadata": {"name": "c"}, "spec": {"devices": d}}


def ok_req(name="gpu", **kw):
    e = {"deviceClassName": "gpu-class"}
    e.update(kw)
    return {"name": name, "exactly": e}


def test_valid_claim_and_template():
    c = claim([ok_req(selectors=[{"cel": {"expression": 'device.driver == "x"'}}]),
               {"name": "alt", "firstAvailable": [{"name": "a", "deviceClassName": "x"}, {"name": "b", "deviceClassName": "y"}]}],
              constraints=[{"requests": ["gpu", "alt/b"], "matchAttribute": "gpu.example.com/numa"}])
    assert validate_dra("ResourceClaim", c, None) == []
    tmpl = {"metadata": {"name": "t"}, "spec": {"spec": c["spec"]}}
    assert validate_dra("ResourceClaimTemplate", tmpl, None) == []


def test_claim_selector_compile_error_names_field():
    c = claim([ok_req(), ok_req("other", selectors=[{"cel": {"expression": "noSuchVar"}}])])
    causes = validate_dra("ResourceClaim", c, None)
    assert fields(causes) == ["spec.devices.requests[1].exactly.selectors[0].cel.expression"]
    assert "undeclared reference" in causes[0].message and causes[0].reason == "FieldValueInvalid"


def test_claim_request_errors():
    c = claim([
        ok_req("Bad_Name"),
        ok_req("dup"), ok_req("dup"),
        {"name": "both", "exactly": {"deviceClassName": "x"}, "firstAvailable": [{"name": "a", "deviceClassName": "x"}]},
        {"name": "neither"},
        {"name": "noclass", "exactly": {}},
        ok_req("mode", allocationMode="Some"),
        ok_req("zero", count=0),
    ], constraints=[{"requests": ["nope"], "matchAttribute": "gpu.example.com/numa"}, {"matchAttribute": "numa"}])
    f = fields(validate_dra("ResourceClaim", c, None))
    assert f == [
        "spec.devices.requests[0].name",
        "spec.devices.requests[2].name",
        "spec.devices.requests[3]",
        "spec.devices.requests[4]",
        "spec.devices.requests[5].exactly.deviceClassName",
        "spec.devices.requests[6].exactly.allocationMode",
        "spec.devices.requests[7].exactly.count",
        "spec.devices.constraints[0].requests[0]",
        "spec.devices.constraints[1].matchAttribute",
    ]


def test_template_paths_and_subrequest_admin():
    tmpl = {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [
        {"name": "r", "firstAvailable": [{"name": "s", "deviceClassName": "x", "adminAccess": True,
                                          "selectors": [{"cel": {"expression": "1 +"}}]}]}]}}}}
    assert fields(validate_dra("ResourceClaimTemplate", tmpl, None)) == [
        "spec.spec.devices.requests[0].firstAvailable[0].selectors[0].cel.expression",
        "spec.spec.devices.requests[0].firstAvailable[0].adminAccess",
    ]


def test_claim_spec_immutable():
    old = claim([ok_req()])
    new = copy.deepcopy(old)
    assert validate_dra("ResourceClaim", new, old) == []
    new["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    causes = validate_dra("ResourceClaim", new, old)
    assert fields(causes) == ["spec"] and "field is immutable" in causes[0].message


def test_device_class():
    dc = {"metadata": {"name": "x"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "a"'}}, {"cel": {"expression": "device.nope("}},
                                                            {}]}}
    assert fields(validate_dra("DeviceClass", dc, None)) == ["spec.selectors[1].cel.expression", "spec.selectors[2].cel"]


def rslice(**spec):
    base = {"driver": "gpu.example.com", "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "n1", "devices": [{"name": "d0", "attributes": {"v": {"version": "1.0.0"}}}]}
    base.update(spec)
    return {"metadata": {"name": "s"}, "spec": base}


def test_resource_slice():
    assert validate_dra("ResourceSlice", rslice(), None) == []
    assert fields(validate_dra("ResourceSlice", rslice(driver=""), None)) == ["spec.driver"]
    assert fields(validate_dra("ResourceSlice", rslice(pool={"name": "p", "generation": 0, "resourceSliceCount": 0}), None)) == [
        "spec.pool.resourceSliceCount"]
    assert fields(validate_dra("ResourceSlice", rslice(nodeName=None), None)) == ["spec"]
    assert fields(validate_dra("ResourceSlice", rslice(allNodes=True), None)) == ["spec"]
    dup = rslice(devices=[{"name": "d0"}, {"name": "d0"}, {"name": "d1", "attributes": {"v": {"version": "one"}}}])
    assert fields(validate_dra("ResourceSlice", dup, None)) == ["spec.devices[1].name", "spec.devices[2].attributes[v].version"]
    sel = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "region", "operator": "In", "values": ["r1"]}]}]}
    assert validate_dra("ResourceSlice", rslice(nodeName=None, nodeSelector=sel), None) == []
