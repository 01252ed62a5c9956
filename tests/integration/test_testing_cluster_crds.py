"""kubeplane.testing.Cluster(crds=PATH): CustomResourceDefinitions installed
before the cluster is handed over, Established, as envtest's
CRDInstallOptions install them."""

from __future__ import annotations

import pytest

from kubeplane.testing import Cluster, ManifestError

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {{plural: {plural}, kind: {kind}}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {{type: object, properties: {{size: {{type: integer}}}}}}
"""


def test_crds_from_a_directory_are_established_at_start(tmp_path):
    (tmp_path / "a.yaml").write_text(CRD.format(plural="apples", kind="Apple"))
    (tmp_path / "b.yaml").write_text(CRD.format(plural="pears", kind="Pear"))
    (tmp_path / "notes.txt").write_text("not a manifest")
    obj = {"apiVersion": "example.com/v1", "kind": "Apple", "metadata": {"name": "x"}, "spec": {"size": 3}}
    with Cluster(crds=tmp_path, manifests=[obj]) as c:
        for name in ("apples.example.com", "pears.example.com"):
            crd = c.get("customresourcedefinitions", name)
            conds = {x["type"]: x["status"] for x in crd["status"]["conditions"]}
            assert conds["Established"] == "True"
        # served at once, through the official client too
        from kubernetes import client

        api = client.CustomObjectsApi(c.api_client())
        got = api.get_namespaced_custom_object("example.com", "v1", "default", "apples", "x")
        assert got["spec"] == {"size": 3}
        c.apply({"apiVersion": "example.com/v1", "kind": "Pear", "metadata": {"name": "p"}})
        assert c.wait_for("pears.example.com/p")["metadata"]["name"] == "p"


async def test_crds_from_a_file_in_the_async_form(tmp_path):
    path = tmp_path / "crd.yaml"
    path.write_text(CRD.format(plural="plums", kind="Plum"))
    async with Cluster(crds=str(path)) as c:
        crd = await c.get_async("crd", "plums.example.com")
        assert {x["type"]: x["status"] for x in crd["status"]["conditions"]}["Established"] == "True"


def test_a_missing_path_or_another_kind_fails_the_start(tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        with Cluster(crds=tmp_path / "missing"):
            pass
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError, match="is not a CustomResourceDefinition"):
        with Cluster(crds=tmp_path / "cm.yaml"):
            pass
