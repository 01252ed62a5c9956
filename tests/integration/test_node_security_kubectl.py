"""Node security with the real kubectl against ``kubeplane up`` (simulated
nodes): the Node authorizer (a node reads only the secrets and configmaps
its pods use, its own Node, pods bound to it), NodeRestriction (its own
Node, labels, pods, tokens bound to its pods), the node IPAM controller,
and a node joined with a bootstrap token: token discovery, a CSR approved
automatically and signed, the certificate authenticating as
``system:node:<name>``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync

NS = "node-sec"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("node-security")
    srv = start_server(tmp, command="up", extra=["--nodes", "2", "--allocate-node-cidrs",
                                                 "--cluster-cidr", "10.244.0.0/16"])
    try:
        kubectl = Kubectl(srv.kubeconfig, tmp / "home")
        kubectl("create", "namespace", NS)
        eventually_sync(lambda: kubectl("get", "sa", "default", "-n", NS, check=False).rc == 0,
                        what="the default ServiceAccount")
        yield kubectl, srv, tmp
    finally:
        srv.stop()


def until_ok(fn, what, timeout=20.0):
    """The first result of ``fn()`` (a kubectl run) that succeeded."""
    return eventually_sync(lambda: (lambda r: r if r.rc == 0 else None)(fn()), what=what, timeout=timeout)


def as_node(kubectl, node, *args, check=False):
    return kubectl(f"--as=system:node:{node}", "--as-group=system:nodes", *args, check=check)


def _pod(name, node, **spec):
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                       "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], **spec}})


def test_a_node_reads_only_what_its_pods_use(env):
    kubectl, _, _ = env
    for name in ("mine", "other"):
        kubectl("create", "secret", "generic", name, "--from-literal=k=v", "-n", NS)
    kubectl("create", "configmap", "conf", "--from-literal=a=b", "-n", NS)
    kubectl("create", "-f", "-", stdin=_pod("reader", "node-0", volumes=[
        {"name": "s", "secret": {"secretName": "mine"}}, {"name": "c", "configMap": {"name": "conf"}}]))
    # allowed once the authorizer's graph has the pod
    got = until_ok(lambda: as_node(kubectl, "node-0", "get", "secret", "mine", "-n", NS, "-o", "name"),
                   what="node-0 reading its pod's secret")
    assert got.out.strip() == "secret/mine"
    assert as_node(kubectl, "node-0", "get", "configmap", "conf", "-n", NS).rc == 0
    res = as_node(kubectl, "node-0", "get", "secret", "other", "-n", NS)
    assert res.rc == 1
    assert res.err.strip() == (
        'Error from server (Forbidden): secrets "other" is forbidden: User "system:node:node-0" cannot get '
        'resource "secrets" in API group "" in the namespace "node-sec": no relationship found between node '
        "'node-0' and this object")
    res = as_node(kubectl, "node-1", "get", "secret", "mine", "-n", NS)
    assert res.rc == 1 and "no relationship found between node 'node-1' and this object" in res.err
    res = as_node(kubectl, "node-0", "get", "secrets", "-n", NS)
    assert res.rc == 1 and 'User "system:node:node-0" cannot list resource "secrets"' in res.err
    # pods: only those bound to it, listed with the field selector
    res = as_node(kubectl, "node-0", "get", "pods", "-A")
    assert res.rc == 1 and "can only list/watch pods with spec.nodeName field selector" in res.err
    listed = as_node(kubectl, "node-0", "get", "pods", "-A", "--field-selector", "spec.nodeName=node-0",
                     "-o", "name", check=True)
    assert "pod/reader" in listed.out
    # its own Node only
    assert as_node(kubectl, "node-0", "get", "node", "node-0").rc == 0
    res = as_node(kubectl, "node-0", "get", "node", "node-1")
    assert res.rc == 1 and "node 'node-0' cannot read 'node-1', only its own Node object" in res.err
    # the pod goes: so does the node's access
    kubectl("delete", "pod", "reader", "-n", NS, "--wait=true")
    eventually_sync(lambda: as_node(kubectl, "node-0", "get", "secret", "mine", "-n", NS).rc == 1,
                    what="access gone with the pod")


def test_node_restriction(env):
    kubectl, _, _ = env
    # (kubectl label and patch read node-1 first, which the Node authorizer refuses already: a raw PUT)
    other = json.loads(kubectl("get", "node", "node-1", "-o", "json").out)
    other["metadata"]["labels"]["team"] = "a"
    res = kubectl("--as=system:node:node-0", "--as-group=system:nodes", "replace", "--raw",
                  "/api/v1/nodes/node-1", "-f", "-", stdin=json.dumps(other), check=False)
    assert res.rc == 1
    assert res.err.strip() == ('Error from server (Forbidden): nodes "node-1" is forbidden: node "node-0" is not '
                               'allowed to modify node "node-1"')
    res = as_node(kubectl, "node-0", "label", "node", "node-0", "node-restriction.kubernetes.io/pool=a")
    assert res.rc == 1 and ("is not allowed to modify labels: node-restriction.kubernetes.io/pool" in res.err)
    res = as_node(kubectl, "node-0", "taint", "node", "node-0", "k=v:NoSchedule")
    assert res.rc == 1 and 'node "node-0" is not allowed to modify taints' in res.err
    assert as_node(kubectl, "node-0", "label", "node", "node-0", "team=a").rc == 0
    kubectl("create", "-f", "-", stdin=_pod("on-one", "node-1"))
    res = as_node(kubectl, "node-0", "delete", "pod", "on-one", "-n", NS)
    assert res.rc == 1 and 'node "node-0" can only delete pods with spec.nodeName set to itself' in res.err
    res = as_node(kubectl, "node-0", "run", "sneaky", "--image=busybox", "-n", NS, "--restart=Never")
    assert res.rc == 1 and "can only create mirror pods" in res.err
    # a token only for a pod bound to the node, bound to it
    uid = kubectl("get", "pod", "on-one", "-n", NS, "-o", "jsonpath={.metadata.uid}").out
    res = as_node(kubectl, "node-1", "create", "token", "default", "-n", NS)
    assert res.rc == 1 and "node requested token not bound to a pod" in res.err
    token = until_ok(lambda: as_node(kubectl, "node-1", "create", "token", "default", "-n", NS,
                                     "--bound-object-kind=Pod", "--bound-object-name=on-one",
                                     f"--bound-object-uid={uid}"), what="node-1's token for its pod")
    assert token.out.count(".") == 2
    res = as_node(kubectl, "node-0", "create", "token", "default", "-n", NS, "--bound-object-kind=Pod",
                  "--bound-object-name=on-one", f"--bound-object-uid={uid}")
    assert res.rc == 1
    kubectl("delete", "pod", "on-one", "-n", NS, "--wait=false")


def test_simulated_nodes_still_run_pods(env):
    """They act as system:node:<name>: register, renew their Lease, report pod
    status and finish deletions, all through the Node authorizer and NodeRestriction."""
    kubectl, _, _ = env
    kubectl("create", "deployment", "web", "--image=nginx", "--replicas=2", "-n", NS)
    eventually_sync(lambda: kubectl("get", "deployment", "web", "-n", NS, "-o",
                                    "jsonpath={.status.readyReplicas}").out == "2", what="2 ready replicas")
    leases = kubectl("get", "lease", "-n", "kube-node-lease", "-o", "name").out.split()
    assert sorted(leases) == ["lease.coordination.k8s.io/node-0", "lease.coordination.k8s.io/node-1"]
    kubectl("delete", "deployment", "web", "-n", NS)
    eventually_sync(lambda: not kubectl("get", "pods", "-n", NS, "-l", "app=web", "-o", "name").out.strip(),
                    what="the pods deleted", timeout=30)


def test_node_ipam_assigns_pod_cidrs(env):
    kubectl, _, _ = env
    cidrs = {}
    for node in ("node-0", "node-1"):
        cidrs[node] = eventually_sync(
            lambda node=node: kubectl("get", "node", node, "-o", "jsonpath={.spec.podCIDR}").out,
            what=f"{node}'s pod CIDR")
    assert sorted(cidrs.values()) == ["10.244.0.0/24", "10.244.1.0/24"]
    podcidrs = kubectl("get", "node", "node-0", "-o", "jsonpath={.spec.podCIDRs}").out
    assert json.loads(podcidrs) == [cidrs["node-0"]]


def _token_kubectl(srv, tmp, token) -> Kubectl:
    """kubectl with only ``token`` as its credential."""
    import base64

    import yaml

    from kubeplane.client.kubeconfig import write_kubeconfig

    admin = yaml.safe_load(srv.kubeconfig.read_text())
    ca = base64.b64decode(admin["clusters"][0]["cluster"]["certificate-authority-data"])
    path = tmp / f"token-{token.split('.')[0]}.kubeconfig"
    write_kubeconfig(str(path), srv.url, ca_data=ca, token=token)
    return Kubectl(path, tmp / "token-home")


def _kubeplane(*args, kubeconfig):
    return subprocess.run([sys.executable, "-m", "kubeplane.cli.main", *args, "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=60)


def test_join_with_a_bootstrap_token(env):
    from kubeplane.client.bootstrap import JoinError, join

    kubectl, srv, tmp = env
    res = _kubeplane("token", "create", "--print-join-command", "--description", "for the test",
                     kubeconfig=srv.kubeconfig)
    assert res.returncode == 0, res.stderr
    words = res.stdout.split()
    assert words[:2] == ["kubeplane", "node"] and words[2] == "--server" and words[4] == "--token"
    server, token, ca_hash = words[3], words[5], words[7]
    assert words[6] == "--ca-cert-hash" and ca_hash.startswith("sha256:")
    assert server == srv.url
    listed = _kubeplane("token", "list", kubeconfig=srv.kubeconfig).stdout
    assert token in listed and "for the test" in listed and "authentication,signing" in listed
    # the token alone is a bootstrapper: it may ask for a certificate, nothing more
    bootstrapper = _token_kubectl(srv, tmp, token)
    res = bootstrapper("auth", "whoami", "-o", "json", check=False)
    assert res.rc == 0, res.err
    who = json.loads(res.out)["status"]["userInfo"]
    assert who["username"] == f"system:bootstrap:{token.split('.')[0]}"
    assert "system:bootstrappers" in who["groups"]
    res = bootstrapper("get", "secrets", "-n", "kube-system", check=False)
    assert res.rc == 1 and "Forbidden" in res.err
    # a wrong pin is refused before anything is sent with the token
    with pytest.raises(JoinError, match="none of the public keys"):
        asyncio.run(join(server, token, "joined-1", str(tmp / "bad.kubeconfig"),
                         ca_cert_hashes=["sha256:" + "0" * 64], timeout=20))
    node_kc = tmp / "joined-1.kubeconfig"
    asyncio.run(join(server, token, "joined-1", str(node_kc), ca_cert_hashes=[ca_hash], timeout=60))
    assert (node_kc.stat().st_mode & 0o777) == 0o600
    node = Kubectl(node_kc, tmp / "node-home")
    who = json.loads(node("auth", "whoami", "-o", "json").out)["status"]["userInfo"]
    assert who["username"] == "system:node:joined-1"
    assert who["groups"] == ["system:nodes", "system:authenticated"]
    csrs = json.loads(kubectl("get", "csr", "-o", "json").out)["items"]
    mine = [c for c in csrs if c["spec"]["username"] == f"system:bootstrap:{token.split('.')[0]}"]
    assert len(mine) == 1
    approved = [c for c in mine[0]["status"]["conditions"] if c["type"] == "Approved"]
    assert approved[0]["reason"] == "AutoApproved"
    assert approved[0]["message"] == "Auto approving kubelet client certificate after SubjectAccessReview."
    assert "Approved,Issued" in kubectl("get", "csr", mine[0]["metadata"]["name"]).out
    # the joined node registers itself, and is held to its own Node
    node("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                 "metadata": {"name": "joined-1"}}))
    other = json.loads(kubectl("get", "node", "node-0", "-o", "json").out)
    res = node("replace", "--raw", "/api/v1/nodes/node-0", "-f", "-", stdin=json.dumps(other), check=False)
    assert res.rc == 1 and 'not allowed to modify node' in res.err
    # and gets a pod CIDR of its own
    cidr = eventually_sync(lambda: kubectl("get", "node", "joined-1", "-o", "jsonpath={.spec.podCIDR}").out,
                           what="the joined node's pod CIDR")
    assert cidr == "10.244.2.0/24"
    # deleted, the token no longer authenticates
    assert _kubeplane("token", "delete", token, kubeconfig=srv.kubeconfig).returncode == 0
    res = bootstrapper("get", "csr", check=False)
    assert res.rc == 1 and "Unauthorized" in res.err
    kubectl("delete", "node", "joined-1")
