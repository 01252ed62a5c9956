"""Core framework vocabulary shared by the queue, the cache and every plugin.

Mirrors upstream kube-scheduler's framework package: status codes (their
integer values matter: logs and tests use them), cluster events with an
action bitmask, queueing hints and the per-cycle state.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Optional

Obj = dict[str, Any]


class Code(enum.IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5
    PENDING = 6


_REJECTED = (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, Code.PENDING)


@dataclass(slots=True)
class Status:
    """A plugin's verdict. ``None`` stands for Success wherever a Status is expected."""

    code: Code = Code.SUCCESS
    reasons: list[str] = field(default_factory=list)
    plugin: str = ""
    error: BaseException | None = None

    @classmethod
    def success(cls) -> "Status":
        return cls(Code.SUCCESS)

    @classmethod
    def unschedulable(cls, *reasons: str, plugin: str = "") -> "Status":
        return cls(Code.UNSCHEDULABLE, list(reasons), plugin)

    @classmethod
    def unresolvable(cls, *reasons: str, plugin: str = "") -> "Status":
        return cls(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, list(reasons), plugin)

    @classmethod
    def pending(cls, *reasons: str, plugin: str = "") -> "Status":
        return cls(Code.PENDING, list(reasons), plugin)

    @classmethod
    def skip(cls) -> "Status":
        """The shared, read-only Skip status (plugins return it on every cycle)."""
        return _SKIP

    @classmethod
    def wait(cls, plugin: str = "") -> "Status":
        return cls(Code.WAIT, [], plugin)

    @classmethod
    def as_status(cls, err: BaseException, plugin: str = "") -> "Status":
        return cls(Code.ERROR, [str(err)], plugin, err)

    def is_success(self) -> bool:
        return self.code == Code.SUCCESS

    def is_skip(self) -> bool:
        return self.code == Code.SKIP

    def is_wait(self) -> bool:
        return self.code == Code.WAIT

    def is_rejected(self) -> bool:
        return self.code in _REJECTED

    def message(self) -> str:
        return ", ".join(self.reasons)

    def with_plugin(self, plugin: str) -> "Status":
        self.plugin = plugin
        return self

    def as_error(self, msg: str, plugin: str) -> "Status":
        """This non-success status as the Error the framework reports for it: ``msg: <message>``
        (upstream's ``AsStatus(fmt.Errorf("%s: %w", msg, err))``)."""
        err = self.error or Exception(self.message())
        return Status(Code.ERROR, [f"{msg}: {self.message() or err}"], plugin, err)


class _ReadOnlyStatus(Status):
    """A status shared by every caller: setting a field raises."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the shared {self.code.name} status is read-only")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return (self.code, self.reasons, self.plugin, self.error) == (
            other.code, other.reasons, other.plugin, other.error)

    __hash__ = None  # type: ignore[assignment]  # as Status: mutable, unhashable


def _read_only(code: Code) -> Status:
    s = object.__new__(_ReadOnlyStatus)
    for name, value in (("code", code), ("reasons", []), ("plugin", ""), ("error", None)):
        object.__setattr__(s, name, value)
    return s


_SKIP = _read_only(Code.SKIP)


def is_success(s: Optional[Status]) -> bool:
    return s is None or s.code == Code.SUCCESS


class ActionType(enum.IntFlag):
    ADD = 1
    DELETE = 2
    UPDATE_NODE_ALLOCATABLE = 4
    UPDATE_NODE_LABEL = 8
    UPDATE_NODE_TAINT = 16
    UPDATE_NODE_CONDITION = 32
    UPDATE_NODE_ANNOTATION = 64
    UPDATE_POD_LABEL = 128
    UPDATE_POD_SCALE_DOWN = 256
    UPDATE_POD_TOLERATIONS = 512
    UPDATE_POD_SCHEDULING_GATES_ELIMINATED = 1024
    UPDATE_POD_GENERATED_RESOURCE_CLAIM = 2048
    UPDATED_POD_OTHER = 4096

    UPDATE = (UPDATE_NODE_ALLOCATABLE | UPDATE_NODE_LABEL | UPDATE_NODE_TAINT | UPDATE_NODE_CONDITION
              | UPDATE_NODE_ANNOTATION | UPDATE_POD_LABEL | UPDATE_POD_SCALE_DOWN | UPDATE_POD_TOLERATIONS
              | UPDATE_POD_SCHEDULING_GATES_ELIMINATED | UPDATE_POD_GENERATED_RESOURCE_CLAIM | UPDATED_POD_OTHER)
    ALL = ADD | DELETE | UPDATE


class EventResource(str, enum.Enum):
    POD = "Pod"
    ASSIGNED_POD = "AssignedPod"
    UNSCHEDULED_POD = "UnscheduledPod"
    NODE = "Node"
    PERSISTENT_VOLUME = "PersistentVolume"
    PERSISTENT_VOLUME_CLAIM = "PersistentVolumeClaim"
    CSI_NODE = "storage.k8s.io/CSINode"
    CSI_DRIVER = "storage.k8s.io/CSIDriver"
    CSI_STORAGE_CAPACITY = "storage.k8s.io/CSIStorageCapacity"
    STORAGE_CLASS = "storage.k8s.io/StorageClass"
    VOLUME_ATTACHMENT = "storage.k8s.io/VolumeAttachment"
    RESOURCE_CLAIM = "resource.k8s.io/ResourceClaim"
    RESOURCE_SLICE = "resource.k8s.io/ResourceSlice"
    DEVICE_CLASS = "resource.k8s.io/DeviceClass"
    WILDCARD = "*"


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    resource: EventResource
    action: ActionType
    label: str = ""

    def is_wildcard(self) -> bool:
        return self.resource == EventResource.WILDCARD and self.action == ActionType.ALL

    def matches(self, incoming: "ClusterEvent") -> bool:
        """Whether a registered event (self) covers an incoming one."""
        if self.is_wildcard():
            return True
        res_ok = (self.resource == incoming.resource or self.resource == EventResource.WILDCARD
                  or incoming.resource == EventResource.WILDCARD)
        # Pod registrations cover both assigned and unscheduled pod events.
        if not res_ok and self.resource == EventResource.POD and incoming.resource in (
            EventResource.ASSIGNED_POD, EventResource.UNSCHEDULED_POD
        ):
            res_ok = True
        return res_ok and bool(self.action & incoming.action)


WILDCARD_EVENT = ClusterEvent(EventResource.WILDCARD, ActionType.ALL, "WildCardEvent")
UNSCHEDULABLE_TIMEOUT = ClusterEvent(EventResource.WILDCARD, ActionType.ALL, "UnschedulableTimeout")
FORCE_ACTIVATE = ClusterEvent(EventResource.WILDCARD, ActionType.ALL, "ForceActivate")


class QueueingHint(enum.IntEnum):
    SKIP = 0
    QUEUE = 1


#: hint_fn(pod, old_obj, new_obj) -> QueueingHint
QueueingHintFn = Callable[[Obj, Any, Any], QueueingHint]


@dataclass(frozen=True, slots=True)
class ClusterEventWithHint:
    event: ClusterEvent
    hint: QueueingHintFn | None = None  # None means "always Queue"


class _EveryNode:
    """See :data:`EVERY_NODE`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EVERY_NODE"


#: A ``filter_pass_except`` answer: the plugin's Filter may fail on every node
#: (no node passes for sure). The plugin's ``filter_known_statuses`` may still
#: state the rejection of most of them at once.
EVERY_NODE = _EveryNode()


class PassOnly:
    """A ``filter_pass_except`` answer for when most nodes are exceptions: the
    plugin's Filter certainly succeeds on the nodes ``names`` and may fail on
    every other node (``EVERY_NODE`` is ``PassOnly(())``)."""

    __slots__ = ("names",)

    def __init__(self, names: Collection[str]) -> None:
        self.names = names

    def __repr__(self) -> str:
        return f"PassOnly({sorted(self.names)!r})"


class CycleState:
    """Per-cycle scratch space shared by a pod's plugins (thread-safe)."""

    __slots__ = ("_data", "_lock", "skip_filter_plugins", "skip_score_plugins", "record_metrics")

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.skip_filter_plugins: set[str] = set()
        self.skip_score_plugins: set[str] = set()
        self.record_metrics = False

    def read(self, key: str) -> Any:
        with self._lock:
            if key not in self._data:
                raise KeyError(f"{key!r} not found in cycle state")
            return self._data[key]

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._data.get(key, default)

    def write(self, key: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clone(self) -> "CycleState":
        c = CycleState()
        with self._lock:
            for k, v in self._data.items():
                clone = getattr(v, "clone", None)
                c._data[k] = clone() if callable(clone) else v
        c.skip_filter_plugins = set(self.skip_filter_plugins)
        c.skip_score_plugins = set(self.skip_score_plugins)
        c.record_metrics = self.record_metrics
        return c


@dataclass(slots=True)
class PreFilterResult:
    """``node_names`` None means all nodes; a set narrows the candidates."""

    node_names: set[str] | None = None

    def all_nodes(self) -> bool:
        return self.node_names is None

    def merge(self, other: "PreFilterResult | None") -> "PreFilterResult":
        if other is None or other.all_nodes():
            return PreFilterResult(None if self.node_names is None else set(self.node_names))
        if self.all_nodes():
            return PreFilterResult(set(other.node_names or ()))
        return PreFilterResult(self.node_names & (other.node_names or set()))


MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0
MAX_TOTAL_SCORE = 2**63 - 1


def invalid_score_status(plugin: str, score: int) -> "Status":
    """The Error for a normalized score outside [MIN_NODE_SCORE, MAX_NODE_SCORE]."""
    msg = (f"plugin {plugin!r} returns an invalid score {score}, it should in the range of "
           f"[{MIN_NODE_SCORE}, {MAX_NODE_SCORE}] after normalizing")
    return Status(Code.ERROR, [msg], plugin, ValueError(msg))
