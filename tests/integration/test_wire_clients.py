"""Third-party clients' first calls and kubectl's protobuf bodies against a real server."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

import pytest
from kubernetes import client, config

from kubeplane.apiserver.server import VERSION_INFO


def _get(server, path: str, accept: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(server.url + path, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=server.ssl_context()) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture()
def ns(kubectl):
    name = f"wire-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_raw_trailing_slash_paths(server):
    for path in ("/version", "/api", "/apis", "/api/v1", "/apis/apps", "/apis/apps/v1"):
        code, plain = _get(server, path)
        code_slash, slash = _get(server, path + "/")
        assert (code, code_slash) == (200, 200), path
        assert json.loads(slash) == json.loads(plain), path
    assert _get(server, "/healthz/")[0] == 404  # an exact-match path upstream


def test_official_client_version_api(server):
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        info = client.VersionApi(api).get_code()  # GET /version/
    assert info.git_version == VERSION_INFO["gitVersion"] and info.minor == "32"


def test_kr8s_first_calls(server, kubectl, ns):
    import kr8s

    kubectl("run", "p", "--image=busybox", "-n", ns)
    api = kr8s.api(kubeconfig=str(server.kubeconfig))
    assert api.version()["gitVersion"] == VERSION_INFO["gitVersion"]
    pods = list(kr8s.get("pods", namespace=ns, api=api))
    assert [p.name for p in pods] == ["p"]
    assert ns in [n.name for n in api.get("namespaces")]


def test_kubectl_version_json(kubectl):
    res = kubectl("version", "-o", "json")
    assert res.err == ""  # no skew warning, no error
    server_version = json.loads(res.out)["serverVersion"]
    assert server_version == VERSION_INFO
    # semver without a pre-release part (which semver ranges such as helm's kubeVersion reject)
    assert re.fullmatch(r"v1\.32\.\d+(\+[0-9A-Za-z.-]+)?", server_version["gitVersion"])
    assert "Server Version: " + server_version["gitVersion"] in kubectl("version").out


def test_kubectl_drain_sends_protobuf_delete_options(kubectl, ns):
    node = f"drain-{uuid.uuid4().hex[:6]}"
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim", "namespace": ns},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}
    kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    # kubectl's typed client sends DeleteOptions as protobuf
    res = kubectl("drain", node, "--force", "--grace-period=0", "--timeout=30s", "--disable-eviction")
    assert f"node/{node} drained" in res.out, res.out + res.err
    assert kubectl("get", "pods", "-n", ns, "-o", "name").out.strip() == ""
    assert json.loads(kubectl("get", "node", node, "-o", "json").out)["spec"]["unschedulable"] is True
    kubectl("delete", "node", node)


def test_kubectl_debug_copy_to_replace(kubectl, ns):
    kubectl("run", "orig", "--image=busybox", "-n", ns)
    # --replace deletes the original (protobuf DeleteOptions), then creates the copy (protobuf Pod)
    kubectl("debug", "orig", "-n", ns, "--image=busybox", "--copy-to=orig-debug", "--replace")
    assert kubectl("get", "pods", "-n", ns, "-o", "name").out.split() == ["pod/orig-debug"]
    copy = json.loads(kubectl("get", "pod", "orig-debug", "-n", ns, "-o", "json").out)
    names = [c["name"] for c in copy["spec"]["containers"]]
    assert names[0] == "orig" and len(names) == 2 and names[1].startswith("debugger-")


def test_kubectl_debug_errors_are_clean(kubectl, ns):
    missing = kubectl("debug", "missing", "-n", ns, "--image=busybox", check=False)
    assert missing.rc == 1 and 'pods "missing" not found' in missing.err
    assert "panic" not in missing.err
    kubectl("run", "target", "--image=busybox", "-n", ns)
    # ephemeral containers are not served: upstream's 404 carries empty details,
    # which kubectl reads (it crashed on a 404 without them)
    res = kubectl("debug", "target", "-n", ns, "--image=busybox", check=False)
    assert res.rc == 1 and "panic" not in res.err and "nil pointer" not in res.err
    assert "ephemeral containers are disabled for this cluster" in res.err


def test_kubectl_explain_and_validate_with_openapi_v2(server, kubectl, ns, tmp_path):
    code, body = _get(server, "/openapi/v2", "application/json")
    assert code == 200 and json.loads(body)["swagger"] == "2.0"
    assert _get(server, "/openapi/v2", "text/html")[0] == 406
    assert "containerPort" in kubectl("explain", "pods.spec.containers.ports").out
    # kubectl reads the protobuf form of v2 for this output format
    v2 = kubectl("explain", "deployments.spec.template.spec.containers.ports", "--output=plaintext-openapiv2")
    assert "VERSION:  apps/v1" in v2.out and "containerPort\t<integer> -required-" in v2.out
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: v, namespace: {ns}}}\n"
                        "data: {a: b}\nbogus: 1\n")
    bad = kubectl("apply", "-f", str(manifest), "--validate=strict", check=False)
    assert bad.rc == 1 and 'unknown field "bogus"' in bad.err
    manifest.write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: v, namespace: {ns}}}\ndata: {{a: b}}\n")
    assert "configmap/v created" in kubectl("apply", "-f", str(manifest), "--validate=strict").out
