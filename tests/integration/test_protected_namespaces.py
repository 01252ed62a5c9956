"""kubectl against the namespaces upstream protects, and the collection of
namespaces that upstream does not let anyone delete at once."""

from __future__ import annotations

import json


def test_kubectl_cannot_delete_the_protected_namespaces(kubectl):
    for name in ("default", "kube-system", "kube-public"):
        r = kubectl("delete", "namespace", name, check=False)
        assert r.rc == 1
        assert (f'Error from server (Forbidden): namespaces "{name}" is forbidden: '
                "this namespace may not be deleted") in r.err
        ns = json.loads(kubectl("get", "namespace", name, "-o", "json").out)
        assert ns["status"]["phase"] == "Active"


def test_namespaces_cannot_be_deleted_as_a_collection(kubectl):
    r = kubectl("delete", "--raw", "/api/v1/namespaces", check=False)
    assert r.rc == 1, r
    assert "Error from server (MethodNotAllowed): the server does not allow this method" in r.err
    rows = kubectl("api-resources", "--verbs=deletecollection", "-o", "name").out.split()
    assert "namespaces" not in rows and "pods" in rows
    assert "default" in kubectl("get", "namespaces", "-o", "name").out
