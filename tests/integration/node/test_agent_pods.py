"""Pods on a real node, end to end: kubectl creates them, the scheduler binds
them, the node agent runs them in containerd and reports their status."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time

from kubeplane.node.cri.client import pb

from conftest import BUSYBOX


def _pod(name: str, command: list[str], *, restart: str = "Always", grace: int | None = None, **spec) -> str:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": restart,
                     "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": command}], **spec}}
    if grace is not None:
        body["spec"]["terminationGracePeriodSeconds"] = grace
    return json.dumps(body)


def _get(node, name: str, ns: str = "default") -> dict:
    return json.loads(node.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout)


def _wait(node, name: str, pred, timeout: float = 60.0, ns: str = "default") -> dict:
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        proc = node.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
        if proc.returncode == 0:
            pod = json.loads(proc.stdout)
            if pred(pod):
                return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {name} never got there; last: {json.dumps((pod or {}).get('status'))[:2000]}")


def _gone(node, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.kubectl("get", "pod", name, check=False).returncode != 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"pod {name} still there")


def _sandboxes(node, uid: str):
    resp = node.run(node.agent.cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(label_selector={"io.kubernetes.pod.uid": uid}))))
    return list(resp.items)


def _containers(node, uid: str):
    resp = node.run(node.agent.cri.runtime("ListContainers", pb.ListContainersRequest(
        filter=pb.ContainerFilter(label_selector={"io.kubernetes.pod.uid": uid}))))
    return list(resp.containers)


def test_node_is_ready_in_kubectl(real_node):
    out = real_node.kubectl("get", "nodes", "-o", "wide").stdout
    line = next(l for l in out.splitlines() if l.startswith(real_node.name))
    assert " Ready " in line and "containerd://" in line


def test_a_pod_that_prints_and_exits_succeeds(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("once", ["sh", "-c", "echo hello from the pod"],
                                                     restart="Never"))
    pod = _wait(real_node, "once", lambda p: p.get("status", {}).get("phase") == "Succeeded")
    st = pod["status"]
    assert st["hostIP"] == "127.0.0.1"
    (cs,) = st["containerStatuses"]
    term = cs["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    assert cs["containerID"].startswith("containerd://") and cs["imageID"]
    # the log file the CRI wrote, where upstream's kubelet keeps it
    md = pod["metadata"]
    import glob
    import os

    logs = glob.glob(os.path.join(real_node.data_dir, "logs", f"default_once_{md['uid']}", "main", "0.log"))
    assert logs and "hello from the pod" in open(logs[0]).read()
    real_node.kubectl("delete", "pod", "once", "--wait=true", timeout=90)
    _gone(real_node, "once")
    # once the pod is gone from the API, its sandbox, containers and log files go too
    deadline = time.monotonic() + 20
    while (_sandboxes(real_node, md["uid"]) or _containers(real_node, md["uid"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandboxes(real_node, md["uid"]) == [] and _containers(real_node, md["uid"]) == []
    assert not os.path.exists(os.path.dirname(os.path.dirname(logs[0])))


def test_running_pod_gets_an_ip_is_ready_and_deletes_gracefully(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("runner", ["sleep", "3600"], grace=3))
    pod = _wait(real_node, "runner", lambda p: any(
        c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])))
    st = pod["status"]
    assert st["phase"] == "Running"
    assert ipaddress.ip_address(st["podIP"]) in ipaddress.ip_network(real_node.pod_cidr)
    assert st["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert st["qosClass"] == "BestEffort"
    uid = pod["metadata"]["uid"]
    assert len(_sandboxes(real_node, uid)) == 1
    started = time.monotonic()
    real_node.kubectl("delete", "pod", "runner", "--wait=true", timeout=90)
    _gone(real_node, "runner")
    # sleep ignores nothing: SIGTERM ends it at once, well before the grace period
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 20
    while _sandboxes(real_node, uid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandboxes(real_node, uid) == []


def test_agent_restart_adopts_running_containers(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("adopted", ["sleep", "3600"], grace=1))
    pod = _wait(real_node, "adopted", lambda p: p.get("status", {}).get("phase") == "Running")
    before = pod["status"]["containerStatuses"][0]
    real_node.restart_agent()
    time.sleep(3)  # a few relists and syncs
    after = _get(real_node, "adopted")["status"]["containerStatuses"][0]
    assert after["containerID"] == before["containerID"]
    assert after["restartCount"] == 0 and "running" in after["state"]
    uid = pod["metadata"]["uid"]
    assert len([c for c in _containers(real_node, uid) if c.state == pb.CONTAINER_RUNNING]) == 1
    real_node.kubectl("delete", "pod", "adopted", "--wait=true", timeout=90)


def test_orphaned_containers_are_removed(real_node):
    """A pod force-deleted while the agent was away: its containers go when it is back."""
    real_node.kubectl("apply", "-f", "-", input=_pod("orphan", ["sleep", "3600"], grace=1))
    pod = _wait(real_node, "orphan", lambda p: p.get("status", {}).get("phase") == "Running")
    uid = pod["metadata"]["uid"]
    real_node.run(real_node.agent.stop())
    real_node.kubectl("delete", "pod", "orphan", "--grace-period=0", "--force")
    real_node.run(real_node.agent.start())
    deadline = time.monotonic() + 30
    while (_sandboxes(real_node, uid) or _containers(real_node, uid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandboxes(real_node, uid) == [] and _containers(real_node, uid) == []


def test_crash_looping_container_restarts_with_backoff(real_node):
    real_node.kubectl("apply", "-f", "-", input=_pod("crasher", ["sh", "-c", "exit 3"], grace=1))
    pod = _wait(real_node, "crasher", lambda p: any(
        c.get("restartCount", 0) >= 1 and (c.get("state", {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for c in p.get("status", {}).get("containerStatuses", [])), timeout=60)
    cs = pod["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] == 3
    assert cs["lastState"]["terminated"]["reason"] == "Error"
    real_node.kubectl("delete", "pod", "crasher", "--wait=true", timeout=90)


def test_the_kubelet_port_is_reported(real_node):
    node = json.loads(real_node.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert port == real_node.agent.server.port > 0


def test_node_events(real_node):
    out = json.loads(real_node.kubectl("get", "events", "-n", "default", "--field-selector",
                                       f"involvedObject.kind=Node,involvedObject.name={real_node.name}",
                                       "-o", "json").stdout)
    reasons = {e["reason"]: e for e in out["items"]}
    assert {"Starting", "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID",
            "NodeReady"} <= set(reasons)
    assert reasons["NodeReady"]["message"] == f"Node {real_node.name} status is now: NodeReady"
    assert reasons["Starting"]["source"]["component"] == "kubelet"


def test_pods_beyond_max_pods_are_rejected(real_node, tmp_path_factory, image_archives):
    """A node admits pods bound to it up to its pods allocatable, as upstream's kubelet."""
    from conftest import RealNode

    small = RealNode(real_node.cluster, str(tmp_path_factory.mktemp("small-node")), name="small-0",
                     busybox_archive=image_archives["busybox"], max_pods=1)
    try:
        small.start()
        for name in ("first", "second"):
            body = json.loads(_pod(name, ["sleep", "3600"], grace=1))
            body["spec"]["nodeName"] = "small-0"
            real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
            if name == "first":
                _wait(real_node, "first", lambda p: p.get("status", {}).get("phase") == "Running")
        pod = _wait(real_node, "second", lambda p: p.get("status", {}).get("phase") == "Failed")
        assert pod["status"]["reason"] == "OutOfpods"
        assert pod["status"]["message"] == ("Pod was rejected: Node didn't have enough resource: pods, "
                                            "requested: 1, used: 1, capacity: 1")
        assert _containers(small, pod["metadata"]["uid"]) == []
        real_node.kubectl("delete", "pod", "first", "second", "--wait=true", timeout=90)
    finally:
        small.stop()
        # gone for good: the scheduler must not place later pods on it
        real_node.kubectl("delete", "node", "small-0", "--ignore-not-found", check=False)


def _nat_rules() -> str:
    return subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout


def test_a_node_removing_its_pods_removes_the_hostport_chains(real_node, tmp_path_factory, image_archives):
    """portmap leaves the chains it shares between hostPorts; a node that removes
    its pods and network when it stops removes them too (no other pod using them)."""
    from conftest import RealNode

    node = RealNode(real_node.cluster, str(tmp_path_factory.mktemp("hostport-node")), name="hostport-0",
                    busybox_archive=image_archives["busybox"])
    host_port = 32000 + os.getpid() % 700
    try:
        node.start()
        body = json.loads(_pod("hostport", ["httpd", "-f", "-p", "8080"], grace=1,
                               nodeName="hostport-0"))
        body["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": host_port}]
        real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
        _wait(real_node, "hostport", lambda p: p.get("status", {}).get("phase") == "Running")
        rules = _nat_rules()
        assert "-N CNI-HOSTPORT-DNAT" in rules and f"--dport {host_port}" in rules
    finally:
        node.stop()
        real_node.kubectl("delete", "pod", "hostport", "--force", "--grace-period=0", "--ignore-not-found",
                          check=False)
        real_node.kubectl("delete", "node", "hostport-0", "--ignore-not-found", check=False)
    rules = _nat_rules()
    assert f"--dport {host_port}" not in rules
    if "-N CNI-DN-" not in rules:  # no other node's pod on this host has a hostPort
        assert "CNI-HOSTPORT" not in rules


def test_pods_the_node_cannot_run_are_rejected(real_node):
    """Bound to the node past the scheduler: admitted only when the node fits them (upstream's
    predicate admission), else Failed with upstream's reason and message and a Warning event."""
    node = json.loads(real_node.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    cores = int(node["status"]["allocatable"]["cpu"].removesuffix("m").split(".")[0])
    milli = cores if node["status"]["allocatable"]["cpu"].endswith("m") else cores * 1000
    cases = {
        "too-big": ({"containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"],
                                     "resources": {"requests": {"cpu": str(milli + 1000) + "m"}}}]},
                    "OutOfcpu", f"Node didn't have enough resource: cpu, requested: {milli + 1000}, used: "),
        "elsewhere": ({"nodeSelector": {"kubernetes.io/hostname": "no-such-host"}}, "NodeAffinity",
                      "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"),
    }
    for name, (spec, _, _) in cases.items():
        body = json.loads(_pod(name, ["sleep", "3600"], grace=1))
        body["spec"].update(spec, nodeName=real_node.name)
        real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        for name, (_, reason, message) in cases.items():
            pod = _wait(real_node, name, lambda p: p.get("status", {}).get("phase") == "Failed")
            assert pod["status"]["reason"] == reason
            assert pod["status"]["message"].startswith("Pod was rejected: " + message)
            assert _containers(real_node, pod["metadata"]["uid"]) == []
            events = json.loads(real_node.kubectl(
                "get", "events", "-n", "default", "--field-selector",
                f"involvedObject.kind=Pod,involvedObject.name={name},reason={reason}", "-o", "json").stdout)
            assert [e["type"] for e in events["items"]] == ["Warning"]
            assert events["items"][0]["message"].startswith(message)
    finally:
        real_node.kubectl("delete", "pod", *cases, "--wait=true", timeout=90)


def test_pods_get_their_cgroup_under_the_nodes_qos_hierarchy(real_node):
    """The node's pods run in their pod cgroup, with the pod's limits, and it goes with the pod."""
    import os

    body = json.loads(_pod("limited", ["sleep", "3600"], grace=1))
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "50m", "memory": "16Mi"},
                                                  "limits": {"memory": "40Mi"}}
    real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
    pod = _wait(real_node, "limited", lambda p: p.get("status", {}).get("phase") == "Running")
    uid = pod["metadata"]["uid"]
    assert pod["status"]["qosClass"] == "Burstable"
    pod_cgroup = f"{real_node.cgroup_root}/kubepods/burstable/pod{uid}"
    (c,) = [c for c in _containers(real_node, uid) if c.state == pb.CONTAINER_RUNNING]
    st = real_node.run(real_node.agent.cri.runtime("ContainerStatus", pb.ContainerStatusRequest(
        container_id=c.id, verbose=True)))
    pid = json.loads(st.info["info"])["pid"]
    paths = dict(line.rstrip("\n").split(":", 2)[1:] for line in open(f"/proc/{pid}/cgroup"))
    assert paths["memory"].startswith(pod_cgroup + "/") and paths["cpu"].startswith(pod_cgroup + "/")
    memory = f"/sys/fs/cgroup/memory{pod_cgroup}"
    assert open(f"{memory}/memory.limit_in_bytes").read().strip() == str(40 << 20)
    assert open(f"/sys/fs/cgroup/cpu{pod_cgroup}/cpu.shares").read().strip() == "51"
    real_node.kubectl("delete", "pod", "limited", "--wait=true", timeout=90)
    deadline = time.monotonic() + 20
    while os.path.exists(memory) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(os.path.exists(f"/sys/fs/cgroup/{c}{pod_cgroup}") for c in ("memory", "cpu", "pids", "systemd"))


def test_kubectl_logs_and_exec_through_the_node(real_node):
    """The API server reaches the node's kubelet API at its InternalIP and port."""
    real_node.kubectl("apply", "-f", "-", input=_pod("talker", ["sh", "-c", "echo started; sleep 3600"], grace=1))
    _wait(real_node, "talker", lambda p: p.get("status", {}).get("phase") == "Running")
    deadline = time.monotonic() + 30
    while "started" not in real_node.kubectl("logs", "talker", check=False).stdout and time.monotonic() < deadline:
        time.sleep(0.3)
    assert real_node.kubectl("logs", "talker").stdout == "started\n"
    out = real_node.kubectl("exec", "talker", "--", "sh", "-c", "echo $HOSTNAME; exit 7", check=False)
    assert out.stdout == "talker\n" and out.returncode == 7
    real_node.kubectl("delete", "pod", "talker", "--wait=true", timeout=90)


def test_deployment_of_a_real_http_server_scales_1_3_1(real_node):
    import urllib.request

    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "httpd", "image": BUSYBOX, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "mkdir -p /www && echo \"hello from $HOSTNAME\" > /www/index.html"
                                        " && exec httpd -f -p 8080 -h /www"],
                            "ports": [{"containerPort": 8080}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}}]}}}}
    real_node.kubectl("apply", "-f", "-", input=json.dumps(deploy))

    def ready(n: int):
        def check():
            d = json.loads(real_node.kubectl("get", "deploy", "web", "-o", "json").stdout)
            pods = json.loads(real_node.kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
            running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            return (d.get("status", {}).get("readyReplicas") == n and len(pods) == n
                    and all(p["status"].get("podIP") for p in running)) and running
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            time.sleep(0.3)
        raise AssertionError(f"web never had {n} ready replicas alone")

    for n in (1, 3, 1):
        real_node.kubectl("scale", "deploy", "web", f"--replicas={n}")
        pods = ready(n)
        for p in pods:
            body = urllib.request.urlopen(f"http://{p['status']['podIP']}:8080/", timeout=10).read().decode()
            assert body == f"hello from {p['metadata']['name']}\n"
    real_node.kubectl("delete", "deploy", "web", "--wait=true", timeout=90)


def test_a_job_whose_container_exits_0_completes(real_node):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once-job"}, "spec": {
        "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "work", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sh", "-c", "echo done"]}]}}}}
    real_node.kubectl("apply", "-f", "-", input=json.dumps(job))
    real_node.kubectl("wait", "--for=condition=Complete", "job/once-job", "--timeout=90s", timeout=100)
    out = real_node.kubectl("logs", "job/once-job").stdout
    assert out == "done\n"
    real_node.kubectl("delete", "job", "once-job", "--cascade=foreground", "--wait=true", timeout=90)


def test_graceful_deletion_runs_prestop_then_sigterm(real_node, tmp_path):
    out_dir = tmp_path / "host"
    out_dir.mkdir()
    body = json.loads(_pod("polite", ["sh", "-c", "trap 'echo term >> /host/out; exit 0' TERM; "
                                                  "while :; do sleep 0.2; done"], grace=20))
    c = body["spec"]["containers"][0]
    c["lifecycle"] = {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop >> /host/out"]}}}
    c["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]
    body["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": str(out_dir), "type": "Directory"}}]
    real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
    pod = _wait(real_node, "polite", lambda p: p.get("status", {}).get("phase") == "Running")
    started = time.monotonic()
    real_node.kubectl("delete", "pod", "polite", "--wait=true", timeout=90)
    assert time.monotonic() - started < 15  # it ended on SIGTERM, not at the end of its grace
    assert (out_dir / "out").read_text() == "prestop\nterm\n"
    assert pod["metadata"]["uid"]


def test_deleting_a_pod_cuts_short_a_sync_under_way(real_node):
    """A postStart hook that never ends holds the pod's sync; deletion does not wait for it."""
    body = json.loads(_pod("hooked", ["sh", "-c", "exec sleep 300"], grace=1))
    body["spec"]["containers"][0]["lifecycle"] = {"postStart": {"exec": {"command": ["sleep", "300"]}}}
    real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
    uid = _get(real_node, "hooked")["metadata"]["uid"]
    deadline = time.monotonic() + 60
    while not [c for c in _containers(real_node, uid) if c.state == pb.CONTAINER_RUNNING]:
        assert time.monotonic() < deadline, "the container never started"
        time.sleep(0.2)
    time.sleep(1)  # the hook runs
    started = time.monotonic()
    real_node.kubectl("delete", "pod", "hooked", "--wait=true", timeout=90)
    assert time.monotonic() - started < 20
    deadline = time.monotonic() + 20
    while _sandboxes(real_node, uid) and any(s.state == pb.SANDBOX_READY for s in _sandboxes(real_node, uid)):
        assert time.monotonic() < deadline, "its sandbox still runs"
        time.sleep(0.2)


def test_logs_of_a_container_waiting_for_its_image_say_why(real_node):
    """kubectl logs of a container that never started: upstream's kubelet words."""
    never = json.loads(_pod("no-image", ["true"], grace=1))
    never["spec"]["containers"][0].update(image="127.0.0.1:1/none:1", imagePullPolicy="Never")
    failing = json.loads(_pod("bad-pull", ["true"], grace=1))
    failing["spec"]["containers"][0].update(image="127.0.0.1:1/none:1", imagePullPolicy="IfNotPresent")
    for body in (never, failing):
        real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        def waiting(p):
            return ((p.get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {}).get(
                "waiting", {}).get("reason")
        _wait(real_node, "no-image", lambda p: waiting(p) == "ErrImageNeverPull")
        res = real_node.kubectl("logs", "no-image", check=False)
        assert res.returncode == 1 and ('container "main" in pod "no-image" is waiting to start: ErrImageNeverPull'
                                        in res.stderr), res.stderr
        _wait(real_node, "bad-pull", lambda p: waiting(p) in ("ErrImagePull", "ImagePullBackOff"), timeout=90)
        res = real_node.kubectl("logs", "bad-pull", check=False)
        assert res.returncode == 1 and any(
            f'container "main" in pod "bad-pull" is waiting to start: {why}' in res.stderr
            for why in ("image can't be pulled", "trying and failing to pull image")), res.stderr
    finally:
        real_node.kubectl("delete", "pod", "no-image", "bad-pull", "--wait=false", check=False)
