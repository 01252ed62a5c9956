"""CustomResourceDefinitions with the real kubectl and the official Python
client: apply a CRD, wait for Established, then use its resources as
kubectl users do (short names, categories, printer columns, explain, scale,
watch, /status) and delete the CRD with its objects."""

from __future__ import annotations

import json
import time

import pytest

from conftest import Kubectl, start_server

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
  scope: Namespaced
  names:
    plural: crontabs
    singular: crontab
    kind: CronTab
    shortNames: [ct]
    categories: [tabs]
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        description: A CronTab runs a command on a schedule.
        properties:
          spec:
            type: object
            description: What the CronTab runs and how often.
            properties:
              cronSpec:
                type: string
                description: The schedule in cron format.
              image:
                type: string
              replicas:
                type: integer
              selector:
                type: string
          status:
            type: object
            properties:
              replicas:
                type: integer
              phase:
                type: string
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
        labelSelectorPath: .spec.selector
    additionalPrinterColumns:
    - name: Spec
      type: string
      jsonPath: .spec.cronSpec
    - name: Replicas
      type: integer
      jsonPath: .spec.replicas
    - name: Image
      type: string
      priority: 1
      jsonPath: .spec.image
    - name: Age
      type: date
      jsonPath: .metadata.creationTimestamp
"""

TAB = """
apiVersion: stable.example.com/v1
kind: CronTab
metadata:
  name: {name}
spec:
  cronSpec: "* * * * */5"
  image: my-cron-image
  replicas: 2
  selector: app={name}
"""


@pytest.fixture(scope="module")
def crd_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("crd-apiserver"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def kc(crd_server, tmp_path_factory) -> Kubectl:
    return Kubectl(crd_server.kubeconfig, tmp_path_factory.mktemp("crd-kubectl-home"))


@pytest.fixture(scope="module")
def established(kc):
    kc("apply", "-f", "-", stdin=CRD)
    kc("wait", "--for=condition=Established", "crd/crontabs.stable.example.com", "--timeout=10s")
    return kc


def test_crd_resources_with_kubectl(established):
    kc = established
    out = kc("apply", "-f", "-", stdin=TAB.format(name="a")).out
    assert "crontab.stable.example.com/a created" in out
    # short name, category, printer columns (priority 1 only with -o wide)
    table = kc("get", "ct").out.splitlines()
    assert table[0].split() == ["NAME", "SPEC", "REPLICAS", "AGE"]
    assert table[1].split()[:7] == ["a", "*", "*", "*", "*", "*/5", "2"]
    wide = kc("get", "crontabs", "-o", "wide").out.splitlines()
    assert wide[0].split() == ["NAME", "SPEC", "REPLICAS", "IMAGE", "AGE"]
    assert kc("get", "tabs", "-o", "name").out.split() == ["crontab.stable.example.com/a"]
    assert kc("api-resources", "--api-group=stable.example.com", "-o", "name").out.split() == [
        "crontabs.stable.example.com"]
    # explain reads the schema's descriptions from OpenAPI v3
    explained = kc("explain", "crontabs.spec").out
    assert "What the CronTab runs and how often." in explained
    assert "The schedule in cron format." in explained
    # status only through /status
    kc("patch", "ct", "a", "--type=merge", "-p", '{"status":{"phase":"Ready"}}')
    assert "status" not in json.loads(kc("get", "ct", "a", "-o", "json").out)
    kc("patch", "ct", "a", "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Ready","replicas":2}}')
    got = json.loads(kc("get", "ct", "a", "-o", "json").out)
    assert got["status"] == {"phase": "Ready", "replicas": 2}
    assert got["metadata"]["generation"] == 1
    # scale
    assert "scaled" in kc("scale", "ct", "a", "--replicas=4").out
    got = json.loads(kc("get", "ct", "a", "-o", "json").out)
    assert got["spec"]["replicas"] == 4 and got["metadata"]["generation"] == 2
    # strategic merge patch is refused as upstream refuses it for custom resources
    res = kc("patch", "ct", "a", "--type=strategic", "-p", '{"spec":{"image":"x"}}', check=False)
    assert res.rc != 0 and "the body of the request was in an unknown format" in res.err


def test_watch_and_delete_the_crd(established, kc):
    kc("apply", "-f", "-", stdin=TAB.format(name="w1"))
    watcher = kc.popen("get", "ct", "--watch", "-o", "name")
    try:
        kc("apply", "-f", "-", stdin=TAB.format(name="w2"))
        seen = []
        deadline = time.monotonic() + 10
        while "crontab.stable.example.com/w2" not in seen and time.monotonic() < deadline:
            line = watcher.stdout.readline()
            if not line:
                break
            seen.append(line.strip())
        assert "crontab.stable.example.com/w2" in seen
    finally:
        watcher.kill()
        watcher.wait()
    kc("delete", "crd", "crontabs.stable.example.com", "--timeout=20s")
    res = kc("get", "crd", "crontabs.stable.example.com", check=False)
    assert res.rc != 0 and "NotFound" in res.err
    res = kc("get", "--raw", "/apis/stable.example.com/v1/namespaces/default/crontabs", check=False)
    assert res.rc != 0 and "NotFound" in res.err
    # a new CRD of the same name starts empty: the objects went with the old one
    kc("apply", "-f", "-", stdin=CRD)
    kc("wait", "--for=condition=Established", "crd/crontabs.stable.example.com", "--timeout=10s")
    assert kc("get", "crontabs.stable.example.com", "-o", "name").out.strip() == ""


def test_official_client_custom_objects(established, crd_server):
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(crd_server.kubeconfig))
    try:
        api = client.CustomObjectsApi(api_client)
        body = {"apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "py"},
                "spec": {"cronSpec": "0 * * * *", "replicas": 1}}
        created = api.create_namespaced_custom_object("stable.example.com", "v1", "default", "crontabs", body)
        assert created["metadata"]["name"] == "py"
        got = api.get_namespaced_custom_object("stable.example.com", "v1", "default", "crontabs", "py")
        assert got["spec"]["cronSpec"] == "0 * * * *"
        listed = api.list_namespaced_custom_object("stable.example.com", "v1", "default", "crontabs",
                                                   field_selector="metadata.name=py")
        assert [i["metadata"]["name"] for i in listed["items"]] == ["py"]
        patched = api.patch_namespaced_custom_object("stable.example.com", "v1", "default", "crontabs", "py",
                                                     {"spec": {"image": "new"}})
        assert patched["spec"]["image"] == "new"
        status = api.patch_namespaced_custom_object_status("stable.example.com", "v1", "default", "crontabs", "py",
                                                           {"status": {"phase": "Done"}})
        assert status["status"] == {"phase": "Done"}
        api.delete_namespaced_custom_object("stable.example.com", "v1", "default", "crontabs", "py")
    finally:
        api_client.close()


SCHEMA_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gizmos.tools.example.com
spec:
  group: tools.example.com
  scope: Namespaced
  names: {plural: gizmos, kind: Gizmo}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.min <= self.max
              message: min must not exceed max
            properties:
              min: {type: integer, default: 1}
              max: {type: integer, maximum: 10}
              mode: {type: string, enum: [fast, slow], default: fast}
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    port: {type: integer}
"""


def test_schema_pruning_defaulting_and_validation(kc):
    kc("apply", "-f", "-", stdin=SCHEMA_CRD)
    kc("wait", "--for=condition=Established", "crd/gizmos.tools.example.com", "--timeout=10s")
    # unknown fields: refused by kubectl's strict field validation, pruned otherwise
    res = kc("apply", "-f", "-", check=False, stdin="""
apiVersion: tools.example.com/v1
kind: Gizmo
metadata: {name: g}
spec: {max: 5, bogus: 1}
""")
    assert res.rc != 0 and 'unknown field "spec.bogus"' in res.err
    kc("apply", "--validate=false", "-f", "-", stdin="""
apiVersion: tools.example.com/v1
kind: Gizmo
metadata: {name: g}
spec: {max: 5, bogus: 1, ports: [{name: http, port: 80}]}
""")
    got = json.loads(kc("get", "gizmo", "g", "-o", "json").out)
    assert got["spec"] == {"max": 5, "min": 1, "mode": "fast", "ports": [{"name": "http", "port": 80}]}
    # the field path of an OpenAPI violation, the message of a CEL rule
    res = kc("patch", "gizmo", "g", "--type=merge", "-p", '{"spec":{"max":11,"mode":"warp"}}', check=False)
    assert res.rc != 0
    assert "spec.max: Invalid value: 11: spec.max in body should be less than or equal to 10" in res.err
    assert 'spec.mode: Unsupported value: "warp": supported values: "fast", "slow"' in res.err
    res = kc("patch", "gizmo", "g", "--type=merge", "-p", '{"spec":{"min":7}}', check=False)
    assert res.rc != 0 and "min must not exceed max" in res.err
    # server-side apply merges the map-list by its key
    kc("apply", "--server-side", "--field-manager=other", "-f", "-", stdin="""
apiVersion: tools.example.com/v1
kind: Gizmo
metadata: {name: g}
spec: {ports: [{name: https, port: 443}]}
""")
    ports = json.loads(kc("get", "gizmo", "g", "-o", "json").out)["spec"]["ports"]
    assert sorted(p["name"] for p in ports) == ["http", "https"]
