"""meta_of and the one without_managed_fields (apply's copy of it is gone)."""

from kubeplane.api.meta import meta_of, without_managed_fields


def test_meta_of():
    md = {"name": "a"}
    assert meta_of({"metadata": md}) is md
    assert meta_of({}) == {} and meta_of({"metadata": None}) == {}


def test_without_managed_fields_shares_or_copies_as_asked():
    plain = {"metadata": {"name": "a"}, "spec": {"x": 1}}
    assert without_managed_fields(plain) is plain
    fresh = without_managed_fields(plain, fresh=True)
    assert fresh == plain and fresh is not plain and fresh["metadata"] is not plain["metadata"]
    assert fresh["spec"] is plain["spec"]  # only the top level and metadata are new
    managed = {"metadata": {"name": "a", "managedFields": [{"manager": "m"}]}, "spec": {}}
    for out in (without_managed_fields(managed), without_managed_fields(managed, fresh=True)):
        assert out == {"metadata": {"name": "a"}, "spec": {}}
        assert "managedFields" in managed["metadata"]  # the input is untouched
    assert without_managed_fields({}, fresh=True) == {}
