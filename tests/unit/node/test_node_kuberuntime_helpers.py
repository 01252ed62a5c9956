"""The pure parts of the runtime: back-off, env expansion, resources, credentials, DNS."""

from __future__ import annotations

import base64
import json

import grpc
import pytest

from kubeplane.node import kuberuntime as kr
from kubeplane.node.cri.client import CRIError, pb


def test_image_pull_policy_defaults():
    assert kr.image_pull_policy({"image": "busybox"}) == "Always"
    assert kr.image_pull_policy({"image": "busybox:latest"}) == "Always"
    assert kr.image_pull_policy({"image": "localhost:5000/busybox:1.0"}) == "IfNotPresent"
    assert kr.image_pull_policy({"image": "busybox@sha256:00"}) == "IfNotPresent"
    assert kr.image_pull_policy({"image": "busybox", "imagePullPolicy": "Never"}) == "Never"


def test_pull_credentials_match_registry():
    cfg = {"auths": {"https://index.docker.io/v1/": {"auth": base64.b64encode(b"u:p").decode()},
                     "reg.example.com": {"username": "a", "password": "b"},
                     "*.corp.example": {"username": "c", "password": "d"}}}
    sec = {"type": "kubernetes.io/dockerconfigjson",
           "data": {".dockerconfigjson": base64.b64encode(json.dumps(cfg).encode()).decode()}}
    [a] = kr.pull_credentials([sec], "busybox:1")
    assert (a.username, a.password) == ("u", "p")
    [a] = kr.pull_credentials([sec], "reg.example.com/team/app:1")
    assert (a.username, a.password, a.server_address) == ("a", "b", "reg.example.com")
    [a] = kr.pull_credentials([sec], "r1.corp.example/app")
    assert a.username == "c"
    assert kr.pull_credentials([sec], "other.example.org/app") == []
    assert kr.pull_credentials([{"data": {".dockerconfigjson": "!!"}}], "busybox") == []


def test_linux_resources_and_oom_score():
    pod = {"spec": {"containers": [{"name": "a", "resources": {
        "requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}}]}}
    r = kr.linux_resources(pod, pod["spec"]["containers"][0], 1024 * 2**20)
    assert r.cpu_shares == 256 and r.cpu_quota == 50000 and r.cpu_period == 100000
    assert r.memory_limit_in_bytes == 128 * 2**20
    assert r.oom_score_adj == 1000 - 1000 * 64 // 1024
    g = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                                                              "requests": {"cpu": "1", "memory": "1Gi"}}}]}}
    assert kr.linux_resources(g, g["spec"]["containers"][0], 2**33).oom_score_adj == -997
    be = {"spec": {"containers": [{"name": "a"}]}}
    r = kr.linux_resources(be, be["spec"]["containers"][0], 2**33)
    assert r.oom_score_adj == 1000 and r.cpu_shares == 2 and r.cpu_quota == 0


def test_security_context_merges_pod_and_container():
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u"},
           "spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000,
                                        "supplementalGroups": [4000]},
                    "containers": [{"name": "a", "securityContext": {
                        "runAsUser": 1001, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                        "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}]}}
    sc = kr.container_security_context(pod, pod["spec"]["containers"][0])
    assert sc.run_as_user.value == 1001 and sc.run_as_group.value == 2000
    assert list(sc.supplemental_groups) == [3000, 4000] and sc.readonly_rootfs and sc.no_new_privs
    assert list(sc.capabilities.add_capabilities) == ["CAP_NET_ADMIN"]
    assert list(sc.capabilities.drop_capabilities) == ["ALL"]
    assert "/proc/kcore" in sc.masked_paths and not sc.privileged


def test_run_as_non_root_checks():
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": {"securityContext": {"runAsNonRoot": True}}}
    c = {"name": "a"}
    root = pb.Image(id="x")
    root.uid.value = 0
    try:
        kr.verify_run_as_non_root(pod, c, root)
        raise AssertionError("accepted root")
    except kr.ConfigError as e:
        assert str(e) == "container has runAsNonRoot and image will run as root (pod: 'p_n(u)', container: a)"
    ok = pb.Image(id="x")
    ok.uid.value = 1000
    kr.verify_run_as_non_root(pod, c, ok)
    try:
        kr.verify_run_as_non_root(pod, c, pb.Image(id="x", username="nobody"))
        raise AssertionError("accepted a non-numeric user")
    except kr.ConfigError as e:
        assert "non-numeric user (nobody)" in str(e)


def test_service_env():
    svcs = [{"metadata": {"name": "kubernetes", "namespace": "default"},
             "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}},
            {"metadata": {"name": "my-db", "namespace": "app"},
             "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 5432}]}},
            {"metadata": {"name": "headless", "namespace": "app"}, "spec": {"clusterIP": "None"}}]
    env = kr.service_env(svcs, "app", True)
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1" and env["KUBERNETES_SERVICE_PORT_HTTPS"] == "443"
    assert env["MY_DB_PORT"] == "tcp://10.96.0.9:5432" and env["MY_DB_PORT_5432_TCP_ADDR"] == "10.96.0.9"
    assert not any(k.startswith("HEADLESS") for k in env)
    assert "MY_DB_SERVICE_HOST" not in kr.service_env(svcs, "app", False)


def test_dns_config(tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 192.0.2.53\nsearch corp.example\noptions edns0\n")
    pod = {"metadata": {"namespace": "app"}, "spec": {}}
    c = kr.dns_config(pod, ["10.96.0.10"], "cluster.local", str(resolv))
    assert list(c.servers) == ["10.96.0.10"] and list(c.options) == ["ndots:5"]
    assert list(c.searches) == ["app.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"]
    c = kr.dns_config(pod, [], "cluster.local", str(resolv))  # no cluster DNS: the host's
    assert list(c.servers) == ["192.0.2.53"] and list(c.searches) == ["corp.example"]
    none = {"metadata": {"namespace": "app"}, "spec": {"dnsPolicy": "None", "dnsConfig": {
        "nameservers": ["1.1.1.1"], "searches": ["a.example"], "options": [{"name": "ndots", "value": "2"}]}}}
    c = kr.dns_config(none, ["10.96.0.10"], "cluster.local", str(resolv))
    assert list(c.servers) == ["1.1.1.1"] and list(c.searches) == ["a.example"] and list(c.options) == ["ndots:2"]


def test_dns_config_policies_as_upstream(tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# host\nnameserver 192.0.2.53\nsearch old.example\nsearch corp.example. . app.svc.cluster.local\n"
                      "options edns0 ndots:1\noptions ndots:2 timeout:3\n")
    base = {"metadata": {"name": "p", "namespace": "app", "uid": "u1"}}
    cluster = ["10.96.0.10"]

    def conf(spec, dns=cluster, domain="cluster.local", path=str(resolv)):
        warnings = []
        c = kr.dns_config({**base, "spec": spec}, dns, domain, path, warn=lambda r, m: warnings.append((r, m)))
        return list(c.servers), list(c.searches), sorted(c.options), warnings

    # the host's: the last search line (trailing dots and "." dropped), options once each, the later winning
    servers, searches, options, _ = conf({"dnsPolicy": "Default"})
    assert servers == ["192.0.2.53"] and searches == ["corp.example", "app.svc.cluster.local"]
    assert options == ["edns0", "ndots:2", "timeout:3"]
    # ClusterFirst: the cluster's nameserver, its search paths before the host's (no duplicates), ndots:5
    servers, searches, options, _ = conf({})
    assert servers == cluster and options == ["ndots:5"]
    assert searches == ["app.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"]
    # a host-network pod: ClusterFirst resolves as the node, ClusterFirstWithHostNet as the cluster
    assert conf({"hostNetwork": True})[0] == ["192.0.2.53"]
    assert conf({"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"})[0] == cluster
    # no --cluster-dns: the host's, with upstream's warning
    servers, _, _, warnings = conf({}, dns=[])
    assert servers == ["192.0.2.53"] and warnings[0][0] == "MissingClusterDNS"
    assert warnings[0][1].startswith('pod: "p_app(u1)". kubelet does not have ClusterDNS IP configured')
    # no cluster domain: the host's search paths only
    assert conf({}, domain="")[1] == ["corp.example", "app.svc.cluster.local"]
    # --resolv-conf "": the node's own resolver and no search path
    servers, searches, _, _ = conf({"dnsPolicy": "Default"}, path="")
    assert servers == ["127.0.0.1"] and searches == ["."]
    # dnsConfig merges: nameservers and searches appended, options replaced by name
    servers, searches, options, _ = conf({"dnsConfig": {
        "nameservers": ["10.96.0.10", "192.0.2.1"], "searches": ["extra.example", "cluster.local"],
        "options": [{"name": "ndots", "value": "2"}, {"name": "single-request-reopen"}]}})
    assert servers == ["10.96.0.10", "192.0.2.1"] and searches[-1] == "extra.example" and len(searches) == 5
    assert options == ["ndots:2", "single-request-reopen"]
    # limits: 3 nameservers; search paths longer than 253 characters dropped, 32 at most
    servers, searches, _, warnings = conf({"dnsPolicy": "None", "dnsConfig": {
        "nameservers": ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"],
        "searches": ["a" * 254] + [f"s{i}.example" for i in range(40)]}})
    assert servers == ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
    assert len(searches) == 31 and "a" * 254 not in searches
    assert [r for r, _ in warnings] == ["DNSConfigForming", "DNSConfigForming"]
    # the search line at most 2048 characters
    _, searches, _, _ = conf({"dnsPolicy": "None", "dnsConfig": {"searches": [f"{i:02d}" + "x" * 98 for i in range(30)]}})
    assert len(" ".join(searches)) <= 2048 and len(searches) == 20


def test_hostname_and_hosts_file():
    pod = {"metadata": {"name": "web-0", "namespace": "app"}, "spec": {"hostname": "web-0", "subdomain": "web",
                                                                        "hostAliases": [{"ip": "1.2.3.4", "hostnames": ["foo"]}]}}
    name, domain = kr.pod_hostname(pod, "cluster.local")
    assert (name, domain) == ("web-0", "web.app.svc.cluster.local")
    text = kr.hosts_file(pod, ["10.0.0.7"], name, domain)
    assert "10.0.0.7\tweb-0.web.app.svc.cluster.local\tweb-0\n" in text and "1.2.3.4\tfoo" in text


def test_tail_log_message(tmp_path):
    p = tmp_path / "0.log"
    p.write_text("".join(f"2024-01-01T00:00:00Z stdout F line {i}\n" for i in range(100))
                 + "2024-01-01T00:00:00Z stderr P part\n2024-01-01T00:00:00Z stderr F ial\n")
    msg = kr.tail_log_message(str(p))
    assert msg.endswith("line 99\npartial\n") and "line 20\n" not in msg


class RacingRuntime:
    """A CRI that keeps counting a finished container as running for ``lag`` removals."""

    def __init__(self, lag: int):
        self.lag = lag
        self.calls: list[str] = []

    async def runtime(self, method, request, timeout=None):
        self.calls.append(method)
        if method == "RemoveContainer" and self.lag > 0:
            self.lag -= 1
            raise CRIError(method, grpc.StatusCode.UNKNOWN, f'failed to set removing state for container '
                           f'"{request.container_id}": container is still running, to stop first')
        return None


async def test_remove_container_waits_for_the_runtime_to_record_the_exit(tmp_path):
    cri = RacingRuntime(lag=2)
    rt = kr.KubeRuntime(cri, pods_dir=str(tmp_path / "p"), logs_dir=str(tmp_path / "l"))
    await rt._remove_container("abc")
    assert cri.calls == ["RemoveContainer", "StopContainer", "RemoveContainer", "StopContainer", "RemoveContainer"]


async def test_remove_container_gives_up_on_a_container_that_stays_running(tmp_path):
    cri = RacingRuntime(lag=1000)
    rt = kr.KubeRuntime(cri, pods_dir=str(tmp_path / "p"), logs_dir=str(tmp_path / "l"))
    with pytest.raises(CRIError, match="still running"):
        await rt._remove_container("abc", wait=0.3)
    assert 2 <= cri.calls.count("RemoveContainer") <= 5


async def test_a_pod_lock_is_shared_by_waiters_and_forgotten_when_unused(tmp_path):
    import asyncio

    rt = kr.KubeRuntime(None, pods_dir=str(tmp_path / "p"), logs_dir=str(tmp_path / "l"))
    order = []

    async def user(name, hold):
        async with rt._lock("u"):
            order.append(f"{name}+")
            await asyncio.sleep(hold)
            order.append(f"{name}-")

    await asyncio.gather(user("a", 0.05), user("b", 0.01), user("c", 0.0))
    assert order == ["a+", "a-", "b+", "b-", "c+", "c-"]   # one at a time, never two locks
    assert rt._locks == {}
