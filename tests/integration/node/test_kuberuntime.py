"""KubeRuntime against a real containerd: sandboxes, containers and the pod status."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import uuid

import pytest

from kubeplane.node import cni
from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.kuberuntime import KubeRuntime

from nodetest import BUSYBOX, own_cgroup_root, remove_cgroup_root


def make_pod(name: str, containers: list[dict], **spec) -> dict:
    for c in containers + spec.get("initContainers", []):
        c.setdefault("image", BUSYBOX)
        c.setdefault("imagePullPolicy", "Never")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"containers": containers, "nodeName": "n1", "terminationGracePeriodSeconds": 2, **spec},
            "status": {"phase": "Pending"}}


@pytest.fixture
async def runtime(containerd, tmp_path):
    cri = CRIClient(containerd.endpoint)
    rt = KubeRuntime(cri, node_name="n1", pods_dir=str(tmp_path / "pods"), logs_dir=str(tmp_path / "logs"),
                     host_ips=["127.0.0.1"])
    made: list[str] = []
    rt.made = made
    try:
        yield rt
    finally:
        for uid in made:
            await rt.remove_pod(uid)
        await cri.close()


async def sync_until(rt: KubeRuntime, pod: dict, pred, timeout: float = 20.0) -> dict:
    if pod["metadata"]["uid"] not in rt.made:
        rt.made.append(pod["metadata"]["uid"])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        pod["status"] = await rt.sync_pod(pod)
        if pred(pod["status"]):
            return pod["status"]
        assert loop.time() < deadline, f"timed out; status: {pod['status']}"
        await asyncio.sleep(0.2)


def cond(status: dict, t: str) -> str:
    return next(c["status"] for c in status["conditions"] if c["type"] == t)


async def test_running_pod_status_and_termination(runtime, containerd):
    pod = make_pod("web", [{"name": "main", "command": ["sh", "-c", "echo started; exec sleep 60"]}])
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    assert ipaddress.ip_address(st["podIP"]) in ipaddress.ip_network(containerd.pod_cidr)
    assert st["podIPs"] == [{"ip": st["podIP"]}] and st["hostIP"] == "127.0.0.1"
    assert st["qosClass"] == "BestEffort" and st["startTime"]
    assert {c["type"]: c["status"] for c in st["conditions"]} == {
        "PodReadyToStartContainers": "True", "Initialized": "True", "Ready": "True",
        "ContainersReady": "True", "PodScheduled": "True"}
    cs = st["containerStatuses"][0]
    assert cs["name"] == "main" and cs["ready"] and cs["started"] and cs["restartCount"] == 0
    assert "running" in cs["state"] and cs["containerID"].startswith("containerd://")
    assert cs["imageID"].startswith("sha256:") and cs["image"] == BUSYBOX
    # the log as upstream lays it out
    md = pod["metadata"]
    log = os.path.join(runtime.logs_dir, f"default_web_{md['uid']}", "main", "0.log")
    for _ in range(50):
        if os.path.exists(log) and open(log).read():
            break
        await asyncio.sleep(0.1)
    assert open(log).read().split(" ", 3)[1:] == ["stdout", "F", "started\n"]
    # a second sync changes nothing
    again = await runtime.sync_pod(pod)
    assert again["containerStatuses"][0]["containerID"] == cs["containerID"]
    # adoption: the runtime's labels name the pod
    found = [p for p in await runtime.running_pods() if p.uid == md["uid"]]
    assert found and found[0].name == "web" and found[0].namespace == "default"
    assert [c.name for c in found[0].containers] == ["main"]
    # sleep ignores nothing: SIGTERM ends it at once
    final = await runtime.terminate_pod(pod, 2)
    term = final["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] in (137, 143) and term["reason"] == "Error"
    assert cond(final, "PodReadyToStartContainers") == "False"
    await runtime.remove_pod(md["uid"])
    assert not [p for p in await runtime.running_pods() if p.uid == md["uid"]]


async def test_pod_that_exits_succeeds(runtime):
    pod = make_pod("once", [{"name": "job", "command": ["sh", "-c", "echo done"]}], restartPolicy="Never")
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Succeeded")
    t = st["containerStatuses"][0]["state"]["terminated"]
    assert t["exitCode"] == 0 and t["reason"] == "Completed"
    assert cond(st, "Ready") == "False"
    assert next(c for c in st["conditions"] if c["type"] == "Ready")["reason"] == "PodCompleted"
    # the sandbox of a finished pod is stopped
    assert cond(st, "PodReadyToStartContainers") == "False"


class Clock:
    """Real time plus an offset a test moves forward to skip back-offs."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        import time
        return time.time() + self.offset


@pytest.fixture
async def clocked(containerd, tmp_path):
    cri = CRIClient(containerd.endpoint)
    clock = Clock()
    rt = KubeRuntime(cri, node_name="n1", pods_dir=str(tmp_path / "pods"), logs_dir=str(tmp_path / "logs"),
                     host_ips=["127.0.0.1"], clock=clock)
    rt.made = []
    rt.test_clock = clock
    try:
        yield rt
    finally:
        for uid in rt.made:
            await rt.remove_pod(uid)
        await cri.close()


async def read_log(rt: KubeRuntime, pod: dict, container: str, n: int = 0, want: str = "") -> str:
    path = os.path.join(rt.pod_log_dir(pod), container, f"{n}.log")
    text = ""
    for _ in range(100):
        if os.path.exists(path):
            text = "".join(ln.split(" ", 3)[3] for ln in open(path).read().splitlines(True) if ln.count(" ") >= 3)
            if want in text and text:
                return text
        await asyncio.sleep(0.1)
    return text


async def test_crash_loop_backoff_and_restart_count(clocked):
    rt = clocked
    pod = make_pod("crash", [{"name": "c", "command": ["sh", "-c", "echo run; exit 2"]}])
    st = await sync_until(rt, pod, lambda s: "terminated" in s["containerStatuses"][0].get("lastState", {})
                          or s["containerStatuses"][0]["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff")
    st = await sync_until(rt, pod, lambda s: s["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
                          == "CrashLoopBackOff")
    cs = st["containerStatuses"][0]
    assert cs["state"]["waiting"]["message"].startswith("back-off 10s restarting failed container=c pod=crash_default(")
    assert cs["lastState"]["terminated"]["exitCode"] == 2 and cs["lastState"]["terminated"]["reason"] == "Error"
    first = cs["restartCount"]
    assert st["phase"] == "Running" and next(c for c in st["conditions"] if c["type"] == "Ready")["status"] == "False"
    wake = rt.next_wakeup(pod["metadata"]["uid"])
    assert wake is not None and 0 < wake - rt.clock() <= 10
    # still backing off: nothing restarts
    again = await rt.sync_pod(pod)
    assert again["containerStatuses"][0]["restartCount"] == first
    rt.test_clock.offset += 11
    st = await sync_until(rt, pod, lambda s: s["containerStatuses"][0]["restartCount"] == first + 1)
    st = await sync_until(rt, pod, lambda s: s["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
                          == "CrashLoopBackOff")
    assert "back-off 20s" in st["containerStatuses"][0]["state"]["waiting"]["message"]
    # the log of each restart is its own file
    assert "run" in await read_log(rt, pod, "c", first + 1, "run")
    # only the current and the previous instance are kept
    rp = await rt.pod_runtime_status(pod["metadata"]["uid"])
    assert len(rp.instances("c")) <= 2
    # a third restart: the oldest instance and its log go
    rt.test_clock.offset += 21
    st = await sync_until(rt, pod, lambda s: s["containerStatuses"][0]["restartCount"] == first + 2)
    await rt.sync_pod(pod)
    rp = await rt.pod_runtime_status(pod["metadata"]["uid"])
    assert len(rp.instances("c")) == 2
    logs = sorted(os.listdir(os.path.join(rt.pod_log_dir(pod), "c")))
    assert logs == [f"{first + 1}.log", f"{first + 2}.log"]


async def test_init_and_sidecar_containers_run_in_order(runtime):
    pod = make_pod("inits", [{"name": "main", "command": ["sh", "-c", "echo main; exec sleep 60"]}],
                   initContainers=[
                       {"name": "first", "command": ["sh", "-c", "echo first"]},
                       {"name": "side", "restartPolicy": "Always", "command": ["sh", "-c", "exec sleep 60"]},
                       {"name": "second", "command": ["sh", "-c", "echo second"]}])
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    init = {s["name"]: s for s in st["initContainerStatuses"]}
    assert init["first"]["state"]["terminated"]["reason"] == "Completed" and init["first"]["ready"]
    assert "running" in init["side"]["state"] and init["side"]["started"] and init["side"]["ready"]
    assert init["second"]["state"]["terminated"]["exitCode"] == 0
    assert [s["name"] for s in st["initContainerStatuses"]] == ["first", "side", "second"]
    assert next(c for c in st["conditions"] if c["type"] == "Initialized")["status"] == "True"
    rp = await runtime.pod_runtime_status(pod["metadata"]["uid"])
    order = sorted(rp.containers, key=lambda c: c.created_at)
    assert [c.name for c in order] == ["first", "side", "second", "main"]
    final = await runtime.terminate_pod(pod, 2)
    assert all("terminated" in s["state"] for s in final["initContainerStatuses"])


async def test_failed_init_container_fails_a_never_pod(runtime):
    pod = make_pod("badinit", [{"name": "main", "command": ["true"]}], restartPolicy="Never",
                   initContainers=[{"name": "init", "command": ["sh", "-c", "exit 7"]}])
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Failed")
    assert st["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 7
    assert st["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


async def test_termination_messages_and_exit_reasons(runtime):
    pod = make_pod("msgs", [
        {"name": "file", "command": ["sh", "-c", "printf 'all done' > /dev/termination-log"]},
        {"name": "custom", "terminationMessagePath": "/tmp/why", "command": ["sh", "-c", "echo bad > /tmp/why; exit 4"]},
        {"name": "fallback", "terminationMessagePolicy": "FallbackToLogsOnError",
         "command": ["sh", "-c", "echo line1; echo boom; exit 1"]},
    ], restartPolicy="Never")
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Failed")
    t = {s["name"]: s["state"]["terminated"] for s in st["containerStatuses"]}
    assert t["file"]["message"] == "all done" and t["file"]["reason"] == "Completed"
    assert t["custom"]["message"] == "bad\n" and t["custom"]["exitCode"] == 4 and t["custom"]["reason"] == "Error"
    assert t["fallback"]["message"] == "line1\nboom\n"


async def test_oom_killed(runtime):
    pod = make_pod("oom", [{"name": "hog", "resources": {"limits": {"memory": "16Mi"}, "requests": {"memory": "16Mi"}},
                            "command": ["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"]}],
                   restartPolicy="Never")
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Failed", timeout=40)
    t = st["containerStatuses"][0]["state"]["terminated"]
    assert t["reason"] == "OOMKilled" and t["exitCode"] == 137


async def test_image_never_pull_and_pull_errors(clocked):
    rt = clocked
    pod = make_pod("noimg", [{"name": "a", "image": "127.0.0.1:1/none:1", "imagePullPolicy": "Never"}])
    st = await sync_until(rt, pod, lambda s: "waiting" in s["containerStatuses"][0]["state"]
                          and s["containerStatuses"][0]["state"]["waiting"].get("reason") == "ErrImageNeverPull")
    assert st["containerStatuses"][0]["state"]["waiting"]["message"] == (
        'Container image "127.0.0.1:1/none:1" is not present with pull policy of Never')
    assert st["phase"] == "Pending"
    pod = make_pod("pullfail", [{"name": "a", "image": "127.0.0.1:1/none:1", "imagePullPolicy": "IfNotPresent"}])
    st = await sync_until(rt, pod, lambda s: s["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
                          == "ErrImagePull", timeout=60)
    pulled = st["containerStatuses"][0]["state"]["waiting"]["message"]
    assert pulled.startswith("rpc error: code = ") and "127.0.0.1:1/none:1" in pulled
    st = await rt.sync_pod(pod)
    w = st["containerStatuses"][0]["state"]["waiting"]
    assert w["reason"] == "ImagePullBackOff"
    assert w["message"] == f'Back-off pulling image "127.0.0.1:1/none:1": ErrImagePull: {pulled}'
    rt.test_clock.offset += 11  # the back-off is over: pulled again
    st = await rt.sync_pod(pod)
    assert st["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
    assert rt.next_wakeup(pod["metadata"]["uid"]) is not None


async def test_env_command_expansion_workdir_and_user(runtime):
    pod = make_pod("env", [{"name": "a", "workingDir": "/tmp",
                            "env": [{"name": "GREETING", "value": "hi"},
                                    {"name": "MSG", "value": "$(GREETING) there $(NOPE)"},
                                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {
                                        "resource": "limits.memory", "divisor": "1Mi"}}}],
                            "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "32Mi"}},
                            "securityContext": {"runAsUser": 1234, "runAsGroup": 4321},
                            "command": ["sh", "-c"],
                            "args": ["echo \"$MSG|$POD|$IP|$MEM|$(pwd)|$(id -u):$(id -g)|$(GREETING)\""]}],
                   restartPolicy="Never")
    st = await sync_until(runtime, pod, lambda s: s["phase"] in ("Succeeded", "Failed"))
    assert st["phase"] == "Succeeded", st
    out = (await read_log(runtime, pod, "a", 0, "|")).strip()
    assert out == f"hi there $(NOPE)|env|{st['podIP']}|64|/tmp|1234:4321|hi"


async def test_graceful_stop_runs_prestop_and_sigkill_after_grace(runtime):
    pod = make_pod("stop", [
        {"name": "polite", "command": ["sh", "-c", "trap 'echo got-term; exit 0' TERM; echo up; while true; do sleep 0.1; done"],
         "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop > /proc/1/fd/1"]}}}},
        {"name": "stubborn", "command": ["sh", "-c", "trap '' TERM; echo up; while true; do sleep 0.1; done"]}],
        terminationGracePeriodSeconds=3)
    await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    await read_log(runtime, pod, "polite", 0, "up")
    await read_log(runtime, pod, "stubborn", 0, "up")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    final = await runtime.terminate_pod(pod, 3)
    took = loop.time() - t0
    t = {s["name"]: s["state"]["terminated"] for s in final["containerStatuses"]}
    assert t["polite"]["exitCode"] == 0 and t["stubborn"]["exitCode"] == 137
    assert 2.5 < took < 10
    log = await read_log(runtime, pod, "polite", 0, "got-term")
    assert log.index("prestop") < log.index("got-term")


async def test_a_new_runtime_adopts_running_containers(containerd, tmp_path, runtime):
    pod = make_pod("adopt", [{"name": "a", "command": ["sleep", "60"]}])
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    cid = st["containerStatuses"][0]["containerID"]
    async with CRIClient(containerd.endpoint) as cri:
        fresh = KubeRuntime(cri, node_name="n1", pods_dir=runtime.pods_dir, logs_dir=runtime.logs_dir,
                            host_ips=["127.0.0.1"])
        assert pod["metadata"]["uid"] in {p.uid for p in await fresh.running_pods()}
        again = await fresh.sync_pod(pod)
        assert again["containerStatuses"][0]["containerID"] == cid and again["phase"] == "Running"
        assert again["containerStatuses"][0]["restartCount"] == 0


@pytest.fixture
async def api():
    """An API (registry over a memory store) the runtime reads ConfigMaps, Secrets and
    Services from and records its events to."""
    from kubeplane.api.resources import CATALOGUE
    from kubeplane.apiserver.app import ensure_default_namespaces
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.registry.registry import Registry
    from kubeplane.storage.memory import MemoryStore

    store = MemoryStore(history=1000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    try:
        yield client
    finally:
        await client.close()
        await registry.close()
        await store.close()


@pytest.fixture
async def with_api(containerd, tmp_path, api):
    from kubeplane.client.events import EventRecorder

    cri = CRIClient(containerd.endpoint)
    recorder = EventRecorder(api, "kubelet", host="n1")
    rt = KubeRuntime(cri, client=api, node_name="n1", pods_dir=str(tmp_path / "pods"),
                     logs_dir=str(tmp_path / "logs"), host_ips=["127.0.0.1"], recorder=recorder,
                     allocatable={"cpu": "2", "memory": "4Gi"})
    rt.made = []
    try:
        yield rt
    finally:
        for uid in rt.made:
            await rt.remove_pod(uid)
        await rt.close()
        await recorder.close()
        await cri.close()


async def events_of(client, pod: dict) -> list[tuple[str, str, str]]:
    from kubeplane.api.resources import resource

    await asyncio.sleep(0)
    items = (await client.list(resource("events"), "default")).get("items") or []
    return [(e["type"], e["reason"], e["message"]) for e in items
            if e["involvedObject"]["uid"] == pod["metadata"]["uid"]]


async def test_container_events_name_the_container(with_api):
    """Events about a container carry its fieldPath, as upstream's container references."""
    from kubeplane.api.resources import resource

    rt = with_api
    pod = make_pod("refs", [{"name": "main", "command": ["true"]}],
                   initContainers=[{"name": "setup", "command": ["true"]}], restartPolicy="Never")
    await sync_until(rt, pod, lambda s: s["phase"] == "Succeeded")
    await rt.recorder.flush(5)
    items = (await rt.client.list(resource("events"), "default")).get("items") or []
    got = {(e["involvedObject"].get("fieldPath"), e["reason"]) for e in items
           if e["involvedObject"]["uid"] == pod["metadata"]["uid"]}
    for path in ("spec.initContainers{setup}", "spec.containers{main}"):
        assert {(path, "Pulled"), (path, "Created"), (path, "Started")} <= got, got


async def test_env_from_configmaps_secrets_and_services(with_api):
    import base64

    from kubeplane.api.resources import resource

    rt, client = with_api, with_api.client
    await client.create(resource("configmaps"), {"metadata": {"name": "cfg"}, "data": {
        "COLOR": "blue", "SIZE": "3", "dotted.key": "ok"}}, "default")
    await client.create(resource("secrets"), {"metadata": {"name": "sec"}, "data": {
        "token": base64.b64encode(b"s3cret").decode()}}, "default")
    await client.create(resource("services"), {"metadata": {"name": "my-web"}, "spec": {
        "ports": [{"port": 8080, "name": "http"}], "selector": {"app": "x"}}}, "default")
    pod = make_pod("envsrc", [{"name": "a", "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CM_"}],
                               "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
                                       {"name": "OPT", "valueFrom": {"configMapKeyRef": {
                                           "name": "nope", "key": "k", "optional": True}}},
                                       {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}],
                               "command": ["sh", "-c", 'echo "$CM_COLOR|$CM_SIZE|$TOKEN|${OPT-unset}|$CPU|'
                                           '$MY_WEB_SERVICE_PORT_HTTP|$MY_WEB_PORT|$(tr "\\0" "\\n" < /proc/1/environ | grep -c CM_dotted.key=ok)"']}],
                   restartPolicy="Never")
    st = await sync_until(rt, pod, lambda s: s["phase"] in ("Succeeded", "Failed"))
    assert st["phase"] == "Succeeded"
    svc = await client.get(resource("services"), "my-web", "default")
    ip = svc["spec"]["clusterIP"]
    out = (await read_log(rt, pod, "a", 0, "|")).strip()
    assert out == f"blue|3|s3cret|unset|2|8080|tcp://{ip}:8080|1"


async def test_missing_configmap_is_a_config_error(with_api):
    rt = with_api
    pod = make_pod("nocfg", [{"name": "a", "command": ["true"], "env": [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]}])
    st = await sync_until(rt, pod, lambda s: "waiting" in s["containerStatuses"][0]["state"]
                          and s["containerStatuses"][0]["state"]["waiting"].get("reason") == "CreateContainerConfigError")
    assert st["containerStatuses"][0]["state"]["waiting"]["message"] == 'configmap "absent" not found'
    await rt.recorder.flush(5)
    assert ("Warning", "Failed", 'Error: configmap "absent" not found') in await events_of(rt.client, pod)


async def test_post_start_hook_failure_event_and_kill(with_api):
    rt = with_api
    pod = make_pod("hook2", [{"name": "a", "command": ["sleep", "60"],
                              "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "exit 3"]}}}}],
                   restartPolicy="Never")
    st = await sync_until(rt, pod, lambda s: s["phase"] == "Failed")
    assert st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    await rt.recorder.flush(5)
    evs = await events_of(rt.client, pod)
    assert any(r == "FailedPostStartHook" and "exited with 3" in m for _, r, m in evs), evs
    assert ("Normal", "Started", "Container started") in evs


async def test_sidecar_stops_when_the_main_container_is_done(runtime):
    pod = make_pod("jobside", [{"name": "main", "command": ["sh", "-c", "sleep 0.5; echo done"]}],
                   restartPolicy="Never",
                   initContainers=[{"name": "side", "restartPolicy": "Always", "command": ["sleep", "60"]}])
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Succeeded")
    assert "terminated" in st["initContainerStatuses"][0]["state"]
    assert st["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    rp = await runtime.pod_runtime_status(pod["metadata"]["uid"])
    assert not rp.running() and not any(s.ready for s in rp.sandboxes)


async def test_prestop_http_and_sleep_hooks(runtime):
    pod = make_pod("hooks", [
        {"name": "web", "command": ["httpd", "-f", "-vv", "-p", "8080"], "ports": [{"name": "http", "containerPort": 8080}],
         "lifecycle": {"preStop": {"httpGet": {"path": "/prestop-called", "port": "http"}}}},
        {"name": "nap", "command": ["sleep", "60"], "lifecycle": {"preStop": {"sleep": {"seconds": 2}}}}],
        terminationGracePeriodSeconds=4)
    await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    await asyncio.sleep(0.3)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    final = await runtime.terminate_pod(pod, 4)
    took = loop.time() - t0
    assert all("terminated" in s["state"] for s in final["containerStatuses"])
    assert took >= 2  # the sleep hook ran before the stop signal
    assert "/prestop-called" in await read_log(runtime, pod, "web", 0, "/prestop-called")


async def test_missing_executable_is_run_container_error_then_backoff(clocked):
    rt = clocked
    pod = make_pod("noexec", [{"name": "a", "command": ["/no/such/binary"]}])
    st = await sync_until(rt, pod, lambda s: s["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
                          == "RunContainerError")
    w = st["containerStatuses"][0]["state"]["waiting"]
    assert "/no/such/binary" in w["message"]
    st = await sync_until(rt, pod, lambda s: s["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
                          == "CrashLoopBackOff")
    last = st["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 128 and last["reason"] == "StartError"


async def test_hostname_hosts_file_and_cluster_dns(containerd, tmp_path):
    async with CRIClient(containerd.endpoint) as cri:
        rt = KubeRuntime(cri, node_name="n1", pods_dir=str(tmp_path / "pods"), logs_dir=str(tmp_path / "logs"),
                         host_ips=["127.0.0.1"], cluster_dns=["10.96.0.10"], cluster_domain="cluster.local")
        rt.made = []
        try:
            pod = make_pod("ident", [{"name": "a", "command": ["sh", "-c",
                                                               "hostname; cat /etc/hosts /etc/resolv.conf"]}],
                           restartPolicy="Never", hostname="web-0", subdomain="web",
                           hostAliases=[{"ip": "192.0.2.9", "hostnames": ["alias.example"]}])
            st = await sync_until(rt, pod, lambda s: s["phase"] in ("Succeeded", "Failed"))
            assert st["phase"] == "Succeeded"
            out = await read_log(rt, pod, "a", 0, "nameserver")
            lines = out.splitlines()
            assert lines[0] == "web-0"
            assert f"{st['podIP']}\tweb-0.web.default.svc.cluster.local\tweb-0" in lines
            assert "192.0.2.9\talias.example" in lines
            assert "nameserver 10.96.0.10" in lines
            assert any(ln.startswith("search default.svc.cluster.local svc.cluster.local cluster.local")
                       for ln in lines)
            assert "options ndots:5" in lines
        finally:
            for uid in rt.made:
                await rt.remove_pod(uid)


async def test_host_network_pod_uses_the_node_ips(runtime):
    import socket

    pod = make_pod("hostnet", [{"name": "a", "command": ["sh", "-c", "hostname"]}], restartPolicy="Never",
                   hostNetwork=True)
    st = await sync_until(runtime, pod, lambda s: s["phase"] in ("Succeeded", "Failed"))
    assert st["phase"] == "Succeeded" and st["podIP"] == "127.0.0.1" and st["podIPs"] == [{"ip": "127.0.0.1"}]
    assert (await read_log(runtime, pod, "a", 0, "\n")).strip() == socket.gethostname()


@pytest.fixture
async def full(containerd, tmp_path, api):
    """The runtime with the node's real prober and volume manager, as the agent wires them."""
    from kubeplane.client.events import EventRecorder
    from kubeplane.node.prober import ProbeManager
    from kubeplane.node.volumes import VolumeManager

    cri = CRIClient(containerd.endpoint)
    recorder = EventRecorder(api, "kubelet", host="n1")
    woken = asyncio.Event()
    prober = ProbeManager(cri, lambda uid: woken.set(), recorder=recorder)
    pods_dir = str(tmp_path / "pods")
    volumes = VolumeManager(api, pods_dir, node_name="n1")
    rt = KubeRuntime(cri, client=api, node_name="n1", pods_dir=pods_dir, logs_dir=str(tmp_path / "logs"),
                     host_ips=["127.0.0.1"], recorder=recorder, volumes=volumes, prober=prober)
    rt.made = []
    rt.woken = woken
    try:
        yield rt
    finally:
        for uid in rt.made:
            prober.remove_pod(uid)
            await rt.remove_pod(uid)
        await rt.close()
        await prober.close()
        await recorder.close()
        await cri.close()


async def drive(rt: KubeRuntime, pod: dict, pred, timeout: float = 30.0) -> dict:
    """Sync as the agent's pod worker does: probes registered, woken by probe results."""
    if pod["metadata"]["uid"] not in rt.made:
        rt.made.append(pod["metadata"]["uid"])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        rt.prober.add_pod(pod)
        pod["status"] = await rt.sync_pod(pod)
        if pred(pod["status"]):
            return pod["status"]
        assert loop.time() < deadline, f"timed out; status: {pod['status']}"
        rt.woken.clear()
        try:
            await asyncio.wait_for(rt.woken.wait(), 0.3)
        except asyncio.TimeoutError:
            pass


def ready(st: dict) -> str:
    return next(c["status"] for c in st["conditions"] if c["type"] == "Ready")


async def test_probes_and_volumes_with_the_real_managers(full):
    rt = full
    probe = {"periodSeconds": 1, "failureThreshold": 1}
    pod = make_pod("probed", [{
        "name": "main", "command": ["sh", "-c", "cat /shared/seed; exec sleep 60"],
        "volumeMounts": [{"name": "work", "mountPath": "/shared"}],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/shared/ready"]}, **probe},
        "livenessProbe": {"exec": {"command": ["sh", "-c", "! test -f /shared/die"]}, **probe}}],
        initContainers=[{"name": "seed", "command": ["sh", "-c", "echo seeded > /shared/seed"],
                         "volumeMounts": [{"name": "work", "mountPath": "/shared"}]}],
        volumes=[{"name": "work", "emptyDir": {}}])
    st = await drive(rt, pod, lambda s: s["phase"] == "Running")
    assert ready(st) == "False" and st["containerStatuses"][0]["ready"] is False
    assert "seeded" in await read_log(rt, pod, "main", 0, "seeded")
    cid = st["containerStatuses"][0]["containerID"].split("://")[1]
    await rt.cri.runtime("ExecSync", pb.ExecSyncRequest(container_id=cid, cmd=["touch", "/shared/ready"], timeout=5))
    st = await drive(rt, pod, lambda s: ready(s) == "True")
    assert st["containerStatuses"][0]["ready"] is True
    await rt.cri.runtime("ExecSync", pb.ExecSyncRequest(container_id=cid, cmd=["touch", "/shared/die"], timeout=5))
    st = await drive(rt, pod, lambda s: s["containerStatuses"][0]["restartCount"] == 1)
    cs = st["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] in (137, 143)
    # the emptyDir outlives the container: the new one still has the files
    assert cs["containerID"].split("://")[1] != cid
    await rt.recorder.flush(5)
    evs = await events_of(rt.client, pod)
    assert ("Normal", "Killing", "Container main failed liveness probe, will be restarted") in evs
    assert any(r == "Unhealthy" for _, r, _ in evs)


async def test_many_pods_at_once(runtime, containerd):
    pods = [make_pod(f"many-{i}", [{"name": "a", "command": ["sleep", "60"]}]) for i in range(8)]
    sts = await asyncio.gather(*(sync_until(runtime, p, lambda s: s["phase"] == "Running") for p in pods))
    ips = {s["podIP"] for s in sts}
    assert len(ips) == 8 and all(ipaddress.ip_address(ip) in ipaddress.ip_network(containerd.pod_cidr) for ip in ips)
    mine = {p.uid for p in await runtime.running_pods()} & {p["metadata"]["uid"] for p in pods}
    assert len(mine) == 8
    await asyncio.gather(*(runtime.terminate_pod(p, 2) for p in pods))
    await asyncio.gather(*(runtime.remove_pod(p["metadata"]["uid"]) for p in pods))
    assert not {p.uid for p in await runtime.running_pods()} & {p["metadata"]["uid"] for p in pods}


async def test_security_context_is_enforced(full):
    runtime = full
    script = ("touch /rootfs-write 2>/dev/null && echo rw || echo ro; "
              "touch /tmp/f; chown 65534 /tmp/f 2>/dev/null && echo chown-ok || echo chown-denied; "
              "mkdir -p /mnt/t; mount -t tmpfs none /mnt/t 2>/dev/null && echo mount-ok || echo mount-denied")
    pod = make_pod("secctx", [
        {"name": "locked", "command": ["sh", "-c", script],
         "securityContext": {"readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
         "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "mnt", "mountPath": "/mnt"}]},
        {"name": "priv", "command": ["sh", "-c", script], "securityContext": {"privileged": True}}],
        restartPolicy="Never")
    pod["spec"]["volumes"] = [{"name": "tmp", "emptyDir": {}}, {"name": "mnt", "emptyDir": {}}]
    st = await drive(runtime, pod, lambda s: s["phase"] in ("Succeeded", "Failed"))
    assert st["phase"] == "Succeeded"
    assert (await read_log(runtime, pod, "locked", 0, "mount")).split() == ["ro", "chown-denied", "mount-denied"]
    assert (await read_log(runtime, pod, "priv", 0, "mount")).split() == ["rw", "chown-ok", "mount-ok"]


async def test_orphan_removed_with_its_annotated_prestop_and_grace(full, tmp_path):
    rt = full
    host = tmp_path / "host"
    host.mkdir()
    pod = make_pod("orphan", [{"name": "a", "command": ["sh", "-c", "trap 'echo term >> /host/log; exit 0' TERM; "
                                                                    "while true; do sleep 0.1; done"],
                               "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                               "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop >> /host/log"]}}}}],
                   terminationGracePeriodSeconds=5, volumes=[{"name": "host", "hostPath": {"path": str(host)}}])
    await drive(rt, pod, lambda s: s["phase"] == "Running")
    await asyncio.sleep(0.3)
    # a runtime that never saw the pod object: only the CRI's labels and annotations
    async with CRIClient(rt.cri.endpoint) as cri:
        fresh = KubeRuntime(cri, node_name="n1", pods_dir=rt.pods_dir, logs_dir=rt.logs_dir)
        await fresh.remove_pod(pod["metadata"]["uid"])
    assert (host / "log").read_text().split() == ["prestop", "term"]
    assert pod["metadata"]["uid"] not in {p.uid for p in await rt.running_pods()}


def _nat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-t", "nat", *args], capture_output=True, text=True)


async def test_host_port_reaches_the_pod(runtime, containerd):
    gateway = str(next(ipaddress.ip_network(containerd.pod_cidr).hosts()))
    host_port = 30000 + os.getpid() % 2000
    pod = make_pod("hostport", [{"name": "web", "command": ["sh", "-c", "echo hi > /tmp/index.html; "
                                                                       "exec httpd -f -p 8080 -h /tmp"],
                                 "ports": [{"containerPort": 8080, "hostPort": host_port, "protocol": "TCP"}]}])
    try:
        body = await _get_through_host_port(runtime, pod, gateway, host_port)
    finally:
        await runtime.remove_pod(pod["metadata"]["uid"])
        cni.remove_unused_hostport_chains()  # portmap leaves its shared chains behind
    assert body.startswith(b"HTTP/1.") and body.endswith(b"hi\n")
    assert f"dport {host_port}" not in _nat("-S").stdout


async def _get_through_host_port(runtime, pod, gateway: str, host_port: int) -> bytes:
    await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    body = b""
    for _ in range(50):
        try:
            reader, writer = await asyncio.open_connection(gateway, host_port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.write(b"GET /index.html HTTP/1.0\r\n\r\n")
        await writer.drain()
        body = await reader.read()
        writer.close()
        if body:
            break
        await asyncio.sleep(0.1)
    return body


async def test_a_dead_sandbox_is_replaced_and_init_containers_run_again(runtime):
    pod = make_pod("resandbox", [{"name": "main", "command": ["sleep", "60"]}],
                   initContainers=[{"name": "init", "command": ["true"]}])
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Running")
    uid = pod["metadata"]["uid"]
    first = (await runtime.pod_runtime_status(uid)).sandbox
    await runtime.cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=first.id))
    st = await sync_until(runtime, pod, lambda s: s["phase"] == "Running"
                          and s["containerStatuses"][0]["restartCount"] == 1)
    rp = await runtime.pod_runtime_status(uid)
    assert rp.sandbox.id != first.id and rp.sandbox.attempt == first.attempt + 1 and rp.sandbox.ready
    inits = [c for c in rp.containers if c.name == "init"]
    assert len(inits) == 2 and inits[0].sandbox_id == rp.sandbox.id
    assert next(c for c in st["conditions"] if c["type"] == "PodReadyToStartContainers")["status"] == "True"


# -- pod cgroups --------------------------------------------------------------------------

@pytest.fixture
async def with_cgroups(containerd, tmp_path):
    from kubeplane.node.cgroups import PodCgroups, ResourceConfig

    root = own_cgroup_root("rt")
    cgroups = PodCgroups(root, node_config=ResourceConfig(cpu_shares=2048, memory=8 << 30))
    cri = CRIClient(containerd.endpoint)
    rt = KubeRuntime(cri, node_name="n1", pods_dir=str(tmp_path / "pods"), logs_dir=str(tmp_path / "logs"),
                     host_ips=["127.0.0.1"], cgroups=cgroups)
    rt.made = []
    try:
        yield rt
    finally:
        for uid in rt.made:
            await rt.remove_pod(uid)
        cgroups.remove_all()
        await cri.close()
        remove_cgroup_root(root)


def _cgroup_of(pid: int, controller: str) -> str:
    for line in open(f"/proc/{pid}/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        if controller in ctrls.split(","):
            return path
    raise AssertionError(f"no {controller} cgroup for {pid}")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


async def test_pods_run_in_their_cgroup_under_the_qos_hierarchy(with_cgroups):
    """The pod's cgroup (its limits as upstream's pod container manager sets them) is the
    sandbox's cgroup parent: the sandbox and the containers run under it; it goes with the pod."""
    import json

    rt = with_cgroups
    root = rt.cgroups.root
    burstable = make_pod("cg-b", [{"name": "a", "command": ["sleep", "60"], "resources": {
        "requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}}}])
    guaranteed = make_pod("cg-g", [{"name": "a", "command": ["sleep", "60"], "resources": {
        "requests": {"cpu": "250m", "memory": "48Mi"}, "limits": {"cpu": "250m", "memory": "48Mi"}}}])
    besteffort = make_pod("cg-be", [{"name": "a", "command": ["sleep", "60"]}])
    want = {"cg-b": f"{root}/kubepods/burstable/pod{burstable['metadata']['uid']}",
            "cg-g": f"{root}/kubepods/pod{guaranteed['metadata']['uid']}",
            "cg-be": f"{root}/kubepods/besteffort/pod{besteffort['metadata']['uid']}"}
    for pod in (burstable, guaranteed, besteffort):
        await sync_until(rt, pod, lambda s: s["phase"] == "Running")
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        st = await rt.cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid, verbose=True))
        pid = json.loads(st.info["info"])["pid"]
        for controller in ("memory", "cpu", "pids"):
            assert _cgroup_of(pid, controller).startswith(want[pod["metadata"]["name"]] + "/")
    memory, cpu = "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu"
    b, g, be = want["cg-b"], want["cg-g"], want["cg-be"]
    assert _read(f"{memory}{b}/memory.limit_in_bytes") == str(64 << 20)
    assert _read(f"{cpu}{b}/cpu.shares") == "102" and _read(f"{cpu}{b}/cpu.cfs_quota_us") == "50000"
    assert _read(f"{memory}{g}/memory.limit_in_bytes") == str(48 << 20)
    assert _read(f"{cpu}{g}/cpu.shares") == "256" and _read(f"{cpu}{g}/cpu.cfs_quota_us") == "25000"
    assert _read(f"{cpu}{be}/cpu.shares") == "2" and _read(f"{cpu}{be}/cpu.cfs_quota_us") == "-1"
    assert int(_read(f"{memory}{be}/memory.limit_in_bytes")) > 1 << 40  # unlimited
    # the QoS cgroups: burstable gets its pods' cpu requests, besteffort the least there is
    assert _read(f"{cpu}{root}/kubepods/burstable/cpu.shares") == "102"
    assert _read(f"{cpu}{root}/kubepods/besteffort/cpu.shares") == "2"
    assert _read(f"{cpu}{root}/kubepods/cpu.shares") == "2048"
    assert _read(f"{memory}{root}/kubepods/memory.limit_in_bytes") == str(8 << 30)
    # with a cgroup parent, containerd 1.6 answers ListPodSandboxStats for the pods
    stats = await rt.cri.runtime("ListPodSandboxStats", pb.ListPodSandboxStatsRequest())
    by_uid = {s.attributes.metadata.uid: s for s in stats.stats}
    s = by_uid[burstable["metadata"]["uid"]]
    assert s.linux.memory.working_set_bytes.value > 0 and s.linux.cpu.usage_core_nano_seconds.value > 0
    for pod in (burstable, guaranteed, besteffort):
        await rt.terminate_pod(pod, 0)
        await rt.remove_pod(pod["metadata"]["uid"])
    for path in want.values():
        for controller in ("memory", "cpu", "cpuacct", "pids", "systemd", "unified"):
            assert not os.path.exists(f"/sys/fs/cgroup/{controller}{path}"), (controller, path)
    # the burstable pod gone, its QoS cgroup's shares are the least again
    assert _read(f"{cpu}{root}/kubepods/burstable/cpu.shares") == "2"


async def test_a_finished_pod_gives_its_cgroup_back(with_cgroups):
    rt = with_cgroups
    pod = make_pod("cg-done", [{"name": "a", "command": ["true"], "resources": {"limits": {"memory": "20Mi"}}}],
                   restartPolicy="Never")
    pod_cgroup = f"/sys/fs/cgroup/memory{rt.cgroups.pod_name(pod)}"
    await sync_until(rt, pod, lambda s: True)  # one sync: the cgroup, the sandbox, the container
    assert _read(f"{pod_cgroup}/memory.limit_in_bytes") == str(20 << 20)
    await sync_until(rt, pod, lambda s: s["phase"] == "Succeeded")
    # gone with the pod's sandbox, while the pod (and its exited container) is still there
    assert not os.path.exists(pod_cgroup)
    assert (await rt.pod_runtime_status(pod["metadata"]["uid"])).containers
    assert pod["metadata"]["uid"] not in rt.cgroups.pods
