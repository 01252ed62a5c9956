"""KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1): loading, defaulting, validation.

Accepts the file users write for a real cluster. Decoding is strict like
upstream's: unknown or duplicate fields, wrong types, malformed YAML, unknown
plugins and invalid values are reported as :class:`ConfigError` naming the
field path. Each profile is turned into the dict the framework constructor
takes (``Framework(registry, profile.framework_profile())``); the framework
merges it with the default MultiPoint plugins. The merged, expanded plugin
lists are computed here as well, to validate them at startup.

Plugin classes may define an optional ``validate_args(args: dict) -> None``
classmethod raising ``ValueError``; it is called for their ``pluginConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from kubeplane.api.duration import parse_duration as go_parse_duration
from kubeplane.api.gofmt import go_duration
from kubeplane.scheduler.framework.plugin import EXTENSION_METHODS, Plugin, implements
from kubeplane.scheduler.framework.registry import default_multi_point
from kubeplane.scheduler.plugins.registry import DEFAULT_PLUGINS
from kubeplane.scheduler.framework.runtime import EXTENSION_POINTS, merge_profile_plugins

API_GROUP = "kubescheduler.config.k8s.io"
API_VERSION = f"{API_GROUP}/v1"
KIND = "KubeSchedulerConfiguration"
DEFAULT_SCHEDULER_NAME = "default-scheduler"

#: extension point keys of ``profiles[].plugins`` (``multiPoint`` first)
PLUGIN_POINTS = ["multiPoint", *EXTENSION_POINTS]

#: upstream in-tree plugin names; they may be disabled or configured even when not implemented here
UPSTREAM_PLUGINS = frozenset(name for name, _ in DEFAULT_PLUGINS) | {"NodeResourcesFit"}

# known args fields of upstream's in-tree plugin args types
_ARGS_FIELDS: dict[str, frozenset[str]] = {
    "DefaultPreemption": frozenset({"minCandidateNodesPercentage", "minCandidateNodesAbsolute"}),
    "InterPodAffinity": frozenset({"hardPodAffinityWeight", "ignorePreferredTermsOfExistingPods"}),
    "NodeAffinity": frozenset({"addedAffinity"}),
    "NodeResourcesBalancedAllocation": frozenset({"resources"}),
    "NodeResourcesFit": frozenset({"ignoredResources", "ignoredResourceGroups", "scoringStrategy"}),
    "PodTopologySpread": frozenset({"defaultConstraints", "defaultingType"}),
    "VolumeBinding": frozenset({"bindTimeoutSeconds", "shape"}),
    "DynamicResources": frozenset({"filterTimeout", "bindingTimeout"}),
}

_TOP_FIELDS = frozenset({
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "enableProfiling",
    "enableContentionProfiling", "percentageOfNodesToScore", "podInitialBackoffSeconds",
    "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive",
})
_LE_FIELDS = frozenset({
    "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
    "resourceNamespace",
})
_CC_FIELDS = frozenset({"kubeconfig", "acceptContentTypes", "contentType", "qps", "burst"})
_PROFILE_FIELDS = frozenset({"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"})


class ConfigError(ValueError):
    """An invalid scheduler configuration; the message names the field and the problem."""


# --------------------------------------------------------------------------- result types


@dataclass(slots=True)
class LeaderElectionConfig:
    """``leaderElection``; durations in seconds. Upstream defaults ``leaderElect`` to true."""

    leader_elect: bool = True
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    resource_lock: str = "leases"
    resource_name: str = "kube-scheduler"
    resource_namespace: str = "kube-system"


@dataclass(slots=True)
class ClientConnectionConfig:
    """``clientConnection``: accepted and kept; only ``kubeconfig`` is meaningful here."""

    kubeconfig: str = ""
    accept_content_types: str = ""
    content_type: str = "application/vnd.kubernetes.protobuf"
    qps: float = 50.0
    burst: int = 100


@dataclass(slots=True)
class SchedulerProfile:
    """One validated profile.

    ``plugins`` and ``plugin_config`` are the user's (normalised) values;
    ``enabled`` maps each extension point to the plugin names that will run
    there after merging with the defaults, ``score_weights`` the weights.
    """

    scheduler_name: str
    percentage_of_nodes_to_score: int | None = None
    plugins: dict[str, dict[str, list[dict]]] = field(default_factory=dict)
    plugin_config: list[dict] = field(default_factory=list)
    enabled: dict[str, list[str]] = field(default_factory=dict)
    score_weights: dict[str, int] = field(default_factory=dict)

    def framework_profile(self) -> dict[str, Any]:
        """The ``profile`` dict for ``Framework(registry, profile)``."""
        out: dict[str, Any] = {"schedulerName": self.scheduler_name}
        if self.percentage_of_nodes_to_score is not None:
            out["percentageOfNodesToScore"] = self.percentage_of_nodes_to_score
        out["plugins"] = {
            ep: {"enabled": [dict(p) for p in s["enabled"]], "disabled": [dict(p) for p in s["disabled"]]}
            for ep, s in self.plugins.items()
        }
        out["pluginConfig"] = [{"name": pc["name"], "args": dict(pc["args"])} for pc in self.plugin_config]
        return out

    def plugin_args(self, name: str) -> dict | None:
        for pc in self.plugin_config:
            if pc["name"] == name:
                return pc["args"]
        return None


@dataclass(slots=True)
class SchedulerConfig:
    """A defaulted, validated KubeSchedulerConfiguration."""

    parallelism: int = 16
    percentage_of_nodes_to_score: int = 0
    pod_initial_backoff_seconds: int = 1
    pod_max_backoff_seconds: int = 10
    leader_election: LeaderElectionConfig = field(default_factory=LeaderElectionConfig)
    client_connection: ClientConnectionConfig = field(default_factory=ClientConnectionConfig)
    enable_profiling: bool = True
    enable_contention_profiling: bool = True
    delay_cache_until_active: bool = False
    profiles: list[SchedulerProfile] = field(default_factory=list)

    def scheduler_names(self) -> list[str]:
        return [p.scheduler_name for p in self.profiles]

    def profile(self, scheduler_name: str) -> SchedulerProfile | None:
        for p in self.profiles:
            if p.scheduler_name == scheduler_name:
                return p
        return None

    def framework_profiles(self) -> list[dict[str, Any]]:
        """One ``Framework`` profile dict per profile, in file order."""
        return [p.framework_profile() for p in self.profiles]


# --------------------------------------------------------------------------- YAML


class _StrictLoader(yaml.CSafeLoader):
    """Safe loader that rejects duplicate mapping keys (upstream's strict decoding does)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            line = key_node.start_mark.line + 1
            raise ConfigError(f'malformed configuration: duplicate field "{key}" at line {line}')
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - safe loader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = e.problem or e.context or "invalid YAML"
        raise ConfigError(f"malformed YAML in {source}{where}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML in {source}: {e}") from None


# --------------------------------------------------------------------------- field helpers

def parse_duration(value: str) -> float:
    """Parse a Go duration string (``15s``, ``1m30s``, ``1.5h``, ``500ms``, ``0``) into seconds."""
    if not isinstance(value, str):
        raise ValueError(f"duration must be a string like \"15s\", got {value!r}")
    try:
        return go_parse_duration(value.strip())
    except ValueError:
        raise ValueError(f"invalid duration {value!r}") from None


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _bad_type(path: str, want: str, v: Any) -> ConfigError:
    return ConfigError(f"{path}: expected {want}, got {_type_name(v)} {v!r}")


def _mapping(v: Any, path: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _bad_type(path, "object", v)
    return v


def _list(v: Any, path: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise _bad_type(path, "array", v)
    return v


def _strict(obj: Mapping[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            name = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(f'unknown field "{name}"')


def _int(v: Any, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise _bad_type(path, "integer", v)
    return int(v)


def _opt_int(obj: Mapping[str, Any], key: str, path: str) -> int | None:
    v = obj.get(key)
    return None if v is None else _int(v, path)


def _str(v: Any, path: str) -> str:
    if not isinstance(v, str):
        raise _bad_type(path, "string", v)
    return v


def _bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise _bad_type(path, "boolean", v)
    return v


def _duration(v: Any, path: str) -> float:
    try:
        return parse_duration(v)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None


def _percentage(v: int | None, path: str) -> None:
    if v is not None and not 0 <= v <= 100:
        raise ConfigError(f"{path}: Invalid value: {v}: not in valid range [0-100]")


# --------------------------------------------------------------------------- sections


def _leader_election(raw: Any) -> LeaderElectionConfig:
    obj = _mapping(raw, "leaderElection")
    _strict(obj, _LE_FIELDS, "leaderElection")
    le = LeaderElectionConfig()
    if obj.get("leaderElect") is not None:
        le.leader_elect = _bool(obj["leaderElect"], "leaderElection.leaderElect")
    for key, attr in (("leaseDuration", "lease_duration"), ("renewDeadline", "renew_deadline"),
                      ("retryPeriod", "retry_period")):
        if obj.get(key) is not None:
            setattr(le, attr, _duration(obj[key], f"leaderElection.{key}"))
    for key, attr in (("resourceLock", "resource_lock"), ("resourceName", "resource_name"),
                      ("resourceNamespace", "resource_namespace")):
        if obj.get(key) is not None:
            setattr(le, attr, _str(obj[key], f"leaderElection.{key}"))
    if not le.leader_elect:
        return le
    for key, attr in (("leaseDuration", "lease_duration"), ("renewDeadline", "renew_deadline"),
                      ("retryPeriod", "retry_period")):
        if getattr(le, attr) <= 0:
            raise ConfigError(f"leaderElection.{key}: Invalid value: must be greater than zero")
    if le.lease_duration <= le.renew_deadline:
        raise ConfigError("leaderElection.leaseDuration: Invalid value: LeaseDuration must be greater than RenewDeadline")
    if le.renew_deadline <= 1.2 * le.retry_period:
        raise ConfigError("leaderElection.renewDeadline: Invalid value: RenewDeadline must be greater than "
                          "retryPeriod*1.2")
    if le.resource_lock != "leases":
        raise ConfigError(f'leaderElection.resourceLock: Unsupported value: "{le.resource_lock}": '
                          'supported values: "leases"')
    if not le.resource_name:
        raise ConfigError("leaderElection.resourceName: Required value")
    if not le.resource_namespace:
        raise ConfigError("leaderElection.resourceNamespace: Required value")
    return le


def _client_connection(raw: Any) -> ClientConnectionConfig:
    obj = _mapping(raw, "clientConnection")
    _strict(obj, _CC_FIELDS, "clientConnection")
    cc = ClientConnectionConfig()
    for key, attr in (("kubeconfig", "kubeconfig"), ("acceptContentTypes", "accept_content_types"),
                      ("contentType", "content_type")):
        if obj.get(key) is not None:
            setattr(cc, attr, _str(obj[key], f"clientConnection.{key}"))
    if obj.get("qps") is not None:
        v = obj["qps"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad_type("clientConnection.qps", "number", v)
        cc.qps = float(v)
    if obj.get("burst") is not None:
        cc.burst = _int(obj["burst"], "clientConnection.burst")
    return cc


def _plugin_list(raw: Any, path: str, *, enabled: bool) -> list[dict]:
    out: list[dict] = []
    seen: set[str] = set()
    for i, entry in enumerate(_list(raw, path)):
        p = f"{path}[{i}]"
        entry = _mapping(entry, p)
        _strict(entry, frozenset({"name", "weight"}), p)
        if entry.get("name") in (None, ""):
            raise ConfigError(f"{p}.name: Required value")
        name = _str(entry["name"], f"{p}.name")
        if name in seen:
            raise ConfigError(f'{p}.name: Duplicate value: "{name}"')
        seen.add(name)
        item: dict[str, Any] = {"name": name}
        if entry.get("weight") is not None:
            w = _int(entry["weight"], f"{p}.weight")
            if w < 0:
                raise ConfigError(f"{p}.weight: Invalid value: {w}: must be non-negative")
            if enabled:
                item["weight"] = w
        out.append(item)
    return out


def _plugins(raw: Any, path: str) -> dict[str, dict[str, list[dict]]]:
    obj = _mapping(raw, path)
    _strict(obj, frozenset(PLUGIN_POINTS), path)
    out: dict[str, dict[str, list[dict]]] = {}
    for ep in PLUGIN_POINTS:
        if obj.get(ep) is None:
            continue
        sp = f"{path}.{ep}"
        ps = _mapping(obj[ep], sp)
        _strict(ps, frozenset({"enabled", "disabled"}), sp)
        out[ep] = {
            "enabled": _plugin_list(ps.get("enabled"), f"{sp}.enabled", enabled=True),
            "disabled": _plugin_list(ps.get("disabled"), f"{sp}.disabled", enabled=False),
        }
    return out


def _plugin_config(raw: Any, path: str, registry: Mapping[str, type[Plugin]], profile: str) -> list[dict]:
    out: list[dict] = []
    seen: set[str] = set()
    for i, entry in enumerate(_list(raw, path)):
        p = f"{path}[{i}]"
        entry = _mapping(entry, p)
        _strict(entry, frozenset({"name", "args"}), p)
        if entry.get("name") in (None, ""):
            raise ConfigError(f"{p}.name: Required value")
        name = _str(entry["name"], f"{p}.name")
        if name in seen:
            raise ConfigError(f'{p}.name: Duplicate value: "{name}" (repeated config for plugin {name})')
        seen.add(name)
        if name not in registry and name not in UPSTREAM_PLUGINS:
            raise ConfigError(f'unknown plugin "{name}" in profile "{profile}" at {p.split(".", 1)[1]}')
        args = dict(_mapping(entry.get("args"), f"{p}.args"))
        want_kind = f"{name}Args"
        kind = args.pop("kind", None)
        api_version = args.pop("apiVersion", None)
        if kind is not None and kind != want_kind:
            raise ConfigError(f'{p}.args.kind: Invalid value: "{kind}": expected "{want_kind}"')
        if api_version is not None and api_version != API_VERSION:
            raise ConfigError(f'{p}.args.apiVersion: Invalid value: "{api_version}": expected "{API_VERSION}"')
        allowed = _ARGS_FIELDS.get(name)
        if allowed is not None:
            _strict(args, allowed, f"{p}.args")
        cls = registry.get(name)
        validate = getattr(cls, "validate_args", None) if cls is not None else None
        if callable(validate):
            try:
                validate(args)
            except (ValueError, TypeError) as e:
                raise ConfigError(f"{p}.args: invalid args for plugin {name}: {e}") from None
        out.append({"name": name, "args": args})
    return out


def _check_plugin_names(
    plugins: Mapping[str, Mapping[str, list[dict]]], registry: Mapping[str, type[Plugin]], profile: str
) -> None:
    for ep, ps in plugins.items():
        for i, p in enumerate(ps["enabled"]):
            where = f"plugins.{ep}.enabled[{i}]"
            cls = registry.get(p["name"])
            if cls is None:
                extra = " (not implemented)" if p["name"] in UPSTREAM_PLUGINS else ""
                raise ConfigError(f'unknown plugin "{p["name"]}"{extra} in profile "{profile}" at {where}')
            if ep != "multiPoint" and not implements(cls, EXTENSION_METHODS[ep]):
                raise ConfigError(f'plugin "{p["name"]}" does not extend {ep} plugin '
                                  f'in profile "{profile}" at {where}')
        for i, p in enumerate(ps["disabled"]):
            name = p["name"]
            if name != "*" and name not in registry and name not in UPSTREAM_PLUGINS:
                raise ConfigError(f'unknown plugin "{name}" in profile "{profile}" at plugins.{ep}.disabled[{i}]')


def expand_plugins(
    registry: Mapping[str, type[Plugin]], plugins: Mapping[str, Any] | None
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Enabled plugin names per extension point and score weights, as the framework builds them.

    Defaults (MultiPoint) are merged first; a plugin listed explicitly at a
    point runs before MultiPoint ones, ``*`` or a name in a point's
    ``disabled`` removes MultiPoint plugins there. Raises ``ValueError``.
    """
    merged = merge_profile_plugins(plugins, default_multi_point(registry))
    multi = merged["multiPoint"]["enabled"]
    enabled: dict[str, list[str]] = {}
    weights: dict[str, int] = {}
    for ep in EXTENSION_POINTS:
        method = EXTENSION_METHODS[ep]
        explicit: list[str] = []
        for p in merged[ep]["enabled"]:
            if p["name"] in explicit:
                raise ValueError(f'plugin "{p["name"]}" already registered as "{ep}"')
            explicit.append(p["name"])
            if ep == "score":
                weights[p["name"]] = int(p.get("weight") or 1)
        disabled = {p["name"] for p in merged[ep]["disabled"]}
        if "*" in disabled:
            enabled[ep] = explicit
            continue
        overrides: list[str] = []
        from_multi: list[str] = []
        for p in multi:
            name = p["name"]
            cls = registry.get(name)
            if cls is None:
                raise ValueError(f'plugin "{name}" does not exist')
            if not implements(cls, method) or name in disabled:
                continue
            if name in explicit:
                overrides.append(name)
                continue
            if name in from_multi:
                raise ValueError(f'plugin "{name}" already registered as "{ep}"')
            from_multi.append(name)
            if ep == "score" and name not in weights:
                weights[name] = int(p.get("weight") or 1)
        enabled[ep] = overrides + from_multi + [n for n in explicit if n not in overrides]
    return enabled, weights


def _profile(
    raw: Any, i: int, registry: Mapping[str, type[Plugin]], single: bool
) -> SchedulerProfile:
    path = f"profiles[{i}]"
    obj = _mapping(raw, path)
    _strict(obj, _PROFILE_FIELDS, path)
    name = obj.get("schedulerName")
    if name is None or name == "":
        if not single:
            raise ConfigError(f"{path}.schedulerName: Required value")
        name = DEFAULT_SCHEDULER_NAME
    name = _str(name, f"{path}.schedulerName")
    pct = _opt_int(obj, "percentageOfNodesToScore", f"{path}.percentageOfNodesToScore")
    _percentage(pct, f"{path}.percentageOfNodesToScore")
    plugins = _plugins(obj.get("plugins"), f"{path}.plugins")
    _check_plugin_names(plugins, registry, name)
    plugin_config = _plugin_config(obj.get("pluginConfig"), f"{path}.pluginConfig", registry, name)
    try:
        enabled, weights = expand_plugins(registry, plugins)
    except ValueError as e:
        raise ConfigError(f'{path}.plugins: profile "{name}": {e}') from None
    if len(enabled["queueSort"]) != 1:
        what = "no queue sort plugin is enabled" if not enabled["queueSort"] else \
            f"only one queue sort plugin can be enabled, got {enabled['queueSort']}"
        raise ConfigError(f'{path}.plugins.queueSort: profile "{name}": {what}')
    if not enabled["bind"]:
        raise ConfigError(f'{path}.plugins.bind: profile "{name}": at least one bind plugin is needed')
    total = sum(weights.get(n, 1) for n in enabled["score"])
    if total * 100 > 2**63 - 1:
        raise ConfigError(f'{path}.plugins.score: profile "{name}": total score of Score plugins could overflow')
    return SchedulerProfile(name, pct, plugins, plugin_config, enabled, weights)


# --------------------------------------------------------------------------- entry points


def parse_config(
    data: Mapping[str, Any] | str | bytes, registry: Mapping[str, type[Plugin]], *, source: str = "configuration"
) -> SchedulerConfig:
    """Decode, default and validate a KubeSchedulerConfiguration (YAML/JSON text or a parsed dict)."""
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    obj = _load_yaml(data, source) if isinstance(data, str) else data
    if obj is None:
        raise ConfigError(f"{source} is empty: expected a {KIND} object")
    if not isinstance(obj, dict):
        raise ConfigError(f"{source}: expected a {KIND} object, got {_type_name(obj)}")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not api_version or not kind:
        raise ConfigError(f'{source}: apiVersion and kind are required (apiVersion: {API_VERSION}, kind: {KIND})')
    if kind != KIND:
        raise ConfigError(f'{source}: unsupported kind "{kind}": expected "{KIND}"')
    if api_version != API_VERSION:
        if isinstance(api_version, str) and api_version.startswith(API_GROUP + "/"):
            raise ConfigError(f'{source}: apiVersion "{api_version}" is no longer served; '
                              f'only "{API_VERSION}" is supported')
        raise ConfigError(f'{source}: unsupported apiVersion "{api_version}": expected "{API_VERSION}"')
    _strict(obj, _TOP_FIELDS, "")

    cfg = SchedulerConfig()
    if obj.get("parallelism") is not None:
        cfg.parallelism = _int(obj["parallelism"], "parallelism")
        if cfg.parallelism <= 0:
            raise ConfigError(f"parallelism: Invalid value: {cfg.parallelism}: "
                              "should be an integer value greater than zero")
    pct = _opt_int(obj, "percentageOfNodesToScore", "percentageOfNodesToScore")
    _percentage(pct, "percentageOfNodesToScore")
    cfg.percentage_of_nodes_to_score = pct or 0
    init = _opt_int(obj, "podInitialBackoffSeconds", "podInitialBackoffSeconds")
    if init is not None:
        if init <= 0:
            raise ConfigError(f"podInitialBackoffSeconds: Invalid value: {init}: must be greater than 0")
        cfg.pod_initial_backoff_seconds = init
    mx = _opt_int(obj, "podMaxBackoffSeconds", "podMaxBackoffSeconds")
    if mx is not None:
        cfg.pod_max_backoff_seconds = mx
    if cfg.pod_max_backoff_seconds < cfg.pod_initial_backoff_seconds:
        raise ConfigError(f"podMaxBackoffSeconds: Invalid value: {cfg.pod_max_backoff_seconds}: "
                          "must be greater than or equal to podInitialBackoffSeconds")
    for key, attr in (("enableProfiling", "enable_profiling"),
                      ("enableContentionProfiling", "enable_contention_profiling"),
                      ("delayCacheUntilActive", "delay_cache_until_active")):
        if obj.get(key) is not None:
            setattr(cfg, attr, _bool(obj[key], key))
    cfg.leader_election = _leader_election(obj.get("leaderElection"))
    cfg.client_connection = _client_connection(obj.get("clientConnection"))
    extenders = _list(obj.get("extenders"), "extenders")
    if extenders:
        raise ConfigError("extenders: extenders are not supported by this scheduler; remove the extenders list")

    raw_profiles = _list(obj.get("profiles"), "profiles") or [{}]
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_profiles):
        prof = _profile(raw, i, registry, single=len(raw_profiles) == 1)
        if prof.scheduler_name in seen:
            raise ConfigError(f'profiles[{i}].schedulerName: Duplicate value: "{prof.scheduler_name}"')
        seen[prof.scheduler_name] = i
        cfg.profiles.append(prof)
    _check_queue_sort(cfg.profiles)
    return cfg


def _check_queue_sort(profiles: list[SchedulerProfile]) -> None:
    if len(profiles) < 2:
        return
    first = profiles[0]
    qs = first.enabled["queueSort"]
    args = first.plugin_args(qs[0]) or {}
    for i, p in enumerate(profiles[1:], start=1):
        if p.enabled["queueSort"] != qs:
            raise ConfigError(f"profiles[{i}].plugins.queueSort: Invalid value: {p.enabled['queueSort']}: "
                              f"queueSort must be the same for all profiles (profiles[0] uses {qs})")
        if (p.plugin_args(qs[0]) or {}) != args:
            raise ConfigError(f'profiles[{i}].pluginConfig: Invalid value: args of queueSort plugin "{qs[0]}" '
                              "must be the same for all profiles")


def load_config(path: str | None, registry: Mapping[str, type[Plugin]]) -> SchedulerConfig:
    """Read ``path`` (or return the defaults, one ``default-scheduler`` profile, when None)."""
    if path is None:
        return parse_config({"apiVersion": API_VERSION, "kind": KIND}, registry)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read scheduler configuration {path}: {e.strerror or e}") from None
    return parse_config(text, registry, source=path)


_GO_NAMES = {"qps": "QPS", "apiVersion": "APIVersion", "kubeconfig": "Kubeconfig"}


def _go_name(key: str) -> str:
    return _GO_NAMES.get(key) or (key[:1].upper() + key[1:])


def _go_fields(value: Any) -> Any:
    """A versioned (camelCase) value with the field names of its Go type."""
    if isinstance(value, dict):
        return {_go_name(k): _go_fields(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_fields(v) for v in value]
    return value


def componentconfig(cfg: SchedulerConfig) -> dict[str, Any]:
    """The effective configuration as kube-scheduler's ``/configz`` shows it:
    the defaulted, validated internal KubeSchedulerConfiguration, whose Go
    fields carry no JSON names (``Parallelism``, ``LeaderElection``, durations
    as Go prints them), with each profile's plugins as they run at each
    extension point (score plugins with their weights)."""
    le, cc = cfg.leader_election, cfg.client_connection
    profiles = []
    for p in cfg.profiles:
        plugins: dict[str, Any] = {}
        for point, names in p.enabled.items():
            plugins[_go_name(point)] = {
                "Enabled": [{"Name": n, "Weight": p.score_weights.get(n, 1) if point == "score" else 0}
                            for n in names],
                "Disabled": None,
            }
        profiles.append({
            "SchedulerName": p.scheduler_name,
            "PercentageOfNodesToScore": p.percentage_of_nodes_to_score,
            "Plugins": plugins,
            "PluginConfig": [{"Name": pc["name"], "Args": _go_fields(dict(pc["args"]))} for pc in p.plugin_config],
        })
    return {
        "Parallelism": cfg.parallelism,
        "LeaderElection": {
            "LeaderElect": le.leader_elect,
            "LeaseDuration": go_duration(le.lease_duration),
            "RenewDeadline": go_duration(le.renew_deadline),
            "RetryPeriod": go_duration(le.retry_period),
            "ResourceLock": le.resource_lock,
            "ResourceName": le.resource_name,
            "ResourceNamespace": le.resource_namespace,
        },
        "ClientConnection": {
            "Kubeconfig": cc.kubeconfig,
            "AcceptContentTypes": cc.accept_content_types,
            "ContentType": cc.content_type,
            "QPS": cc.qps,
            "Burst": cc.burst,
        },
        "HealthzBindAddress": "",
        "MetricsBindAddress": "",
        "EnableProfiling": cfg.enable_profiling,
        "EnableContentionProfiling": cfg.enable_contention_profiling,
        "PercentageOfNodesToScore": cfg.percentage_of_nodes_to_score,
        "PodInitialBackoffSeconds": cfg.pod_initial_backoff_seconds,
        "PodMaxBackoffSeconds": cfg.pod_max_backoff_seconds,
        "Profiles": profiles,
        "Extenders": None,
        "DelayCacheUntilActive": cfg.delay_cache_until_active,
    }


__all__ = [
    "API_VERSION", "ClientConnectionConfig", "ConfigError", "DEFAULT_SCHEDULER_NAME", "KIND",
    "LeaderElectionConfig", "SchedulerConfig", "SchedulerProfile", "expand_plugins", "load_config",
    "componentconfig", "go_duration", "parse_config", "parse_duration",
]
