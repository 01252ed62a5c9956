"""Validation of the core group (v1): node selectors, pods, services, namespaces, nodes,
ConfigMaps, Secrets, Events, PersistentVolumes and PersistentVolumeClaims.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from kubeplane.api.errors import (
    Cause,
    duplicate,
    field_not_found,
    forbidden_field,
    invalid_value,
    not_supported,
    required,
    too_long,
)
from kubeplane.api.meta import same_json
from kubeplane.api.quantity import parse_quantity_with_format
from kubeplane.api.strings import (
    is_config_map_key,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
    is_valid_port_name,
    is_valid_port_num,
)
from kubeplane.api.validation.common import _canonical, _d, _immutable, _is_int, _l, _norm, _quantity, _s
from kubeplane.api.validation.meta import (
    validate_annotations,
    validate_finalizer_name,
    validate_label_selector,
    validate_labels,
)


MAX_SECRET_SIZE = 1024 * 1024


def _validate_node_selector_requirement(req: Any, path: str, allow_fields: bool = False) -> list[Cause]:
    req = _d(req)
    out: list[Cause] = []
    op = req.get("operator")
    values = _l(req.get("values"))
    if op in ("In", "NotIn"):
        if not values:
            out.append(required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist"):
        if values:
            out.append(forbidden_field(f"{path}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            out.append(required(f"{path}.values", "must be specified single value when `operator` is 'Lt' or 'Gt'"))
    else:
        out.append(invalid_value(f"{path}.operator", op if op is not None else "", "not a valid selector operator"))
    if not allow_fields:
        for msg in is_qualified_name(_s(req.get("key"))):
            out.append(invalid_value(f"{path}.key", _s(req.get("key")), msg))
    return out


def validate_node_selector(sel: Any, path: str) -> list[Cause]:
    """A core NodeSelector (``nodeSelectorTerms``), as in required node affinity and PV node affinity."""
    sel = _d(sel)
    terms = _l(sel.get("nodeSelectorTerms"))
    out: list[Cause] = []
    if not terms:
        out.append(required(f"{path}.nodeSelectorTerms", "must have at least one node selector term"))
    for i, term in enumerate(terms):
        term = _d(term)
        for j, req in enumerate(_l(term.get("matchExpressions"))):
            out += _validate_node_selector_requirement(req, f"{path}.nodeSelectorTerms[{i}].matchExpressions[{j}]")
        for j, req in enumerate(_l(term.get("matchFields"))):
            p = f"{path}.nodeSelectorTerms[{i}].matchFields[{j}]"
            out += _validate_node_selector_requirement(req, p, allow_fields=True)
            req = _d(req)
            if req.get("key") != "metadata.name":
                out.append(invalid_value(f"{p}.key", _s(req.get("key")), "not a valid field selector key"))
    return out


RESTART_POLICIES = ("Always", "OnFailure", "Never")
PROTOCOLS = ("SCTP", "TCP", "UDP")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
VOLUME_SOURCES = (
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret", "nfs",
    "iscsi", "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder", "cephfs", "flocker",
    "downwardAPI", "fc", "azureFile", "configMap", "vsphereVolume", "quobyte", "azureDisk",
    "photonPersistentDisk", "projected", "portworxVolume", "scaleIO", "storageos", "csi", "ephemeral",
    "image",
)
POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)


def _overcommit_allowed(name: str) -> bool:
    """Native resources other than hugepages may have requests below limits."""
    native = "/" not in name or "kubernetes.io/" in name
    return native and not name.startswith("hugepages-")


def _validate_resource_requirements(res: Any, path: str, pod_claims: set[str]) -> list[Cause]:
    res = _d(res)
    out: list[Cause] = []
    lim_path, req_path = f"{path}.limits", f"{path}.requests"
    limits: dict[str, Any] = {}
    for name, value in _d(res.get("limits")).items():
        p = f"{lim_path}[{name}]"
        out += _validate_container_resource_name(name, p)
        q, errs = _quantity(value, p)
        out += errs
        if q is not None:
            if q < 0:
                out.append(invalid_value(p, _canonical(value), "must be greater than or equal to 0"))
            limits[name] = (q, value)
    for name, value in _d(res.get("requests")).items():
        p = f"{req_path}[{name}]"
        out += _validate_container_resource_name(name, p)
        q, errs = _quantity(value, p)
        out += errs
        if q is None:
            continue
        if q < 0:
            out.append(invalid_value(p, _canonical(value), "must be greater than or equal to 0"))
        if name in limits:
            lq, lraw = limits[name]
            if not _overcommit_allowed(name) and q != lq:
                out.append(invalid_value(req_path, _canonical(value),
                                    f"must be equal to {name} limit of {_canonical(lraw)}"))
            elif q > lq:
                out.append(invalid_value(req_path, _canonical(value),
                                    f"must be less than or equal to {name} limit of {_canonical(lraw)}"))
        elif not _overcommit_allowed(name):
            out.append(required(lim_path, "Limit must be set for non overcommitable resources"))
    seen: set[str] = set()
    for i, claim in enumerate(_l(res.get("claims"))):
        claim = _d(claim)
        p = f"{path}.claims[{i}]"
        cname = _s(claim.get("name"))
        if not cname:
            out.append(required(f"{p}.name"))
            continue
        key = cname + "/" + _s(claim.get("request"))
        if key in seen:
            out.append(duplicate(f"{p}.name", cname))
        seen.add(key)
        if cname not in pod_claims:
            out.append(field_not_found(p, cname))
    return out


def _validate_container_resource_name(name: str, path: str) -> list[Cause]:
    out = [invalid_value(path, name, m) for m in is_qualified_name(name)]
    if out:
        return out
    if "/" not in name and name not in STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-"):
        out.append(invalid_value(path, name, "must be a standard resource for containers"))
    return out


def _validate_container_ports(ports: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    names: set[str] = set()
    for i, port in enumerate(_l(ports)):
        port = _d(port)
        p = f"{path}[{i}]"
        name = _s(port.get("name"))
        if name:
            msgs = is_valid_port_name(name)
            if msgs:
                out += [invalid_value(f"{p}.name", name, m) for m in msgs]
            elif name in names:
                out.append(duplicate(f"{p}.name", name))
            else:
                names.add(name)
        cp = port.get("containerPort")
        if not cp:
            out.append(required(f"{p}.containerPort"))
        else:
            out += [invalid_value(f"{p}.containerPort", cp, m) for m in is_valid_port_num(cp)]
        hp = port.get("hostPort")
        if hp:
            out += [invalid_value(f"{p}.hostPort", hp, m) for m in is_valid_port_num(hp)]
        if "protocol" in port:
            proto = port.get("protocol")
            if not proto:
                out.append(required(f"{p}.protocol"))
            elif proto not in PROTOCOLS:
                out.append(not_supported(f"{p}.protocol", proto, PROTOCOLS))
    return out


def _validate_container(
    ctr: Any, path: str, names: set[str], volumes: set[str], pod_claims: set[str]
) -> list[Cause]:
    ctr = _d(ctr)
    out: list[Cause] = []
    out += validate_unique_label_name(_s(ctr.get("name")), f"{path}.name", names)
    image = _s(ctr.get("image"))
    if not image:
        out.append(required(f"{path}.image"))
    elif image != image.strip():
        out.append(invalid_value(f"{path}.image", image, "must not have leading or trailing whitespace"))
    if "imagePullPolicy" in ctr:
        pp = ctr.get("imagePullPolicy")
        if not pp:
            out.append(required(f"{path}.imagePullPolicy"))
        elif pp not in PULL_POLICIES:
            out.append(not_supported(f"{path}.imagePullPolicy", pp, PULL_POLICIES))
    out += _validate_container_ports(ctr.get("ports"), f"{path}.ports")
    for i, env in enumerate(_l(ctr.get("env"))):
        env_name = _s(_d(env).get("name"))
        if not env_name:
            out.append(required(f"{path}.env[{i}].name"))
        elif "=" in env_name:
            out.append(invalid_value(
                f"{path}.env[{i}].name", env_name,
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            ))
    mount_paths: set[str] = set()
    for i, mnt in enumerate(_l(ctr.get("volumeMounts"))):
        mnt = _d(mnt)
        p = f"{path}.volumeMounts[{i}]"
        mname = _s(mnt.get("name"))
        if not mname:
            out.append(required(f"{p}.name"))
        if mname not in volumes:
            out.append(field_not_found(f"{p}.name", mname))
        mpath = _s(mnt.get("mountPath"))
        if not mpath:
            out.append(required(f"{p}.mountPath"))
        elif mpath in mount_paths:
            out.append(invalid_value(f"{p}.mountPath", mpath, "must be unique"))
        mount_paths.add(mpath)
    out += _validate_resource_requirements(ctr.get("resources"), f"{path}.resources", pod_claims)
    return out


def _validate_volumes(vols: Any, path: str) -> tuple[list[Cause], set[str]]:
    out: list[Cause] = []
    names: set[str] = set()
    for i, vol in enumerate(_l(vols)):
        vol = _d(vol)
        p = f"{path}[{i}]"
        sources = [k for k in vol if k != "name" and vol[k] is not None]
        if not sources:
            out.append(required(p, "must specify a volume type"))
        elif len(sources) > 1:
            out.append(forbidden_field(f"{p}.{sources[1]}", "may not specify more than 1 volume type"))
        else:
            out += _validate_volume_source(sources[0], _d(vol[sources[0]]), f"{p}.{sources[0]}")
        name = _s(vol.get("name"))
        if not name:
            out.append(required(f"{p}.name"))
        else:
            out += [invalid_value(f"{p}.name", name, m) for m in is_dns1123_label(name)]
        if name in names:
            out.append(duplicate(f"{p}.name", name))
        names.add(name)
    return out, names


_VOLUME_REQUIRED_FIELDS = {
    "persistentVolumeClaim": ("claimName",),
    "hostPath": ("path",),
    "secret": (),
    "nfs": ("server", "path"),
    "csi": ("driver",),
    "local": ("path",),
}


def _validate_volume_source(kind: str, src: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    for key in _VOLUME_REQUIRED_FIELDS.get(kind, ()):
        if not src.get(key):
            out.append(required(f"{path}.{key}"))
    if kind == "ephemeral" and not src.get("volumeClaimTemplate"):
        out.append(required(f"{path}.volumeClaimTemplate"))
    return out


def _validate_tolerations(tols: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for i, tol in enumerate(_l(tols)):
        tol = _d(tol)
        p = f"{path}[{i}]"
        key = _s(tol.get("key"))
        op = tol.get("operator") or ""
        value = _s(tol.get("value"))
        effect = tol.get("effect") or ""
        if key:
            out += [invalid_value(f"{p}.key", key, m) for m in is_qualified_name(key)]
        if not key and op != "Exists":
            out.append(invalid_value(
                f"{p}.operator", op,
                'operator must be Exists when `key` is empty, which means "match all values and all keys"',
            ))
        if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
            out.append(invalid_value(f"{p}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if op in ("Equal", ""):
            msgs = is_valid_label_value(value)
            if msgs:
                out.append(invalid_value(f"{p}.operator", value, ";".join(msgs)))
        elif op == "Exists":
            if value:
                out.append(invalid_value(f"{p}.operator", tol, "value must be empty when `operator` is 'Exists'"))
        else:
            out.append(not_supported(f"{p}.operator", op, ("Equal", "Exists")))
        if effect and effect not in TAINT_EFFECTS:
            out.append(not_supported(f"{p}.effect", effect, TAINT_EFFECTS))
    return out


def _validate_affinity(aff: Any, path: str) -> list[Cause]:
    aff = _d(aff)
    out: list[Cause] = []
    na = _d(aff.get("nodeAffinity"))
    if na.get("requiredDuringSchedulingIgnoredDuringExecution") is not None:
        out += validate_node_selector(
            na["requiredDuringSchedulingIgnoredDuringExecution"],
            f"{path}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        )
    for i, term in enumerate(_l(na.get("preferredDuringSchedulingIgnoredDuringExecution"))):
        term = _d(term)
        p = f"{path}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        w = term.get("weight")
        if not _is_int(w) or not 1 <= w <= 100:
            out.append(invalid_value(f"{p}.weight", w, "must be in the range 1-100"))
        for j, req in enumerate(_l(_d(term.get("preference")).get("matchExpressions"))):
            out += _validate_node_selector_requirement(req, f"{p}.preference.matchExpressions[{j}]")
    for kind in ("podAffinity", "podAntiAffinity"):
        pa = _d(aff.get(kind))
        for i, term in enumerate(_l(pa.get("requiredDuringSchedulingIgnoredDuringExecution"))):
            out += _validate_pod_affinity_term(term, f"{path}.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{i}]")
        for i, wt in enumerate(_l(pa.get("preferredDuringSchedulingIgnoredDuringExecution"))):
            wt = _d(wt)
            p = f"{path}.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            w = wt.get("weight")
            if not _is_int(w) or not 1 <= w <= 100:
                out.append(invalid_value(f"{p}.weight", w, "must be in the range 1-100"))
            out += _validate_pod_affinity_term(wt.get("podAffinityTerm"), f"{p}.podAffinityTerm")
    return out


def _validate_pod_affinity_term(term: Any, path: str) -> list[Cause]:
    term = _d(term)
    out = validate_label_selector(term.get("labelSelector"), f"{path}.labelSelector")
    out += validate_label_selector(term.get("namespaceSelector"), f"{path}.namespaceSelector")
    for i, ns in enumerate(_l(term.get("namespaces"))):
        out += [invalid_value(f"{path}.namespaces[{i}]", ns, m) for m in is_dns1123_label(_s(ns))]
    tk = _s(term.get("topologyKey"))
    if not tk:
        out.append(required(f"{path}.topologyKey", "can not be empty"))
    else:
        out += [invalid_value(f"{path}.topologyKey", tk, m) for m in is_qualified_name(tk)]
    return out


def _validate_topology_spread(constraints: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    seen: set[tuple[str, str]] = set()
    for i, c in enumerate(_l(constraints)):
        c = _d(c)
        p = f"{path}[{i}]"
        skew = c.get("maxSkew")
        if not _is_int(skew) or skew <= 0:
            out.append(invalid_value(f"{p}.maxSkew", skew, "must be greater than zero"))
        tk = _s(c.get("topologyKey"))
        if not tk:
            out.append(required(f"{p}.topologyKey", "can not be empty"))
        else:
            out += [invalid_value(f"{p}.topologyKey", tk, m) for m in is_qualified_name(tk)]
        wu = c.get("whenUnsatisfiable")
        if wu not in ("DoNotSchedule", "ScheduleAnyway"):
            out.append(not_supported(f"{p}.whenUnsatisfiable", wu or "", ("DoNotSchedule", "ScheduleAnyway")))
        if (tk, _s(wu)) in seen:
            out.append(duplicate(p, f"{{{tk}, {_s(wu)}}}"))
        seen.add((tk, _s(wu)))
        md = c.get("minDomains")
        if md is not None and (not _is_int(md) or md <= 0):
            out.append(invalid_value(f"{p}.minDomains", md, "must be greater than zero"))
        out += validate_label_selector(c.get("labelSelector"), f"{p}.labelSelector")
    return out


def validate_unique_label_name(name: str, path: str, seen: set[str]) -> list[Cause]:
    """A required, DNS-label ``name`` unique among ``seen`` (which it joins):
    the check list entries such as claims, requests and devices share."""
    if not name:
        return [required(path)]
    out = [invalid_value(path, name, m) for m in is_dns1123_label(name)]
    if name in seen:
        out.append(duplicate(path, name))
    seen.add(name)
    return out


#: the causes of a pod spec but its volumes, by (path, JSON of the spec without volumes, volume
#: names): pods created from one template share them even when each mounts its own claim
_pod_spec_memo: dict[tuple[str, bytes, frozenset[str]], tuple[Cause, ...]] = {}


_POD_SPEC_MEMO_SIZE = 1024
_POD_SPEC_MEMO_MAX_BYTES = 65536


def validate_pod_spec(spec: Any, path: str = "spec") -> list[Cause]:
    """Upstream ``ValidatePodSpec`` (the commonly used parts); a pure function of
    ``spec``. The volumes are validated every time; the rest depends on them only
    through their names, and its causes are memoized by its JSON text."""
    if not isinstance(spec, dict):
        return _validate_pod_spec(spec, path)
    out, volumes = _validate_volumes(spec.get("volumes"), f"{path}.volumes")
    rest = {k: v for k, v in spec.items() if k != "volumes"}
    try:
        text = orjson.dumps(rest)
    except TypeError:
        return out + _validate_pod_spec_rest(spec, path, volumes)
    if len(text) > _POD_SPEC_MEMO_MAX_BYTES:
        return out + _validate_pod_spec_rest(spec, path, volumes)
    key = (path, text, frozenset(volumes))
    hit = _pod_spec_memo.get(key)
    if hit is None:
        hit = tuple(_validate_pod_spec_rest(spec, path, volumes))
        if len(_pod_spec_memo) >= _POD_SPEC_MEMO_SIZE:
            del _pod_spec_memo[next(iter(_pod_spec_memo))]
        _pod_spec_memo[key] = hit
    return out + list(hit)


def _validate_pod_spec(spec: Any, path: str) -> list[Cause]:
    spec = _d(spec)
    out, volumes = _validate_volumes(spec.get("volumes"), f"{path}.volumes")
    return out + _validate_pod_spec_rest(spec, path, volumes)


def _validate_pod_spec_rest(spec: Any, path: str, volumes: set[str]) -> list[Cause]:
    """Everything but the volumes, which it sees through their names."""
    spec = _d(spec)
    out: list[Cause] = []
    pod_claims: set[str] = set()
    for i, rc in enumerate(_l(spec.get("resourceClaims"))):
        rc = _d(rc)
        p = f"{path}.resourceClaims[{i}]"
        name = _s(rc.get("name"))
        out += validate_unique_label_name(name, f"{p}.name", pod_claims)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if rc.get(k)]
        if not sources:
            out.append(required(p, "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"))
        elif len(sources) > 1:
            out.append(invalid_value(p, rc, "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified"))

    containers = _l(spec.get("containers"))
    names: set[str] = set()
    if not containers:
        out.append(required(f"{path}.containers"))
    for i, ctr in enumerate(containers):
        out += _validate_container(ctr, f"{path}.containers[{i}]", names, volumes, pod_claims)
    for i, ctr in enumerate(_l(spec.get("initContainers"))):
        out += _validate_container(ctr, f"{path}.initContainers[{i}]", names, volumes, pod_claims)

    if "restartPolicy" in spec:
        rp = spec.get("restartPolicy")
        if not rp:
            out.append(required(f"{path}.restartPolicy"))
        elif rp not in RESTART_POLICIES:
            out.append(not_supported(f"{path}.restartPolicy", rp, RESTART_POLICIES))
    if "dnsPolicy" in spec and spec.get("dnsPolicy"):
        if spec["dnsPolicy"] not in DNS_POLICIES:
            out.append(not_supported(f"{path}.dnsPolicy", spec["dnsPolicy"], DNS_POLICIES))
    out += validate_labels(spec.get("nodeSelector"), f"{path}.nodeSelector")
    for key, fn in (("serviceAccountName", is_dns1123_subdomain), ("nodeName", is_dns1123_subdomain),
                    ("priorityClassName", is_dns1123_subdomain), ("hostname", is_dns1123_label),
                    ("subdomain", is_dns1123_label)):
        v = spec.get(key)
        if v:
            out += [invalid_value(f"{path}.{key}", v, m) for m in fn(_s(v))]
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and (not _is_int(ads) or not 1 <= ads <= 2147483647):
        out.append(invalid_value(f"{path}.activeDeadlineSeconds", ads, "must be between 1 and 2147483647, inclusive"))
    out += _validate_tolerations(spec.get("tolerations"), f"{path}.tolerations")
    out += _validate_affinity(spec.get("affinity"), f"{path}.affinity")
    out += _validate_topology_spread(spec.get("topologySpreadConstraints"), f"{path}.topologySpreadConstraints")
    gates: set[str] = set()
    for i, gate in enumerate(_l(spec.get("schedulingGates"))):
        gname = _s(_d(gate).get("name"))
        p = f"{path}.schedulingGates[{i}].name"
        out += [invalid_value(p, gname, m) for m in is_qualified_name(gname)]
        if gname in gates:
            out.append(duplicate(p, gname))
        gates.add(gname)
    if "priority" in spec and spec["priority"] is not None and not _is_int(spec["priority"]):
        out.append(invalid_value(f"{path}.priority", spec["priority"], "must be an integer"))
    return out


def validate_pod_template(template: Any, path: str) -> list[Cause]:
    """A PodTemplateSpec: template labels/annotations and the pod spec under ``path.spec``."""
    template = _d(template)
    meta = _d(template.get("metadata"))
    out = validate_labels(meta.get("labels"), f"{path}.metadata.labels")
    out += validate_annotations(meta.get("annotations"), f"{path}.metadata.annotations")
    out += validate_pod_spec(template.get("spec"), f"{path}.spec")
    return out


def _rc_selector_empty(selector: Any) -> bool:
    """upstream's ``labels.Set(selector).AsSelector().Empty()``: a map that
    is not a valid label set gives the empty selector too."""
    if not isinstance(selector, dict) or not selector:
        return True
    return bool(validate_labels(selector, "selector"))


def _validate_replication_controller(obj: dict[str, Any]) -> list[Cause]:
    """core/v1 ReplicationController (upstream's ValidateReplicationControllerSpec)."""
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    mrs = spec.get("minReadySeconds")
    if mrs is not None and (not _is_int(mrs) or mrs < 0):
        out.append(invalid_value("spec.minReadySeconds", mrs, "must be greater than or equal to 0"))
    selector = spec.get("selector")
    empty = _rc_selector_empty(selector)
    if empty:
        out.append(required("spec.selector"))
    replicas = spec.get("replicas")
    if replicas is None:
        out.append(required("spec.replicas"))
    elif not _is_int(replicas) or replicas < 0:
        out.append(invalid_value("spec.replicas", replicas, "must be greater than or equal to 0"))
    out += _validate_rc_status(_d(obj.get("status")))
    template = spec.get("template")
    if template is None:
        out.append(required("spec.template"))
        return out
    labels = _d(_d(_d(template).get("metadata")).get("labels"))
    if not empty and any(labels.get(k) != v for k, v in selector.items()):
        out.append(invalid_value("spec.template.metadata.labels", labels, "`selector` does not match template `labels`"))
    out += validate_pod_template(template, "spec.template")
    tspec = _d(_d(template).get("spec"))
    if "restartPolicy" in tspec and tspec["restartPolicy"] != "Always":
        out.append(not_supported("spec.template.spec.restartPolicy", tspec["restartPolicy"], ("Always",)))
    if tspec.get("activeDeadlineSeconds") is not None:
        out.append(forbidden_field("spec.template.spec.activeDeadlineSeconds",
                                   "activeDeadlineSeconds in ReplicationController is not Supported"))
    return out


def _validate_rc_status(status: dict[str, Any]) -> list[Cause]:
    """upstream's ValidateReplicationControllerStatus (what a status write may say)."""
    out: list[Cause] = []
    counts: dict[str, int] = {}
    for key in ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas", "observedGeneration"):
        v = status.get(key)
        if v is None:
            counts[key] = 0
        elif not _is_int(v) or v < 0:
            out.append(invalid_value(f"status.{key}", v, "must be greater than or equal to 0"))
        else:
            counts[key] = v
    if len(counts) < 5:
        return out
    for key in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
        if counts[key] > counts["replicas"]:
            out.append(invalid_value(f"status.{key}", counts[key], "cannot be greater than status.replicas"))
    if counts["availableReplicas"] > counts["readyReplicas"]:
        out.append(invalid_value("status.availableReplicas", counts["availableReplicas"],
                                 "cannot be greater than readyReplicas"))
    return out


def _validate_pod_template_object(obj: dict[str, Any]) -> list[Cause]:
    """core/v1 PodTemplate: its ``template`` (on create and on every update)."""
    template = obj.get("template")
    if template is None:
        template = {}
    out = validate_pod_template(template, "template")
    if _d(_d(template).get("spec")).get("ephemeralContainers"):
        out.append(forbidden_field("template.spec.ephemeralContainers",
                                   "ephemeral containers not allowed in pod template"))
    return out


def _validate_pod(obj: dict[str, Any]) -> list[Cause]:
    return validate_pod_spec(obj.get("spec"), "spec")


def _toleration_key(t: Any) -> Any:
    t = dict(_d(t))
    t.pop("tolerationSeconds", None)
    return _norm(t)


def _validate_pod_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    nspec, ospec = _d(new.get("spec")), _d(old.get("spec"))
    out: list[Cause] = []
    if same_json(nspec, ospec):
        # An unchanged spec (status and metadata updates): only the range check can fail.
        nads = nspec.get("activeDeadlineSeconds")
        if nads is not None and (not _is_int(nads) or not 0 <= nads <= 2147483647):
            return [invalid_value("spec.activeDeadlineSeconds", nads, "must be between 0 and 2147483647, inclusive")]
        return out
    munged = orjson.loads(orjson.dumps(nspec))
    for key in ("containers", "initContainers"):
        ncs, ocs = _l(munged.get(key)), _l(ospec.get(key))
        if len(ncs) != len(ocs):
            return [forbidden_field(f"spec.{key}", "pod updates may not add or remove containers")]
        for nc, oc in zip(ncs, ocs):
            if isinstance(nc, dict) and isinstance(oc, dict):
                nc["image"] = oc.get("image")
                if nc["image"] is None:
                    del nc["image"]
    nads, oads = nspec.get("activeDeadlineSeconds"), ospec.get("activeDeadlineSeconds")
    if nads is not None:
        if not _is_int(nads) or not 0 <= nads <= 2147483647:
            return out + [invalid_value("spec.activeDeadlineSeconds", nads, "must be between 0 and 2147483647, inclusive")]
        if _is_int(oads) and oads < nads:
            return out + [invalid_value("spec.activeDeadlineSeconds", nads, "must be less than or equal to previous value")]
    elif oads is not None:
        out.append(invalid_value("spec.activeDeadlineSeconds", None, "must not update from a positive integer to nil value"))
    munged.pop("activeDeadlineSeconds", None)
    if oads is not None:
        munged["activeDeadlineSeconds"] = oads
    new_tols = [_toleration_key(t) for t in _l(nspec.get("tolerations"))]
    for t in _l(ospec.get("tolerations")):
        if _toleration_key(t) not in new_tols:
            return out + [forbidden_field("spec.tolerations", "existing toleration can not be modified except its tolerationSeconds")]
    munged["tolerations"] = ospec.get("tolerations")
    old_gates = {_s(_d(g).get("name")) for g in _l(ospec.get("schedulingGates"))}
    for g in _l(nspec.get("schedulingGates")):
        gname = _s(_d(g).get("name"))
        if gname not in old_gates:
            out.append(forbidden_field("spec.schedulingGates",
                                  f"only deletion is allowed, but found new scheduling gate '{gname}'"))
    munged["schedulingGates"] = ospec.get("schedulingGates")
    otg, ntg = ospec.get("terminationGracePeriodSeconds"), nspec.get("terminationGracePeriodSeconds")
    if _is_int(otg) and otg < 0 and ntg == 1:
        munged["terminationGracePeriodSeconds"] = otg
    if _norm(munged) != _norm(ospec):
        out.append(forbidden_field("spec", POD_UPDATE_FORBIDDEN))
    return out


SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")


def _validate_service(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    stype = spec.get("type") or "ClusterIP"
    if stype not in SERVICE_TYPES:
        out.append(not_supported("spec.type", stype, SERVICE_TYPES))
    headless = spec.get("clusterIP") == "None"
    ports = _l(spec.get("ports"))
    if not ports and not headless and stype != "ExternalName":
        out.append(required("spec.ports"))
    if stype == "ExternalName":
        ext = _s(spec.get("externalName"))
        if not ext:
            out.append(required("spec.externalName"))
        else:
            out += [invalid_value("spec.externalName", ext, m) for m in is_dns1123_subdomain(ext.rstrip("."))]
    names: set[str] = set()
    seen: set[tuple[Any, Any]] = set()
    for i, port in enumerate(ports):
        port = _d(port)
        p = f"spec.ports[{i}]"
        name = _s(port.get("name"))
        if len(ports) > 1 and not name:
            out.append(required(f"{p}.name"))
        elif name:
            out += [invalid_value(f"{p}.name", name, m) for m in is_dns1123_label(name)]
            if name in names:
                out.append(duplicate(f"{p}.name", name))
            names.add(name)
        out += [invalid_value(f"{p}.port", port.get("port"), m) for m in is_valid_port_num(port.get("port"))]
        proto = port.get("protocol", "TCP")
        if not proto:
            out.append(required(f"{p}.protocol"))
        elif proto not in PROTOCOLS:
            out.append(not_supported(f"{p}.protocol", proto, PROTOCOLS))
        tp = port.get("targetPort")
        if isinstance(tp, str):
            out += [invalid_value(f"{p}.targetPort", tp, m) for m in is_valid_port_name(tp)]
        elif tp is not None and tp != 0:
            out += [invalid_value(f"{p}.targetPort", tp, m) for m in is_valid_port_num(tp)]
        if port.get("nodePort") and stype == "ClusterIP":
            out.append(forbidden_field(f"{p}.nodePort", "may not be used when `type` is 'ClusterIP'"))
        key = (port.get("port"), proto)
        if key in seen:
            out.append(duplicate(p, {"port": port.get("port"), "protocol": proto}))
        seen.add(key)
    out += validate_labels(spec.get("selector"), "spec.selector")
    sa = spec.get("sessionAffinity")
    if sa and sa not in ("ClientIP", "None"):
        out.append(not_supported("spec.sessionAffinity", sa, ("ClientIP", "None")))
    return out


def _validate_service_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    nip, oip = ns.get("clusterIP"), os_.get("clusterIP")
    if oip and nip and nip != oip and (ns.get("type") or "ClusterIP") != "ExternalName":
        return [invalid_value("spec.clusterIPs[0]", nip, "may not change once set")]
    return []


def _validate_namespace(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    for i, f in enumerate(_l(_d(obj.get("spec")).get("finalizers"))):
        out += validate_finalizer_name(_s(f), f"spec.finalizers[{i}]")
    return out


def _validate_node(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(_l(spec.get("taints"))):
        taint = _d(taint)
        p = f"spec.taints[{i}]"
        key = _s(taint.get("key"))
        out += [invalid_value(f"{p}.key", key, m) for m in is_qualified_name(key)]
        value = _s(taint.get("value"))
        msgs = is_valid_label_value(value)
        if msgs:
            out.append(invalid_value(f"{p}.value", value, ";".join(msgs)))
        effect = _s(taint.get("effect"))
        if not effect:
            out.append(required(f"{p}.effect"))
        elif effect not in TAINT_EFFECTS:
            out.append(not_supported(f"{p}.effect", effect, TAINT_EFFECTS))
        if (key, effect) in seen:
            out.append(duplicate(p, taint, "taints must be unique by key and effect pair"))
            continue
        seen.add((key, effect))
    return out


def _validate_config_map(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    data, binary = _d(obj.get("data")), _d(obj.get("binaryData"))
    total = 0
    for key, value in data.items():
        out += [invalid_value(f"data[{key}]", key, m) for m in is_config_map_key(key)]
        total += len(_s(value).encode())
    for key, value in binary.items():
        out += [invalid_value(f"binaryData[{key}]", key, m) for m in is_config_map_key(key)]
        if key in data:
            out.append(invalid_value(f"binaryData[{key}]", key, "duplicate of key present in data"))
        total += _decoded_len(value)
    if total > MAX_SECRET_SIZE:
        out.append(too_long("", None, MAX_SECRET_SIZE))
    return out


def _decoded_len(value: Any) -> int:
    s = _s(value)
    try:
        return len(base64.b64decode(s, validate=True))
    except (ValueError, TypeError):
        return len(s)


def _immutable_data_update(new: dict[str, Any], old: dict[str, Any], keys: tuple[str, ...]) -> list[Cause]:
    out: list[Cause] = []
    if old.get("immutable") is True:
        if new.get("immutable") is not True:
            out.append(forbidden_field("immutable", "field is immutable when `immutable` is set"))
        for key in keys:
            if _norm(new.get(key)) != _norm(old.get(key)):
                out.append(forbidden_field(key, "field is immutable when `immutable` is set"))
    return out


def _validate_config_map_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable_data_update(new, old, ("data", "binaryData"))


_SECRET_REQUIRED_KEYS = {
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
}


def _validate_secret(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    data = dict(_d(obj.get("data")))
    for k, v in _d(obj.get("stringData")).items():
        data[k] = base64.b64encode(_s(v).encode()).decode()
    total = 0
    for key, value in data.items():
        out += [invalid_value(f"data[{key}]", key, m) for m in is_config_map_key(key)]
        total += _decoded_len(value)
    if total > MAX_SECRET_SIZE:
        out.append(too_long("data", None, MAX_SECRET_SIZE))
    stype = _s(obj.get("type"))
    for key in _SECRET_REQUIRED_KEYS.get(stype, ()):
        if key not in data:
            out.append(required(f"data[{key}]"))
    if stype == "kubernetes.io/basic-auth" and "username" not in data and "password" not in data:
        out.append(required("data[username]"))
        out.append(required("data[password]"))
    if stype == "kubernetes.io/service-account-token":
        ann = _d(_d(obj.get("metadata")).get("annotations"))
        if not ann.get("kubernetes.io/service-account.name"):
            out.append(required("metadata.annotations[kubernetes.io/service-account.name]"))
    return out


def _validate_secret_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out = _immutable(new.get("type") or "Opaque", old.get("type") or "Opaque", "type")
    return out + _immutable_data_update(new, old, ("data",))


def _validate_event(obj: dict[str, Any]) -> list[Cause]:
    ns = _s(_d(obj.get("metadata")).get("namespace"))
    involved = _d(obj.get("involvedObject"))
    ins = _s(involved.get("namespace"))
    if not ins:
        if ns not in ("", "default"):
            return [invalid_value("involvedObject.namespace", ins, "does not match event.namespace")]
    elif ns != ins:
        return [invalid_value("involvedObject.namespace", ins, "does not match event.namespace")]
    return []


ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
PV_RECLAIM_POLICIES = ("Delete", "Recycle", "Retain")
PV_SOURCES = (
    "gcePersistentDisk", "awsElasticBlockStore", "hostPath", "glusterfs", "nfs", "rbd", "iscsi", "cinder",
    "cephfs", "fc", "flocker", "flexVolume", "azureFile", "vsphereVolume", "quobyte", "azureDisk",
    "photonPersistentDisk", "portworxVolume", "scaleIO", "local", "storageos", "csi",
)
PVC_UPDATE_FORBIDDEN = (
    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
)


def _validate_access_modes(modes: Any, path: str, detail: str) -> list[Cause]:
    modes = _l(modes)
    out: list[Cause] = []
    if not modes:
        out.append(required(path, detail))
    for m in modes:
        if m not in ACCESS_MODES:
            out.append(not_supported(path, m, ACCESS_MODES))
    if "ReadWriteOncePod" in modes and len(modes) > 1:
        out.append(forbidden_field(path, "may not use ReadWriteOncePod with other access modes"))
    return out


def validate_pvc_spec(spec: Any, path: str = "spec") -> list[Cause]:
    spec = _d(spec)
    out = _validate_access_modes(spec.get("accessModes"), f"{path}.accessModes", "at least 1 access mode is required")
    out += validate_label_selector(spec.get("selector"), f"{path}.selector")
    requests = _d(_d(spec.get("resources")).get("requests"))
    if "storage" not in requests:
        out.append(required(f"{path}.resources[storage]"))
    else:
        p = f"{path}.resources.requests[storage]"
        q, errs = _quantity(requests["storage"], p)
        out += errs
        if q is not None and q <= 0:
            out.append(invalid_value(p, _canonical(requests["storage"]), "must be greater than zero"))
    scn = spec.get("storageClassName")
    if scn:
        out += [invalid_value(f"{path}.storageClassName", scn, m) for m in is_dns1123_subdomain(_s(scn))]
    vm = spec.get("volumeMode")
    if vm is not None and vm not in ("Block", "Filesystem"):
        out.append(not_supported(f"{path}.volumeMode", vm, ("Block", "Filesystem")))
    return out


def _validate_pvc(obj: dict[str, Any]) -> list[Cause]:
    return validate_pvc_spec(obj.get("spec"))


def _validate_pvc_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out: list[Cause] = []
    if same_json(ns, os_):
        return out
    munged = orjson.loads(orjson.dumps(ns))
    bound = _d(old.get("status")).get("phase") == "Bound"
    if not os_.get("volumeName"):
        munged["volumeName"] = os_.get("volumeName")
    if bound:
        new_req = _d(_d(ns.get("resources")).get("requests"))
        old_req = _d(_d(os_.get("resources")).get("requests"))
        try:
            if "storage" in new_req and "storage" in old_req:
                nq, _ = parse_quantity_with_format(new_req["storage"])
                oq, _ = parse_quantity_with_format(old_req["storage"])
                if nq < oq:
                    cap = _d(_d(old.get("status")).get("capacity")).get("storage")
                    if cap is None or nq <= parse_quantity_with_format(cap)[0]:
                        out.append(forbidden_field("spec.resources.requests.storage",
                                              "field can not be less than status.capacity"
                                              if cap is not None else "field can not be less than previous value"))
        except ValueError:
            pass
        munged.setdefault("resources", {})
        if isinstance(munged["resources"], dict):
            munged["resources"]["requests"] = _d(os_.get("resources")).get("requests")
        munged["volumeAttributesClassName"] = os_.get("volumeAttributesClassName")
    if _norm(munged) != _norm(os_):
        out.append(forbidden_field("spec", PVC_UPDATE_FORBIDDEN))
    return out


def _validate_pv(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out = _validate_access_modes(spec.get("accessModes"), "spec.accessModes", "")
    capacity = _d(spec.get("capacity"))
    if not capacity:
        out.append(required("spec.capacity"))
    if "storage" not in capacity or len(capacity) > 1:
        out.append(not_supported("spec.capacity", capacity, ("storage",)))
    for name, value in capacity.items():
        p = f"spec.capacity[{name}]"
        q, errs = _quantity(value, p)
        out += errs
        if q is not None and q <= 0:
            out.append(invalid_value(p, _canonical(value), "must be greater than zero"))
    rp = spec.get("persistentVolumeReclaimPolicy")
    if rp and rp not in PV_RECLAIM_POLICIES:
        out.append(not_supported("spec.persistentVolumeReclaimPolicy", rp, PV_RECLAIM_POLICIES))
    sources = [k for k in PV_SOURCES if spec.get(k) is not None]
    if not sources:
        out.append(required("spec", "must specify a volume type"))
    for extra in sources[1:]:
        out.append(forbidden_field(f"spec.{extra}", "may not specify more than 1 volume type"))
    if sources:
        src = sources[0]
        out += _validate_volume_source(src, _d(spec.get(src)), f"spec.{src}")
        if src == "csi" and not _d(spec.get("csi")).get("volumeHandle"):
            out.append(required("spec.csi.volumeHandle"))
    if "local" in sources and not _d(_d(spec.get("nodeAffinity")).get("required")):
        out.append(required("spec.nodeAffinity", "Local volume requires node affinity"))
    na = _d(spec.get("nodeAffinity"))
    if na.get("required") is not None:
        out += validate_node_selector(na["required"], "spec.nodeAffinity.required")
    vm = spec.get("volumeMode")
    if vm is not None and vm not in ("Block", "Filesystem"):
        out.append(not_supported("spec.volumeMode", vm, ("Block", "Filesystem")))
    scn = spec.get("storageClassName")
    if scn:
        out += [invalid_value("spec.storageClassName", scn, m) for m in is_dns1123_subdomain(_s(scn))]
    return out


def _validate_pv_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out: list[Cause] = []
    nsrc = {k: ns.get(k) for k in PV_SOURCES if ns.get(k) is not None}
    osrc = {k: os_.get(k) for k in PV_SOURCES if os_.get(k) is not None}
    if _norm(nsrc) != _norm(osrc):
        out.append(forbidden_field("spec.persistentvolumesource", "spec.persistentvolumesource is immutable after creation"))
    out += _immutable(ns.get("volumeMode"), os_.get("volumeMode"), "volumeMode")
    if os_.get("nodeAffinity") is not None:
        out += _immutable(ns.get("nodeAffinity"), os_.get("nodeAffinity"), "nodeAffinity")
    return out
