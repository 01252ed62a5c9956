"""The pod status a node reports, computed from what the container runtime says.

Pure functions, no I/O: the runtime's view of one pod (its sandboxes and every
container instance, as :class:`RuntimePod`) plus the pod, the status reported
before, the waiting reasons the runtime recorded (image pulls, back-offs,
config errors) and the probe results give the ``status`` upstream's kubelet
writes: phase (``getPhase``), the kubelet's conditions (PodReadyToStartContainers,
Initialized, Ready, ContainersReady, PodScheduled) with transition times kept
while a condition does not change, container and init container statuses with
state, lastState, restartCount, image, imageID, containerID, started and ready,
podIP(s), hostIP(s), qosClass and startTime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.api.gofmt import go_list
from kubeplane.api.meta import format_timestamp
from kubeplane.api.qos import pod_qos_class

Obj = dict[str, Any]

#: container states as the kubelet's runtime layer names them
RUNNING, CREATED, EXITED, UNKNOWN = "running", "created", "exited", "unknown"

CONTAINER_CREATING = "ContainerCreating"
POD_INITIALIZING = "PodInitializing"

#: conditions the kubelet owns; the others in the pod's status are kept
KUBELET_CONDITIONS = ("PodScheduled", "Ready", "Initialized", "ContainersReady",
                      "PodReadyToStartContainers")


@dataclass
class ContainerInfo:
    """One container instance in the runtime (upstream's kubecontainer.Status)."""

    id: str                 # "<runtime>://<id>"
    name: str
    state: str              # RUNNING / CREATED / EXITED / UNKNOWN
    created_at: int = 0     # nanoseconds since the epoch
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    image: str = ""
    image_ref: str = ""
    restart_count: int = 0
    hash: str = ""
    attempt: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    sandbox_id: str = ""
    log_path: str = ""

    @property
    def raw_id(self) -> str:
        return self.id.split("://", 1)[-1]


@dataclass
class SandboxInfo:
    id: str
    ready: bool
    created_at: int = 0
    attempt: int = 0
    ip: str = ""
    ips: list[str] = field(default_factory=list)
    host_network: bool = False


@dataclass
class RuntimePod:
    """Everything the runtime holds for one pod uid."""

    uid: str
    name: str = ""
    namespace: str = ""
    sandboxes: list[SandboxInfo] = field(default_factory=list)   # newest first
    containers: list[ContainerInfo] = field(default_factory=list)  # newest first

    def latest(self, name: str) -> ContainerInfo | None:
        for c in self.containers:
            if c.name == name:
                return c
        return None

    def instances(self, name: str) -> list[ContainerInfo]:
        return [c for c in self.containers if c.name == name]

    @property
    def sandbox(self) -> SandboxInfo | None:
        return self.sandboxes[0] if self.sandboxes else None

    def running(self) -> list[ContainerInfo]:
        return [c for c in self.containers if c.state == RUNNING]


def sort_newest_first(pod: RuntimePod) -> None:
    pod.sandboxes.sort(key=lambda s: (s.created_at, s.attempt), reverse=True)
    pod.containers.sort(key=lambda c: (c.created_at, c.restart_count), reverse=True)


# -- spec helpers --------------------------------------------------------------

def is_sidecar(container: Obj) -> bool:
    """A restartable init container (``restartPolicy: Always``)."""
    return container.get("restartPolicy") == "Always"


#: the pod spec's container lists, and how an object reference names a container of each
_CONTAINER_LISTS = (("containers", "spec.containers{%s}"), ("initContainers", "spec.initContainers{%s}"),
                    ("ephemeralContainers", "spec.ephemeralContainers{%s}"))


def container_field_path(pod: Obj, name: str) -> str:
    """The ``fieldPath`` of an event's involvedObject naming the container
    ``name`` of ``pod`` (upstream's GenerateContainerRef): ``spec.containers{name}``,
    ``spec.initContainers{name}`` or ``spec.ephemeralContainers{name}``; empty
    when the pod has no container of that name."""
    spec = pod.get("spec") or {}
    for key, fmt in _CONTAINER_LISTS:
        if any(c.get("name") == name for c in spec.get(key) or ()):
            return fmt % name
    return ""


def _rule_matches(rule: Obj, exit_code: int) -> bool:
    codes = rule.get("exitCodes") or {}
    values = codes.get("values") or []
    if codes.get("operator") == "In":
        return exit_code in values
    if codes.get("operator") == "NotIn":
        return exit_code not in values
    return False


def container_should_restart(container: Obj, spec: Obj, exit_code: int) -> bool:
    """upstream's podutil.ContainerShouldRestart (ContainerRestartRules on)."""
    policy = container.get("restartPolicy")
    if policy:
        for rule in container.get("restartPolicyRules") or []:
            if _rule_matches(rule, exit_code):
                if rule.get("action") == "Restart":
                    return True
                break
        if policy == "Always":
            return True
        if policy == "OnFailure":
            return exit_code != 0
        if policy == "Never":
            return False
    pod_policy = spec.get("restartPolicy") or "Always"
    if pod_policy == "OnFailure":
        return exit_code != 0
    if pod_policy == "Never":
        return False
    return True


def should_restart(container: Obj, pod: Obj, latest: ContainerInfo | None) -> bool:
    """upstream's kubecontainer.ShouldContainerBeRestarted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    if latest is None:
        return True
    if latest.state == RUNNING:
        return False
    if latest.state in (UNKNOWN, CREATED):
        return True
    return container_should_restart(container, pod.get("spec") or {}, latest.exit_code)


def has_any_regular_container_started(spec: Obj, statuses: list[Obj]) -> bool:
    names = {c.get("name") for c in spec.get("containers") or []}
    for s in statuses:
        if s.get("name") in names and ("running" in s["state"] or "terminated" in s["state"]
                                        or (s.get("lastState") or {}).get("terminated")):
            return True
    return False


# -- time ----------------------------------------------------------------------

# -- container statuses --------------------------------------------------------

def _state_of(c: ContainerInfo, old: Obj | None) -> Obj:
    if c.state == RUNNING:
        return {"running": {"startedAt": format_timestamp(c.started_at // 1_000_000_000)}}
    if c.state == EXITED:
        t: Obj = {"exitCode": c.exit_code}
        if c.reason:
            t["reason"] = c.reason
        if c.message:
            t["message"] = c.message
        t["startedAt"] = format_timestamp(c.started_at // 1_000_000_000) if c.started_at else None
        t["finishedAt"] = format_timestamp(c.finished_at // 1_000_000_000) if c.finished_at else None
        t["containerID"] = c.id
        return {"terminated": t}
    if c.state == UNKNOWN and old is not None and "running" in (old.get("state") or {}):
        return {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                               "message": "The container could not be located when the pod was terminated",
                               "startedAt": None, "finishedAt": None}}
    return {"waiting": {}}


def _convert(c: ContainerInfo, old: Obj | None) -> Obj:
    st: Obj = {"name": c.name, "state": _state_of(c, old), "lastState": {}, "ready": False,
               "restartCount": c.restart_count, "image": c.image, "imageID": c.image_ref,
               "containerID": c.id}
    if c.state == UNKNOWN and "terminated" in st["state"] and old is not None:
        st["restartCount"] = int(old.get("restartCount") or 0) + 1
    return st


def container_statuses(pod: Obj, rt: RuntimePod, containers: list[Obj], old_statuses: list[Obj],
                       waiting: dict[str, tuple[str, str]], *, init: bool) -> list[Obj]:
    """upstream's convertToAPIContainerStatuses for one list of containers."""
    spec = pod.get("spec") or {}
    has_init = bool(spec.get("initContainers"))
    default_reason = POD_INITIALIZING if has_init and not init else CONTAINER_CREATING
    old_by_name = {s.get("name"): s for s in old_statuses or [] if isinstance(s, dict)}
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    statuses: dict[str, Obj] = {}
    for c in containers:
        st: Obj = {"name": c["name"], "image": c.get("image", ""), "imageID": "",
                   "state": {"waiting": {"reason": default_reason}}, "lastState": {},
                   "ready": False, "restartCount": 0}
        old = old_by_name.get(c["name"])
        if old is not None:
            if "terminated" in (old.get("state") or {}):
                st = _copy(old)
            else:
                st["restartCount"] = int(old.get("restartCount") or 0)
                st["lastState"] = _copy(old.get("lastState") or {})
        statuses[c["name"]] = st

    # a container the runtime lost while it ran (e.g. removed out of band)
    present = {c.name for c in rt.containers}
    for c in containers:
        name = c["name"]
        if name in present:
            continue
        old = old_by_name.get(name)
        if not old or "running" not in (old.get("state") or {}):
            continue
        st = statuses[name]
        if (st["state"].get("waiting") or {}).get("reason") != default_reason:
            continue
        if (st.get("lastState") or {}).get("terminated"):
            continue
        st["lastState"] = {"terminated": {
            "exitCode": 137, "reason": "ContainerStatusUnknown",
            "message": "The container could not be located when the pod was deleted.  The container used to be Running",
            "startedAt": None, "finishedAt": None}}
        if not deleting:
            st["restartCount"] = int(st.get("restartCount") or 0) + 1

    seen: dict[str, int] = {}
    for ci in rt.containers:  # newest first
        if ci.name not in statuses or seen.get(ci.name, 0) >= 2:
            continue
        conv = _convert(ci, old_by_name.get(ci.name))
        if seen.get(ci.name, 0) == 0:
            statuses[ci.name] = conv
        else:
            statuses[ci.name]["lastState"] = conv["state"]
        seen[ci.name] = seen.get(ci.name, 0) + 1

    for c in containers:
        name = c["name"]
        latest = rt.latest(name)
        if init and latest is not None and latest.state == EXITED and latest.exit_code == 0:
            continue
        if not should_restart(c, pod, latest):
            continue
        reason = waiting.get(name)
        if reason is None:
            continue
        st = statuses[name]
        if "terminated" in st["state"]:
            st["lastState"] = st["state"]
        w: Obj = {"reason": reason[0]}
        if reason[1]:
            w["message"] = reason[1]
        st["state"] = {"waiting": w}

    for c in containers:
        st = statuses[c["name"]]
        mounts = _volume_mount_statuses(c)
        if mounts:
            st["volumeMounts"] = mounts
        if st.get("containerID"):
            # InPlacePodVerticalScaling (GA in 1.35): what the container was given
            res = c.get("resources") or {}
            st["resources"] = {k: dict(v) for k, v in res.items() if k in ("limits", "requests") and v}
            if res.get("requests"):
                st["allocatedResources"] = dict(res["requests"])
    if init:
        return [statuses[c["name"]] for c in containers]
    return [statuses[n] for n in sorted(statuses)]  # upstream sorts regular statuses by name


def _volume_mount_statuses(c: Obj) -> list[Obj]:
    """RecursiveReadOnlyMounts (beta since 1.33): each volumeMount with its read-only mode."""
    out = []
    for m in c.get("volumeMounts") or []:
        if not isinstance(m, dict):
            continue
        vm: Obj = {"name": m.get("name", ""), "mountPath": m.get("mountPath", "")}
        if m.get("readOnly"):
            vm["readOnly"] = True
            rro = m.get("recursiveReadOnly")
            vm["recursiveReadOnly"] = "Enabled" if rro == "Enabled" else "Disabled"
        out.append(vm)
    return out


def _copy(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _copy(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_copy(v) for v in o]
    return o


def apply_probe_results(spec: Obj, statuses: list[Obj], init_statuses: list[Obj],
                        ready: Callable[[str], bool | None], started: Callable[[str], bool | None]) -> None:
    """upstream's prober manager UpdatePodStatus: ``started`` and ``ready`` of each status.

    ``ready(container_id)`` / ``started(container_id)`` give a probe's result, or None
    when that container has no such probe (or no result yet: then False).
    """
    by_name = {c["name"]: c for c in spec.get("containers") or []}
    init_by_name = {c["name"]: c for c in spec.get("initContainers") or []}

    def one(st: Obj, c: Obj) -> None:
        running = "running" in st["state"]
        cid = st.get("containerID") or ""
        if not running:
            st["started"] = False
            st["ready"] = False
            return
        if c.get("startupProbe"):
            st["started"] = bool(started(cid))
        else:
            st["started"] = True
        if not st["started"]:
            st["ready"] = False
        elif c.get("readinessProbe"):
            st["ready"] = bool(ready(cid))
        else:
            st["ready"] = True

    for st in statuses:
        c = by_name.get(st["name"])
        if c is not None:
            one(st, c)
    for st in init_statuses:
        c = init_by_name.get(st["name"])
        if c is None:
            continue
        if is_sidecar(c):
            one(st, c)
        else:
            term = st["state"].get("terminated")
            st["ready"] = bool(term is not None and term.get("exitCode") == 0)
            st["started"] = "running" in st["state"]


# -- phase ---------------------------------------------------------------------

def pod_phase(pod: Obj, statuses: list[Obj], init_statuses: list[Obj], *, terminal: bool,
              initialized: bool) -> str:
    """upstream's getPhase (ContainerRestartRules enabled, as in 1.35+)."""
    spec = pod.get("spec") or {}
    by_name = {s["name"]: s for s in list(statuses) + list(init_statuses)}
    pending_regular_init = pending_sidecar = failed_init_not_restartable = 0
    for c in spec.get("initContainers") or []:
        if is_sidecar(c):
            continue
        s = by_name.get(c["name"])
        if s is None:
            pending_regular_init += 1
            continue
        state = s["state"]
        if "running" in state:
            pending_regular_init += 1
        elif "terminated" in state:
            code = state["terminated"].get("exitCode", 0)
            if code != 0 and not container_should_restart(c, spec, code):
                failed_init_not_restartable += 1
        elif "waiting" in state:
            last = (s.get("lastState") or {}).get("terminated")
            if last is not None:
                code = last.get("exitCode", 0)
                if code != 0 and not container_should_restart(c, spec, code):
                    failed_init_not_restartable += 1
            else:
                pending_regular_init += 1
        else:
            pending_regular_init += 1

    unknown = running = waiting = stopped = stopped_not_restartable = succeeded = 0
    for c in spec.get("initContainers") or []:
        if not is_sidecar(c):
            continue
        s = by_name.get(c["name"])
        if s is None:
            unknown += 1
            continue
        state = s["state"]
        if "running" in state:
            if not s.get("started"):
                pending_sidecar += 1
            running += 1
        elif "terminated" in state:
            pass
        elif "waiting" in state:
            if not (s.get("lastState") or {}).get("terminated"):
                pending_sidecar += 1
                waiting += 1
        else:
            pending_sidecar += 1
            unknown += 1

    for c in spec.get("containers") or []:
        s = by_name.get(c["name"])
        if s is None:
            unknown += 1
            continue
        state = s["state"]
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            code = state["terminated"].get("exitCode", 0)
            if not container_should_restart(c, spec, code):
                stopped_not_restartable += 1
            if code == 0:
                succeeded += 1
        elif "waiting" in state:
            last = (s.get("lastState") or {}).get("terminated")
            if last is not None:
                stopped += 1
                if not container_should_restart(c, spec, last.get("exitCode", 0)):
                    stopped_not_restartable += 1
            else:
                waiting += 1
        else:
            unknown += 1

    if failed_init_not_restartable > 0:
        return "Failed"
    if pending_regular_init > 0 or (pending_sidecar > 0 and not initialized) or waiting > 0:
        return "Pending"
    if running > 0 and unknown == 0:
        return "Running"
    if running == 0 and stopped > 0 and unknown == 0:
        if terminal:
            return "Succeeded" if stopped == succeeded else "Failed"
        if stopped != stopped_not_restartable:
            return "Running"
        return "Succeeded" if stopped == succeeded else "Failed"
    return "Pending"


# -- conditions ----------------------------------------------------------------

def _containers_condition(ctype: str, reason: str, unknown: list[str],
                          state: str, not_done: list[str]) -> Obj:
    """A condition that is True unless some containers have no status yet (``unknown``)
    or are not yet ``state`` (``not_done``); upstream's message lists both groups."""
    msgs = []
    if unknown:
        msgs.append(f"containers with unknown status: {go_list(unknown)}")
    if not_done:
        msgs.append(f"containers with {state} status: {go_list(not_done)}")
    if msgs:
        return {"type": ctype, "status": "False", "reason": reason, "message": ", ".join(msgs)}
    return {"type": ctype, "status": "True"}


def containers_ready_condition(pod: Obj, all_statuses: list[Obj], phase: str) -> Obj:
    spec = pod.get("spec") or {}
    by_name = {s["name"]: s for s in all_statuses}
    unknown, unready = [], []
    for c in [c for c in spec.get("initContainers") or [] if is_sidecar(c)] + list(spec.get("containers") or []):
        s = by_name.get(c["name"])
        if s is None:
            unknown.append(c["name"])
        elif not s.get("ready"):
            unready.append(c["name"])
    if (phase == "Succeeded" and not unknown) or phase == "Failed":
        return {"type": "ContainersReady", "status": "False",
                "reason": "PodFailed" if phase == "Failed" else "PodCompleted"}
    return _containers_condition("ContainersReady", "ContainersNotReady",
                                 unknown, "unready", unready)


def ready_condition(pod: Obj, conditions: list[Obj], all_statuses: list[Obj], phase: str) -> Obj:
    cr = containers_ready_condition(pod, all_statuses, phase)
    if cr["status"] != "True":
        out = dict(cr)
        out["type"] = "Ready"
        return out
    by_type = {c.get("type"): c for c in conditions}
    msgs = []
    for gate in (pod.get("spec") or {}).get("readinessGates") or []:
        t = gate.get("conditionType")
        c = by_type.get(t)
        if c is None:
            msgs.append(f'corresponding condition of pod readiness gate "{t}" does not exist.')
        elif c.get("status") != "True":
            msgs.append(f'the status of pod readiness gate "{t}" is not "True", but {c.get("status")}')
    if msgs:
        return {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady",
                "message": ", ".join(msgs)}
    return {"type": "Ready", "status": "True"}


def initialized_condition(pod: Obj, all_statuses: list[Obj], phase: str) -> Obj:
    spec = pod.get("spec") or {}
    by_name = {s["name"]: s for s in all_statuses}
    unknown, incomplete = [], []
    for c in spec.get("initContainers") or []:
        s = by_name.get(c["name"])
        if s is None:
            unknown.append(c["name"])
            continue
        done = bool(s.get("started")) if is_sidecar(c) else bool(s.get("ready"))
        if not done:
            incomplete.append(c["name"])
    if phase == "Succeeded" and not unknown:
        return {"type": "Initialized", "status": "True", "reason": "PodCompleted"}
    if has_any_regular_container_started(spec, all_statuses):
        return {"type": "Initialized", "status": "True"}
    return _containers_condition("Initialized", "ContainersNotInitialized",
                                 unknown, "incomplete", incomplete)


def sandbox_needs_replacing(rt: RuntimePod, pod: Obj) -> bool:
    """upstream's PodSandboxChanged, without its reasons."""
    if not rt.sandboxes:
        return True
    ready = [s for s in rt.sandboxes if s.ready]
    if len(ready) > 1:
        return True
    sb = rt.sandboxes[0]
    if not sb.ready:
        return True
    host_net = bool((pod.get("spec") or {}).get("hostNetwork"))
    if not host_net and not sb.ip:
        return True
    return False


def _with_transition_times(conditions: list[Obj], old: list[Obj], now: str) -> list[Obj]:
    """The status manager keeps lastTransitionTime while a condition's status stays."""
    old_by_type = {c.get("type"): c for c in old or [] if isinstance(c, dict)}
    out = []
    for c in conditions:
        prev = old_by_type.get(c.get("type"))
        c = dict(c)
        if "lastTransitionTime" not in c:
            if prev is not None and prev.get("status") == c.get("status") and prev.get("lastTransitionTime"):
                c["lastTransitionTime"] = prev["lastTransitionTime"]
            else:
                c["lastTransitionTime"] = now
        c.setdefault("lastProbeTime", None)
        out.append(c)
    return out


# -- the whole status ----------------------------------------------------------

def compute_pod_status(
    pod: Obj,
    rt: RuntimePod,
    *,
    waiting: dict[str, tuple[str, str]] | None = None,
    ready: Callable[[str], bool | None] = lambda cid: None,
    started: Callable[[str], bool | None] = lambda cid: None,
    host_ips: list[str] | None = None,
    terminal: bool = False,
    probe_update: Callable[[Obj, Obj], Any] | None = None,
    now: float,
) -> Obj:
    """upstream's generateAPIPodStatus plus the status manager's bookkeeping.

    ``pod`` carries the status last reported (``pod["status"]``); ``now`` is in seconds.
    ``terminal``: the pod is done (all containers stopped for good), as the pod worker
    decides once it terminated the pod. ``probe_update(pod, status)`` (a prober's
    UpdatePodStatus) sets ``started`` and ``ready`` of the container statuses in place,
    before the phase and conditions are derived from them; without it ``ready`` and
    ``started`` (probe results by container id, None for no probe) decide.
    """
    spec = pod.get("spec") or {}
    old = pod.get("status") or {}
    waiting = waiting or {}
    now_s = format_timestamp(now)

    init_statuses = container_statuses(pod, rt, list(spec.get("initContainers") or []),
                                       old.get("initContainerStatuses") or [], waiting, init=True)
    statuses = container_statuses(pod, rt, list(spec.get("containers") or []),
                                  old.get("containerStatuses") or [], waiting, init=False)
    status: Obj = {"phase": "Pending"}
    if spec.get("initContainers"):
        status["initContainerStatuses"] = init_statuses
    status["containerStatuses"] = statuses
    if probe_update is not None:
        probe_update(pod, status)
    else:
        apply_probe_results(spec, statuses, init_statuses, ready, started)

    active_regular_started = any(
        c.state in (RUNNING, EXITED) and c.name in {x["name"] for x in spec.get("containers") or []}
        for c in rt.containers)
    phase = pod_phase(pod, statuses, init_statuses, terminal=terminal, initialized=active_regular_started)
    old_phase = old.get("phase")
    if phase not in ("Failed", "Succeeded") and old_phase in ("Failed", "Succeeded"):
        phase = old_phase

    status["phase"] = phase
    if old_phase == phase:
        for k in ("reason", "message"):
            if old.get(k):
                status[k] = old[k]

    all_statuses = init_statuses + statuses
    conditions = [c for c in old.get("conditions") or []
                  if isinstance(c, dict) and c.get("type") not in KUBELET_CONDITIONS]
    conditions.append({"type": "PodReadyToStartContainers",
                       "status": "False" if sandbox_needs_replacing(rt, pod) else "True"})
    conditions.append(initialized_condition(pod, all_statuses, phase))
    ready_c = ready_condition(pod, conditions, all_statuses, phase)
    conditions.append(ready_c)
    conditions.append(containers_ready_condition(pod, all_statuses, phase))
    conditions.append({"type": "PodScheduled", "status": "True"})
    generation = int((pod.get("metadata") or {}).get("generation") or 0)
    if generation:
        # PodObservedGenerationTracking (GA in 1.35): the kubelet's conditions and the status
        # name the generation they were computed for
        for c in conditions:
            if c["type"] in KUBELET_CONDITIONS:
                c["observedGeneration"] = generation
        status["observedGeneration"] = generation
    status["conditions"] = _with_transition_times(conditions, old.get("conditions") or [], now_s)

    if host_ips:
        status["hostIP"] = host_ips[0]
        status["hostIPs"] = [{"ip": ip} for ip in host_ips]
    sb = rt.sandbox
    pod_ips: list[str] = []
    if spec.get("hostNetwork"):
        pod_ips = list(host_ips or [])
    elif sb is not None and sb.ip:
        pod_ips = [sb.ip] + [ip for ip in sb.ips if ip != sb.ip]
    elif old.get("podIP") and phase in ("Failed", "Succeeded"):
        pod_ips = [p.get("ip") for p in old.get("podIPs") or [] if p.get("ip")] or [old["podIP"]]
    if pod_ips:
        status["podIP"] = pod_ips[0]
        status["podIPs"] = [{"ip": ip} for ip in pod_ips]
    status["startTime"] = old.get("startTime") or now_s
    status["qosClass"] = old.get("qosClass") or pod_qos_class(spec)
    if old.get("nominatedNodeName"):
        status["nominatedNodeName"] = old["nominatedNodeName"]
    if old.get("resourceClaimStatuses"):
        status["resourceClaimStatuses"] = old["resourceClaimStatuses"]
    return status
