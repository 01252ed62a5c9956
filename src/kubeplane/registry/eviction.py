"""``pods/eviction``: a pod deleted only as far as its PodDisruptionBudget allows,
after upstream's ``EvictionREST`` (pkg/registry/core/pod/storage/eviction.go).

A POST of a policy/v1 (or v1beta1) ``Eviction`` to a pod's ``eviction``
subresource deletes the pod with the Eviction's ``deleteOptions`` when

- the pod has already disrupted its application (Succeeded, Failed, Pending or
  being deleted): no budget is consulted;
- no PodDisruptionBudget selects it;
- it is not Ready and its budget's ``unhealthyPodEvictionPolicy`` is
  ``AlwaysAllow``, or (``IfHealthyBudget``, the default) the budget is met;
- otherwise when the budget's ``status.disruptionsAllowed`` is above zero: it
  is decremented and the pod recorded in ``status.disruptedPods`` (so the
  disruption controller does not count it healthy while it goes) before the
  pod is deleted.

A budget that allows no disruption answers 429 TooManyRequests, "Cannot evict
pod as it would violate the pod's disruption budget.", with a
``DisruptionBudget`` cause that says why; a pod under two budgets answers 500,
as upstream. Before the delete, the pod gets the ``DisruptionTarget``
condition (reason ``EvictionByEvictionAPI``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kubeplane.api import errors
from kubeplane.api.meta import deep_copy, now_text
from kubeplane.api.resources import resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.registry.admission import CREATE, Attributes, operation_options

if TYPE_CHECKING:
    from kubeplane.registry.registry import Registry

Obj = dict[str, Any]

PODS = resource("pods")
PDBS = resource("poddisruptionbudgets")

#: upstream's EvictionsRetry: 20 attempts, 500 ms apart
RETRY_STEPS = 20
RETRY_INTERVAL = 0.5
#: upstream's MaxDisruptedPodSize
MAX_DISRUPTED_PODS = 2000

EVICTION_KIND = ("policy", "v1", "Eviction")
ACCEPTED_VERSIONS = ("policy/v1", "policy/v1beta1")
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"
TOO_MANY_REQUESTS_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
DISRUPTION_TARGET = "DisruptionTarget"


def _success() -> Obj:
    # A create answers 201 with the code in the Status too (upstream's createHandler).
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def too_many_requests(message: str, cause: str, retry_after: int = 0) -> errors.StatusError:
    """upstream's NewTooManyRequests with a DisruptionBudget cause (a zero
    retry-after is left out, as the omitempty field is)."""
    return errors.StatusError(429, "TooManyRequests", message, retry_after=retry_after or None,
                              causes=[errors.Cause(DISRUPTION_BUDGET_CAUSE, cause, "")])


def _still_processing(pdb_name: str) -> errors.StatusError:
    return too_many_requests(TOO_MANY_REQUESTS_MESSAGE,
                             f"The disruption budget {pdb_name} is still being processed by the server.", 10)


def _pdb_forbidden(name: str, why: str) -> errors.StatusError:
    # upstream names the resource in the singular here: policy.Resource("poddisruptionbudget")
    return errors.StatusError(403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden: {why}',
                              name=name, group="policy", kind="poddisruptionbudget")


def is_pod_ready(pod: Obj) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase") or ""


def _deleting(pod: Obj) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def can_ignore_pdb(pod: Obj) -> bool:
    """A pod that has already disrupted its application goes without a budget check."""
    return _phase(pod) in ("Succeeded", "Failed", "Pending") or _deleting(pod)


def _should_enforce_resource_version(pod: Obj) -> bool:
    return _phase(pod) not in ("Succeeded", "Failed") and not _deleting(pod)


def set_pod_condition(status: Obj, ctype: str, cstatus: str, reason: str, message: str) -> bool:
    """upstream's UpdatePodCondition: add or change one condition in place,
    keeping lastTransitionTime when the status did not change. True if anything changed."""
    conds = status.setdefault("conditions", [])
    if not isinstance(conds, list):
        conds = status["conditions"] = []
    now = now_text()
    new = {"type": ctype, "status": cstatus, "lastProbeTime": None, "lastTransitionTime": now}
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    for i, c in enumerate(conds):
        if isinstance(c, dict) and c.get("type") == ctype:
            if c.get("status") == cstatus:
                new["lastTransitionTime"] = c.get("lastTransitionTime") or now
                new["lastProbeTime"] = c.get("lastProbeTime")
            changed = any(c.get(k) != new.get(k) for k in ("status", "reason", "message", "lastTransitionTime"))
            conds[i] = new
            return changed
    conds.append(new)
    return True


def _delete_options(eviction: Obj, name: str, dry_run: bool) -> Obj:
    """The Eviction's deleteOptions, checked, with the request's dryRun merged in."""
    opts = eviction.get("deleteOptions")
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise errors.bad_request("deleteOptions must be an object")
    opts = dict(opts)
    if opts.get("ignoreStoreReadErrorWithClusterBreakingPotential") is True:
        raise errors.invalid("Eviction", name, [errors.invalid_value(
            "deleteOptions.ignoreStoreReadErrorWithClusterBreakingPotential", True,
            "can not be set for pod eviction, try after removing the option")], group="policy")
    grace = opts.get("gracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool)):
        raise errors.bad_request("deleteOptions.gracePeriodSeconds must be an integer")
    pre = opts.get("preconditions")
    if pre is not None:
        if not isinstance(pre, dict) or any(v is not None and not isinstance(v, str) for v in pre.values()):
            raise errors.bad_request("deleteOptions.preconditions must be an object of strings")
    body_dry = opts.get("dryRun") or []
    if not isinstance(body_dry, list) or any(v != "All" for v in body_dry):
        raise errors.invalid("Eviction", name, [errors.not_supported(
            "deleteOptions.dryRun", body_dry, ["All"])], group="policy")
    request_dry = ["All"] if dry_run else []
    if body_dry and request_dry and body_dry != request_dry:
        raise errors.internal(f"Non-matching dry-run options in request and content: {request_dry} and {body_dry}")
    opts["dryRun"] = body_dry or request_dry
    return opts


def _rv_precondition(opts: Obj) -> str | None:
    pre = opts.get("preconditions") or {}
    return pre.get("resourceVersion") or None


def _with_rv(opts: Obj, rv: str) -> Obj:
    out = dict(opts)
    out["preconditions"] = {**(opts.get("preconditions") or {}), "resourceVersion": rv}
    return out


class _NoDelete(Exception):
    """The retried step decided not to delete (the budget must be checked)."""


async def evict(registry: "Registry", name: str, namespace: str, eviction: Any, *,
                dry_run: bool = False) -> tuple[Obj, int]:
    """Evict pod ``namespace/name``; returns (Status, HTTP code)."""
    if not isinstance(eviction, dict):
        raise errors.bad_request("the body of the request must be a JSON object")
    api_version = eviction.get("apiVersion")
    kind = eviction.get("kind")
    if (kind not in (None, "", "Eviction")) or (api_version not in (None, "", *ACCEPTED_VERSIONS)):
        raise errors.bad_request(f"not a Eviction object: {api_version or ''}, Kind={kind or ''}")
    md = eviction.get("metadata")
    if md is not None and not isinstance(md, dict):
        raise errors.bad_request("metadata must be an object")
    if (md or {}).get("name") != name:
        raise errors.bad_request("name in URL does not match name in Eviction object")
    opts = _delete_options(eviction, name, dry_run)
    is_dry = bool(opts["dryRun"])

    adm = deep_copy(eviction)
    adm["apiVersion"], adm["kind"] = "policy/v1", "Eviction"
    adm.setdefault("metadata", {}).setdefault("namespace", namespace)
    attrs = Attributes(CREATE, PODS, name, namespace, adm, None, "eviction", kind=EVICTION_KIND, dry_run=is_dry,
                       options=operation_options("CreateOptions", dry_run=is_dry))
    await registry.admission.admit(attrs)
    await registry.admission.validate(attrs)

    user_rv = _rv_precondition(opts)
    pod: Obj = {}
    # Pods that already disrupted their application are deleted without a budget.
    for attempt in range(RETRY_STEPS):
        pod = await registry.get(PODS, name, namespace)
        if not can_ignore_pdb(pod):
            break
        delete_opts = opts
        if _should_enforce_resource_version(pod) and user_rv is None:
            delete_opts = _with_rv(opts, pod["metadata"].get("resourceVersion", ""))
        try:
            await _add_condition_and_delete(registry, name, namespace, delete_opts)
        except errors.StatusError as err:
            if err.code != 409 or user_rv is not None or attempt == RETRY_STEPS - 1:
                raise
            await asyncio.sleep(RETRY_INTERVAL)
            continue
        return _success(), 201

    pdbs = await _pdbs_for(registry, pod)
    if len(pdbs) > 1:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                           "does not support.", "code": 500}, 500
    pin_rv = False
    if pdbs:
        pdb = pdbs[0]
        pdb_name = pdb["metadata"]["name"]
        spec = pdb.get("spec") or {}
        status = pdb.get("status") or {}
        decrement = True
        if not is_pod_ready(pod):
            # An unready pod does not count towards the budget.
            if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
                decrement, pin_rv = False, True
            elif (int(status.get("currentHealthy") or 0) >= int(status.get("desiredHealthy") or 0)
                  and int(status.get("desiredHealthy") or 0) > 0):
                decrement, pin_rv = False, True
        if decrement:
            await _check_and_decrement(registry, namespace, name, pdb, is_dry)

    delete_opts = opts
    if pin_rv:
        # The pod must not have become Ready since the budget was read.
        delete_opts = _with_rv(opts, pod["metadata"].get("resourceVersion", ""))
    try:
        await _add_condition_and_delete(registry, name, namespace, delete_opts)
    except errors.StatusError as err:
        if err.code == 409 and pin_rv and user_rv is None:
            raise _still_processing(pdbs[0]["metadata"]["name"]) from None
        raise
    return _success(), 201


async def _pdbs_for(registry: "Registry", pod: Obj) -> list[Obj]:
    md = pod.get("metadata") or {}
    labels = md.get("labels") or {}
    out = []
    for pdb in (await registry.list(PDBS, md.get("namespace")))["items"]:
        sel = (pdb.get("spec") or {}).get("selector")
        try:
            selector = label_selector_from_dict(sel if isinstance(sel, dict) else None)
        except (ValueError, errors.StatusError):
            continue  # an invalid selector matches no pod
        if sel is None or selector.matches_nothing:
            continue
        if selector.matches(labels):
            out.append(pdb)
    return out


async def _check_and_decrement(registry: "Registry", namespace: str, pod_name: str, pdb: Obj, dry_run: bool) -> None:
    """Take one disruption from the budget, retrying on conflicts with a fresh
    copy; 429 when it allows none."""
    pdb_name = pdb["metadata"]["name"]
    for attempt in range(RETRY_STEPS):
        if attempt:
            pdb = await registry.get(PDBS, pdb_name, namespace)
        status = dict(pdb.get("status") or {})
        if int(status.get("observedGeneration") or 0) < int(pdb["metadata"].get("generation") or 0):
            raise _still_processing(pdb_name)
        allowed = int(status.get("disruptionsAllowed") or 0)
        if allowed < 0:
            raise _pdb_forbidden(pdb_name, "pdb disruptions allowed is negative")
        disrupted = dict(status.get("disruptedPods") or {})
        if len(disrupted) > MAX_DISRUPTED_PODS:
            raise _pdb_forbidden(pdb_name, "DisruptedPods map too big - too many evictions not confirmed by PDB "
                                           "controller")
        if allowed == 0:
            raise too_many_requests(TOO_MANY_REQUESTS_MESSAGE, _why_not(pdb_name, status))
        status["disruptionsAllowed"] = allowed - 1
        if allowed - 1 == 0:
            status["conditions"] = set_allowed_condition(status.get("conditions"), 0,
                                                         int(status.get("observedGeneration") or 0))
        if dry_run:
            return
        disrupted[pod_name] = now_text()
        status["disruptedPods"] = disrupted
        new = {**pdb, "status": status}
        try:
            await registry.update(PDBS, new, subresource="status")
            return
        except errors.StatusError as err:
            if err.code != 409:
                raise
    raise errors.timeout(f'couldn\'t update PodDisruptionBudget "{pdb_name}" due to conflicts', 10)


def _why_not(pdb_name: str, status: Obj) -> str:
    cond = next((c for c in status.get("conditions") or []
                 if isinstance(c, dict) and c.get("type") == "DisruptionAllowed"), None)
    current = int(status.get("currentHealthy") or 0)
    desired = int(status.get("desiredHealthy") or 0)
    false_with_message = cond is not None and cond.get("status") == "False" and bool(cond.get("message"))
    if false_with_message and cond.get("reason") == "SyncFailed":
        return (f"The disruption budget {pdb_name} does not allow evicting pods currently because it failed "
                f"sync: {cond['message']}")
    if current <= desired:
        return f"The disruption budget {pdb_name} needs {desired} healthy pods and has {current} currently"
    if false_with_message:
        return (f"The disruption budget {pdb_name} does not allow evicting pods currently "
                f"({cond.get('reason', '')}): {cond['message']}")
    return f"The disruption budget {pdb_name} does not allow evicting pods currently"


def set_allowed_condition(conditions: Any, disruptions_allowed: int, observed_generation: int) -> list[Obj]:
    """upstream's UpdateDisruptionAllowedCondition: DisruptionAllowed True
    (SufficientPods) when disruptions are allowed, else False (InsufficientPods);
    lastTransitionTime kept while the status stays (apimeta.SetStatusCondition)."""
    ok = disruptions_allowed > 0
    return set_status_condition(conditions, {
        "type": "DisruptionAllowed", "status": "True" if ok else "False",
        "reason": "SufficientPods" if ok else "InsufficientPods", "message": "",
        "observedGeneration": observed_generation})


def set_status_condition(conditions: Any, new: Obj) -> list[Obj]:
    """apimeta.SetStatusCondition on a copy of a metav1.Condition list."""
    out = [dict(c) for c in conditions or [] if isinstance(c, dict)]
    for c in out:
        if c.get("type") == new["type"]:
            if c.get("status") != new["status"]:
                c["status"] = new["status"]
                c["lastTransitionTime"] = new.get("lastTransitionTime") or now_text()
            c["reason"] = new.get("reason", "")
            c["message"] = new.get("message", "")
            c["observedGeneration"] = new.get("observedGeneration", 0)
            return out
    out.append({"type": new["type"], "status": new["status"], "observedGeneration": new.get("observedGeneration", 0),
                "lastTransitionTime": new.get("lastTransitionTime") or now_text(),
                "reason": new.get("reason", ""), "message": new.get("message", "")})
    return out


async def _add_condition_and_delete(registry: "Registry", name: str, namespace: str, opts: Obj) -> None:
    """The DisruptionTarget condition on the pod as stored, then the delete."""
    pre = dict(opts.get("preconditions") or {})
    dry = bool(opts.get("dryRun"))
    if not dry:
        for attempt in range(RETRY_STEPS):
            latest = await registry.get(PODS, name, namespace)
            lmd = latest.get("metadata") or {}
            if pre.get("uid") and pre["uid"] != lmd.get("uid"):
                raise errors.conflict("Pod", name, detail=(
                    f"the UID in the precondition ({pre['uid']}) does not match the UID in record "
                    f"({lmd.get('uid')}). The object might have been deleted and then recreated"))
            if pre.get("resourceVersion") and pre["resourceVersion"] != lmd.get("resourceVersion"):
                raise errors.conflict("Pod", name, detail=(
                    f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not match the "
                    f"ResourceVersion in record ({lmd.get('resourceVersion')}). The object might have been "
                    f"modified"))
            new = deep_copy(latest)
            set_pod_condition(new.setdefault("status", {}), DISRUPTION_TARGET, "True", "EvictionByEvictionAPI",
                              "Eviction API: evicting")
            try:
                updated = await registry.update(PODS, new, subresource="status")
            except errors.StatusError as err:
                if err.code != 409 or attempt == RETRY_STEPS - 1:
                    raise
                continue
            if pre.get("resourceVersion"):
                pre["resourceVersion"] = updated["metadata"]["resourceVersion"]  # the write was ours
            break
    await registry.delete(PODS, name, namespace, grace_period_seconds=opts.get("gracePeriodSeconds"),
                          propagation_policy=opts.get("propagationPolicy"),
                          preconditions={k: v for k, v in pre.items() if v} or None, dry_run=dry)


__all__ = ["evict", "is_pod_ready", "set_allowed_condition", "set_pod_condition", "set_status_condition"]
