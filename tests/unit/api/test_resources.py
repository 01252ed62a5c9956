import pytest

from kubeplane.api.resources import CATALOGUE, resource


def test_paths_and_keys():
    pods = resource("pods")
    assert pods.collection_path("default") == "/api/v1/namespaces/default/pods"
    assert pods.item_path("p", "default", "binding") == "/api/v1/namespaces/default/pods/p/binding"
    assert pods.storage_key("p", "default") == "/registry/core/pods/default/p"
    deploy = resource("deploy")
    assert deploy.api_version == "apps/v1"
    assert deploy.collection_path() == "/apis/apps/v1/deployments"
    assert deploy.qualified == "deployments.apps"
    pv = resource("PersistentVolume")
    assert not pv.namespaced and pv.storage_key("pv1") == "/registry/core/persistentvolumes/pv1"


def test_catalogue_lookups():
    assert CATALOGUE.by_api_version_kind("resource.k8s.io/v1", "ResourceClaim").plural == "resourceclaims"
    assert CATALOGUE.by_gvr("", "v1", "nodes").kind == "Node"
    assert CATALOGUE.by_api_version_kind("v1", "Nope") is None
    assert ("apps", "v1") in CATALOGUE.group_versions()
    with pytest.raises(KeyError):
        resource("widgets")
