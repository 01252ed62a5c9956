"""apps/v1 DaemonSet: defaults and the template generation.

Upstream's internal DaemonSet has ``spec.templateGeneration``; apps/v1 carries
it as the ``deprecated.daemonset.template.generation`` annotation. The server
owns it: 1 on create (or what the client sent, when higher), the stored value
on update, plus one whenever the pod template changes. The DaemonSet
controller labels its pods with it (``pod-template-generation``).
"""

from __future__ import annotations

from typing import Any

from kubeplane.api import errors
from kubeplane.registry.strategies import Strategy, _default_template

Obj = dict[str, Any]

TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"


def _template_generation(obj: Obj) -> int | None:
    """The annotation's value; a value that is no integer is a 400, as upstream's decoding fails."""
    anns = (obj.get("metadata") or {}).get("annotations")
    if not isinstance(anns, dict) or TEMPLATE_GENERATION not in anns:
        return None
    value = anns[TEMPLATE_GENERATION]
    try:
        return int(str(value), 10)
    except ValueError:
        raise errors.bad_request(f'strconv.ParseInt: parsing {errors.go_repr(str(value))}: invalid syntax') from None


def _set_template_generation(obj: Obj, generation: int) -> None:
    md = obj.setdefault("metadata", {})
    anns = md.get("annotations")
    if not isinstance(anns, dict):
        anns = md["annotations"] = {}
    anns[TEMPLATE_GENERATION] = str(generation)


class DaemonSetStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        strategy = spec.get("updateStrategy")
        if strategy is None:
            strategy = spec["updateStrategy"] = {}
        if isinstance(strategy, dict):
            strategy.setdefault("type", "RollingUpdate")
            if strategy.get("type") == "RollingUpdate":
                ru = strategy.get("rollingUpdate")
                if ru is None:
                    ru = strategy["rollingUpdate"] = {}
                if isinstance(ru, dict):
                    ru.setdefault("maxUnavailable", 1)
                    ru.setdefault("maxSurge", 0)
        spec.setdefault("revisionHistoryLimit", 10)
        template = spec.get("template")
        if isinstance(template, dict) and isinstance(template.get("metadata"), dict) \
                and "creationTimestamp" in template["metadata"] and template["metadata"]["creationTimestamp"] is None:
            # what the typed template drops: kubectl rollout undo's patch carries it
            del template["metadata"]["creationTimestamp"]
        _default_template(spec)

    def initial_status(self, obj: Obj) -> Obj:
        # the four counters apps/v1 always serialises
        return {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0}

    def prepare_for_create(self, obj: Obj) -> None:
        super().prepare_for_create(obj)
        generation = _template_generation(obj)
        _set_template_generation(obj, generation if generation is not None and generation >= 1 else 1)

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        super().prepare_for_update(new, old)
        _template_generation(new)  # an unreadable value is still the client's error
        generation = _template_generation(old) or 0
        old_template = (old.get("spec") or {}).get("template")
        new_template = (new.get("spec") or {}).get("template") if isinstance(new.get("spec"), dict) else None
        if new_template != old_template:
            generation += 1
        _set_template_generation(new, generation)


__all__ = ["DaemonSetStrategy", "TEMPLATE_GENERATION"]
