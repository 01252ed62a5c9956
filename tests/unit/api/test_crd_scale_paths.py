"""CRD scale subresource replica paths: one check for spec and status."""

from kubeplane.api.validation.apiextensions import _replicas_path


def messages(value, under):
    return [(c.field, c.message) for c in _replicas_path(value, f"s.{under[1:]}ReplicasPath", under)]


def test_replica_paths() -> None:
    assert messages(".spec.replicas", ".spec") == []
    assert messages(".status.replicas", ".status") == []
    assert messages("", ".spec")[0][1].startswith("Required value")
    for value in (".spec", ".status.replicas", ".specx.replicas"):
        assert "should be a json path under .spec" in messages(value, ".spec")[0][1]
    assert "should be a json path under .status" in messages(".spec.replicas", ".status")[0][1]
