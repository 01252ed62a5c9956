"""Hint scopes: which pods a queueing hint can answer Queue for.

A plugin may attach a :class:`HintScope` to a queueing hint function; the
scheduling queue then visits, for an event, only the waiting pods whose keys
meet the event's keys, instead of calling the hint for every waiting pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Optional

from kubeplane.scheduler.framework.types import Obj, QueueingHint

__all__ = ["ANY_POD", "HINT_SCOPE_ATTR", "HintScope", "hint_scope", "pod_independent_scope", "set_hint_scope"]


#: attribute of a queueing hint function holding its :class:`HintScope`
HINT_SCOPE_ATTR = "queue_scope"


@dataclass(frozen=True, eq=False)
class HintScope:
    """Which pods a queueing hint can answer Queue for, stated as index keys.

    ``pod_keys(pod)`` lists hashable keys of a pod, ``event_keys(old, new)``
    the keys of an event (None: any pod may be affected). Contract: when
    an event's keys and a pod's keys are disjoint, the hint answers Skip for
    that pod and that event (without raising). The queue then leaves such
    pods out of event handling instead of calling the hint for each of them.
    A hint function carries its scope in the attribute ``queue_scope``.
    """

    pod_keys: Callable[[Obj], Iterable[Hashable]]
    event_keys: Callable[[Any, Any], Optional[Iterable[Hashable]]]


def hint_scope(hint_fn: Any) -> HintScope | None:
    """The :class:`HintScope` of a queueing hint function, if it has one."""
    scope = getattr(hint_fn, HINT_SCOPE_ATTR, None) if hint_fn is not None else None
    return scope if isinstance(scope, HintScope) else None


#: the one key of every pod in scopes of hints that do not look at the pod
ANY_POD = ("any-pod",)


def set_hint_scope(hint: Any, scope: HintScope) -> None:
    """Attach ``scope`` to a hint function (or to the function of a class/static method)."""
    setattr(getattr(hint, "__func__", hint), HINT_SCOPE_ATTR, scope)


def _any_pod_key(pod: Obj) -> tuple[Any, ...]:
    return (ANY_POD,)


def pod_independent_scope(hint: Callable[[Obj, Any, Any], QueueingHint]) -> HintScope:
    """Scope of a hint whose answer ignores the pod: an event it answers Skip for concerns no pod.

    ``hint`` is evaluated once per event (with an empty pod) instead of once per waiting pod."""

    def event_keys(old: Any, new: Any) -> list[Any]:
        return [ANY_POD] if hint({}, old, new) != QueueingHint.SKIP else []

    return HintScope(_any_pod_key, event_keys)
