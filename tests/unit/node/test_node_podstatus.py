"""The pod status computed from the runtime's view, without a runtime."""

from __future__ import annotations

from kubeplane.node.podstatus import (
    CREATED, EXITED, RUNNING, ContainerInfo, RuntimePod, SandboxInfo, compute_pod_status, pod_phase,
)

NOW = 1_700_000_000.0
NS = 1_000_000_000


def pod(containers, init=None, restart="Always", status=None, **spec):
    p = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
         "spec": {"containers": [{"name": n, "image": "img"} for n in containers], "restartPolicy": restart, **spec},
         "status": status or {"phase": "Pending"}}
    if init:
        p["spec"]["initContainers"] = init
    return p


def ctr(name, state, *, exit_code=0, reason="", restarts=0, created=1, cid=None):
    return ContainerInfo(id=f"containerd://{cid or name + str(restarts)}", name=name, state=state,
                         created_at=created * NS, started_at=created * NS, finished_at=(created + 1) * NS,
                         exit_code=exit_code, reason=reason, image="img", image_ref="sha256:abc",
                         restart_count=restarts)


def rt(*containers, ready=True, ip="10.0.0.5"):
    r = RuntimePod(uid="u1", sandboxes=[SandboxInfo(id="sb", ready=ready, ip=ip)], containers=list(containers))
    r.containers.sort(key=lambda c: c.created_at, reverse=True)
    return r


def conds(st):
    return {c["type"]: (c["status"], c.get("reason"), c.get("message")) for c in st["conditions"]}


def test_no_containers_yet_is_pending_and_creating():
    p = pod(["a"])
    st = compute_pod_status(p, rt(), now=NOW, host_ips=["192.0.2.1"])
    assert st["phase"] == "Pending"
    assert st["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert st["podIP"] == "10.0.0.5" and st["hostIP"] == "192.0.2.1" and st["hostIPs"] == [{"ip": "192.0.2.1"}]
    c = conds(st)
    assert c["ContainersReady"] == ("False", "ContainersNotReady", "containers with unready status: [a]")
    assert c["Ready"] == c["ContainersReady"]
    assert c["PodReadyToStartContainers"][0] == "True" and c["PodScheduled"][0] == "True"
    assert st["qosClass"] == "BestEffort" and st["startTime"] == "2023-11-14T22:13:20Z"


def test_running_ready_and_transition_times_kept():
    p = pod(["a", "b"])
    r = rt(ctr("a", RUNNING), ctr("b", RUNNING, created=2))
    st = compute_pod_status(p, r, now=NOW)
    assert st["phase"] == "Running"
    assert all(s["ready"] and s["started"] for s in st["containerStatuses"])
    assert conds(st)["Ready"] == ("True", None, None)
    p["status"] = st
    later = compute_pod_status(p, r, now=NOW + 100)
    assert [c["lastTransitionTime"] for c in later["conditions"]] == [c["lastTransitionTime"] for c in st["conditions"]]
    assert later["startTime"] == st["startTime"]


def test_readiness_probe_gates_ready_and_startup_probe_gates_started():
    p = pod(["a"])
    p["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["true"]}}
    r = rt(ctr("a", RUNNING))
    st = compute_pod_status(p, r, now=NOW, ready=lambda cid: False)
    assert st["containerStatuses"][0]["ready"] is False and conds(st)["Ready"][0] == "False"
    st = compute_pod_status(p, r, now=NOW, ready=lambda cid: cid == "containerd://a0")
    assert st["containerStatuses"][0]["ready"] is True
    p["spec"]["containers"][0]["startupProbe"] = {"exec": {"command": ["true"]}}
    st = compute_pod_status(p, r, now=NOW, ready=lambda cid: True, started=lambda cid: False)
    assert st["containerStatuses"][0]["started"] is False and st["containerStatuses"][0]["ready"] is False


def test_crash_loop_waiting_with_last_state_and_restart_count():
    p = pod(["a"])
    r = rt(ctr("a", EXITED, exit_code=1, reason="Error", restarts=2, created=5),
           ctr("a", EXITED, exit_code=1, reason="Error", restarts=1, created=3))
    msg = "back-off 20s restarting failed container=a pod=p_ns(u1)"
    st = compute_pod_status(p, r, waiting={"a": ("CrashLoopBackOff", msg)}, now=NOW)
    cs = st["containerStatuses"][0]
    assert cs["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}
    assert cs["lastState"]["terminated"]["exitCode"] == 1 and cs["lastState"]["terminated"]["reason"] == "Error"
    assert cs["lastState"]["terminated"]["containerID"] == "containerd://a2"
    assert cs["restartCount"] == 2 and st["phase"] == "Running"


def test_never_restart_failure_is_failed_onfailure_success_is_succeeded():
    failed = compute_pod_status(pod(["a"], restart="Never"), rt(ctr("a", EXITED, exit_code=3, reason="Error")), now=NOW)
    assert failed["phase"] == "Failed"
    assert conds(failed)["Ready"] == ("False", "PodFailed", None)
    ok = compute_pod_status(pod(["a"], restart="OnFailure"), rt(ctr("a", EXITED, reason="Completed")), now=NOW)
    assert ok["phase"] == "Succeeded" and conds(ok)["ContainersReady"] == ("False", "PodCompleted", None)
    # OnFailure with a failure restarts: Running
    again = compute_pod_status(pod(["a"], restart="OnFailure"), rt(ctr("a", EXITED, exit_code=1)), now=NOW)
    assert again["phase"] == "Running"


def test_terminal_phase_is_sticky():
    p = pod(["a"], status={"phase": "Succeeded"})
    st = compute_pod_status(p, rt(ctr("a", RUNNING)), now=NOW)
    assert st["phase"] == "Succeeded"


def test_init_containers_pending_initialized_and_failed():
    init = [{"name": "i1", "image": "img"}, {"name": "i2", "image": "img"}]
    p = pod(["a"], init=init)
    st = compute_pod_status(p, rt(ctr("i1", RUNNING)), now=NOW)
    assert st["phase"] == "Pending"
    assert st["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert conds(st)["Initialized"] == ("False", "ContainersNotInitialized",
                                        "containers with incomplete status: [i1 i2]")
    st = compute_pod_status(p, rt(ctr("i1", EXITED, reason="Completed"), ctr("i2", EXITED, reason="Completed", created=2),
                                  ctr("a", RUNNING, created=3)), now=NOW)
    assert st["phase"] == "Running" and conds(st)["Initialized"][0] == "True"
    assert [s["ready"] for s in st["initContainerStatuses"]] == [True, True]
    pn = pod(["a"], init=init, restart="Never")
    st = compute_pod_status(pn, rt(ctr("i1", EXITED, exit_code=2, reason="Error")), now=NOW)
    assert st["phase"] == "Failed"


def test_sidecar_counts_as_started_not_terminated():
    init = [{"name": "side", "image": "img", "restartPolicy": "Always"}]
    p = pod(["a"], init=init)
    st = compute_pod_status(p, rt(ctr("side", RUNNING), ctr("a", RUNNING, created=2)), now=NOW)
    assert st["phase"] == "Running" and conds(st)["Ready"][0] == "True"
    assert st["initContainerStatuses"][0]["started"] is True
    # a main container done with the sidecar still running: phase from the main ones
    p2 = pod(["a"], init=init, restart="Never")
    st = compute_pod_status(p2, rt(ctr("side", RUNNING), ctr("a", EXITED, reason="Completed", created=2)), now=NOW)
    assert st["phase"] == "Running"  # sidecar still running
    st = compute_pod_status(p2, rt(ctr("side", EXITED, exit_code=143, reason="Error"),
                                   ctr("a", EXITED, reason="Completed", created=2)), now=NOW, terminal=True)
    assert st["phase"] == "Succeeded"


def test_sandbox_gone_means_not_ready_to_start_and_no_pod_ip():
    st = compute_pod_status(pod(["a"]), rt(ready=False, ip=""), now=NOW)
    assert conds(st)["PodReadyToStartContainers"][0] == "False" and "podIP" not in st


def test_readiness_gates_and_foreign_conditions_kept():
    p = pod(["a"], readinessGates=[{"conditionType": "example.com/ok"}],
            status={"phase": "Running", "conditions": [
                {"type": "example.com/ok", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"},
                {"type": "DisruptionTarget", "status": "True"}]})
    st = compute_pod_status(p, rt(ctr("a", RUNNING)), now=NOW)
    c = conds(st)
    assert c["Ready"] == ("False", "ReadinessGatesNotReady",
                          'the status of pod readiness gate "example.com/ok" is not "True", but False')
    assert c["ContainersReady"][0] == "True" and "DisruptionTarget" in c


def test_phase_created_container_is_pending():
    p = pod(["a"])
    st = compute_pod_status(p, rt(ctr("a", CREATED)), now=NOW)
    assert st["phase"] == "Pending"


def test_pod_phase_restart_rules():
    p = pod(["a"], restart="Never")
    p["spec"]["containers"][0].update(restartPolicy="Never", restartPolicyRules=[
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}])
    s = [{"name": "a", "state": {"terminated": {"exitCode": 42}}}]
    assert pod_phase(p, s, [], terminal=False, initialized=True) == "Running"
    s = [{"name": "a", "state": {"terminated": {"exitCode": 1}}}]
    assert pod_phase(p, s, [], terminal=False, initialized=True) == "Failed"


def test_observed_generation_and_status_order():
    p = pod(["zeta", "alpha"])
    p["metadata"]["generation"] = 3
    st = compute_pod_status(p, rt(ctr("zeta", RUNNING), ctr("alpha", RUNNING, created=2)), now=NOW)
    assert st["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])
    assert [s["name"] for s in st["containerStatuses"]] == ["alpha", "zeta"]


def test_volume_mounts_and_resources_in_statuses():
    p = pod(["a"])
    p["spec"]["containers"][0].update(
        volumeMounts=[{"name": "data", "mountPath": "/data"}, {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True}],
        resources={"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}})
    st = compute_pod_status(p, rt(), now=NOW)
    cs = st["containerStatuses"][0]
    assert cs["volumeMounts"] == [{"name": "data", "mountPath": "/data"},
                                  {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True,
                                   "recursiveReadOnly": "Disabled"}]
    assert "resources" not in cs  # no container yet
    st = compute_pod_status(p, rt(ctr("a", RUNNING)), now=NOW)
    cs = st["containerStatuses"][0]
    assert cs["resources"] == {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}
    assert cs["allocatedResources"] == {"cpu": "100m"} and st["qosClass"] == "Burstable"


def test_container_field_path_names_the_list_the_container_is_in():
    from kubeplane.node.podstatus import container_field_path

    pod = {"spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}],
                    "ephemeralContainers": [{"name": "debug"}]}}
    assert container_field_path(pod, "a") == "spec.containers{a}"
    assert container_field_path(pod, "i") == "spec.initContainers{i}"
    assert container_field_path(pod, "debug") == "spec.ephemeralContainers{debug}"
    assert container_field_path(pod, "gone") == ""
