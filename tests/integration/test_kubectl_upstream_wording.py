"""Upstream's wording and codes seen through the real kubectl and the official
client: create-only review kinds pass kubectl's client-side validation, 422
messages name the group-qualified kind while kubectl still prints the bare
Kind from details, and deleting an object held by finalizers is a 200 that
kubectl reports as deleted."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

REVIEWS = [
    {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "not-a-token"}},
    {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
     "spec": {"user": "bob", "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}}},
    {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
     "spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}},
    {"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
     "metadata": {"namespace": "default"},
     "spec": {"user": "bob", "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}}},
    {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "default"}},
]


@pytest.mark.parametrize("review", REVIEWS, ids=[r["kind"] for r in REVIEWS])
def test_create_only_kinds_pass_client_side_validation(kubectl, review):
    out = json.loads(kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(review)).out)
    assert out["kind"] == review["kind"] and "status" in out
    # validation really ran: an unknown field is refused before the request
    bad = dict(review, bogus=1)
    res = kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(bad), check=False)
    assert res.rc != 0 and f'ValidationError({review["kind"]}): unknown field "bogus"' in res.err, res.err


def test_invalid_message_is_group_qualified(kubectl, server):
    name = f"web-{uuid.uuid4().hex[:6]}"
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "c"}},
                                 "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    # kubectl builds its line from details.kind, which stays the bare Kind
    res = kubectl("create", "-f", "-", stdin=yaml.safe_dump(dep), check=False)
    assert res.rc == 1 and f'The Deployment "{name}" is invalid: spec.template.metadata.labels' in res.err, res.err
    api = config.new_client_from_config(config_file=str(server.kubeconfig))
    try:
        with pytest.raises(ApiException) as err:
            client.AppsV1Api(api).create_namespaced_deployment("default", dep)
        status = json.loads(err.value.body)
        assert err.value.status == 422
        assert status["message"].startswith(f'Deployment.apps "{name}" is invalid: spec.template.metadata.labels')
        assert (status["details"]["kind"], status["details"]["group"]) == ("Deployment", "apps")
    finally:
        api.close()


def test_delete_held_by_finalizers_is_200_and_kubectl_says_deleted(kubectl):
    for cascade in ("background", "foreground", "orphan"):
        name = f"held-{cascade}-{uuid.uuid4().hex[:6]}"
        kubectl("create", "configmap", name)
        kubectl("patch", "configmap", name, "-p", '{"metadata":{"finalizers":["example.com/keep"]}}')
        res = kubectl("delete", "configmap", name, f"--cascade={cascade}", "--wait=false", "-v=6")
        assert f'configmap "{name}" deleted' in res.out
        assert re.search(rf"DELETE https://\S+/api/v1/namespaces/default/configmaps/{name}\?\S* 200 OK", res.err) or \
            re.search(rf"DELETE https://\S+/api/v1/namespaces/default/configmaps/{name} 200 OK", res.err), res.err
        got = json.loads(kubectl("get", "configmap", name, "-o", "json").out)
        assert got["metadata"]["deletionTimestamp"]
        kubectl("patch", "configmap", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        assert kubectl("get", "configmap", name, check=False).rc == 1
