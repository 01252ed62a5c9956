"""KubeSchedulerConfiguration loading: defaults, merging, strict validation, error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane.scheduler.config import (
    ConfigError, SchedulerConfig, expand_plugins, load_config, parse_config, parse_duration,
)
from kubeplane.scheduler.plugins.registry import DEFAULT_PLUGINS, in_tree_registry
from kubeplane.scheduler.framework.runtime import Framework

REG = in_tree_registry()
HEAD = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"

REALISTIC = HEAD + """\
parallelism: 8
percentageOfNodesToScore: 40
podInitialBackoffSeconds: 2
podMaxBackoffSeconds: 20
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
  qps: 100
  burst: 200
leaderElection:
  leaderElect: true
  leaseDuration: 1m30s
  renewDeadline: 45s
  retryPeriod: 5s
  resourceNamespace: kube-system
  resourceName: my-scheduler
profiles:
  - schedulerName: default-scheduler
    plugins:
      score:
        enabled:
          - name: NodeResourcesBalancedAllocation
            weight: 5
        disabled:
          - name: ImageLocality
  - schedulerName: bin-packing
    percentageOfNodesToScore: 100
    plugins:
      multiPoint:
        disabled:
          - name: NodeResourcesBalancedAllocation
    pluginConfig:
      - name: NodeResourcesFit
        args:
          apiVersion: kubescheduler.config.k8s.io/v1
          kind: NodeResourcesFitArgs
          scoringStrategy:
            type: MostAllocated
            resources:
              - name: cpu
                weight: 1
"""


def _nonempty(enabled: dict[str, list[str]]) -> dict[str, list[str]]:
    return {k: v for k, v in enabled.items() if v}


def _err(text: str, registry=None) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_config(text, REG if registry is None else registry)
    return str(ei.value)


#: a registry lacking one upstream plugin, to exercise the "not implemented" wording
WITHOUT_VOLUMEBINDING = {k: v for k, v in REG.items() if k != "VolumeBinding"}


def test_defaults_without_file() -> None:
    cfg = load_config(None, REG)
    assert isinstance(cfg, SchedulerConfig)
    assert cfg.scheduler_names() == ["default-scheduler"]
    assert (cfg.parallelism, cfg.percentage_of_nodes_to_score) == (16, 0)
    assert (cfg.pod_initial_backoff_seconds, cfg.pod_max_backoff_seconds) == (1, 10)
    le = cfg.leader_election
    assert (le.leader_elect, le.lease_duration, le.renew_deadline, le.retry_period) == (True, 15, 10, 2)
    assert (le.resource_lock, le.resource_name, le.resource_namespace) == ("leases", "kube-scheduler", "kube-system")
    prof = cfg.profiles[0]
    assert prof.framework_profile() == {"schedulerName": "default-scheduler", "plugins": {}, "pluginConfig": []}
    fw = Framework(REG, prof.framework_profile())
    assert fw.list_plugins() == _nonempty(prof.enabled)
    expected = {"TaintToleration": 3, "NodeAffinity": 2, "NodeResourcesFit": 1,
                "NodeResourcesBalancedAllocation": 1, "ImageLocality": 1}
    assert {k: prof.score_weights[k] for k in expected} == expected
    # defaults follow upstream's MultiPoint order
    assert prof.enabled["score"] == [n for n, _ in DEFAULT_PLUGINS if n in prof.enabled["score"]]
    assert prof.enabled["queueSort"] == ["PrioritySort"] and prof.enabled["bind"] == ["DefaultBinder"]


def test_realistic_file(tmp_path: Path) -> None:
    path = tmp_path / "sched.yaml"
    path.write_text(REALISTIC)
    cfg = load_config(str(path), REG)
    assert (cfg.parallelism, cfg.percentage_of_nodes_to_score) == (8, 40)
    assert (cfg.pod_initial_backoff_seconds, cfg.pod_max_backoff_seconds) == (2, 20)
    assert cfg.client_connection.kubeconfig == "/etc/kubernetes/scheduler.conf" and cfg.client_connection.burst == 200
    le = cfg.leader_election
    assert (le.lease_duration, le.renew_deadline, le.retry_period, le.resource_name) == (90, 45, 5, "my-scheduler")
    assert cfg.scheduler_names() == ["default-scheduler", "bin-packing"]

    default = cfg.profile("default-scheduler")
    assert default is not None
    assert "ImageLocality" not in default.enabled["score"]
    assert default.score_weights["NodeResourcesBalancedAllocation"] == 5
    # a plugin named at a specific point runs before the MultiPoint ones there, once
    assert default.enabled["score"][0] == "NodeResourcesBalancedAllocation"
    assert default.enabled["score"].count("NodeResourcesBalancedAllocation") == 1
    assert default.enabled["score"][1:4] == ["TaintToleration", "NodeAffinity", "NodeResourcesFit"]

    packing = cfg.profile("bin-packing")
    assert packing is not None and packing.percentage_of_nodes_to_score == 100
    assert "NodeResourcesBalancedAllocation" not in packing.enabled["score"]
    assert packing.plugin_args("NodeResourcesFit") == {
        "scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu", "weight": 1}]}}

    for prof in cfg.profiles:
        fw = Framework(REG, prof.framework_profile())
        assert fw.list_plugins() == _nonempty(prof.enabled)
        assert fw.score_weights == prof.score_weights
        assert fw.profile_name == prof.scheduler_name
    fit = Framework(REG, packing.framework_profile()).plugins["NodeResourcesFit"]
    assert fit.strategy == "MostAllocated"
    assert cfg.framework_profiles()[1]["percentageOfNodesToScore"] == 100


def test_star_disable_per_point_and_multipoint() -> None:
    cfg = parse_config(HEAD + """\
profiles:
- plugins:
    score:
      disabled: [{name: "*"}]
      enabled: [{name: ImageLocality, weight: 7}]
    filter:
      disabled: [{name: "*"}]
      enabled: [{name: NodeName}, {name: NodeUnschedulable}]
""", REG)
    prof = cfg.profiles[0]
    assert prof.enabled["score"] == ["ImageLocality"]
    assert prof.score_weights == {"ImageLocality": 7}
    assert prof.enabled["filter"] == ["NodeName", "NodeUnschedulable"]
    # the other points keep the defaults
    assert "NodeResourcesFit" in prof.enabled["preFilter"]

    cfg = parse_config(HEAD + """\
profiles:
- plugins:
    multiPoint:
      disabled: [{name: "*"}]
      enabled: [{name: PrioritySort}, {name: DefaultBinder}, {name: NodeName}]
""", REG)
    assert _nonempty(cfg.profiles[0].enabled) == {
        "queueSort": ["PrioritySort"], "filter": ["NodeName"], "bind": ["DefaultBinder"]}


def test_explicit_point_runs_before_multipoint() -> None:
    enabled, _ = expand_plugins(REG, {"filter": {"enabled": [{"name": "NodePorts"}]}})
    assert enabled["filter"][0] == "NodePorts"
    assert enabled["filter"].count("NodePorts") == 1


def test_unknown_plugin_names_location() -> None:
    msg = _err(HEAD + "profiles:\n- plugins:\n    filter:\n      enabled:\n      - name: Foo\n")
    assert msg == 'unknown plugin "Foo" in profile "default-scheduler" at plugins.filter.enabled[0]'
    msg = _err(HEAD + "profiles:\n- schedulerName: a\n  plugins:\n    multiPoint:\n      enabled:\n"
               "      - name: NodeName\n      - name: VolumeBinding\n- schedulerName: b\n", WITHOUT_VOLUMEBINDING)
    assert msg == 'unknown plugin "VolumeBinding" (not implemented) in profile "a" at plugins.multiPoint.enabled[1]'
    msg = _err(HEAD + "profiles:\n- pluginConfig:\n  - name: Bar\n    args: {}\n")
    assert msg == 'unknown plugin "Bar" in profile "default-scheduler" at pluginConfig[0]'
    msg = _err(HEAD + "profiles:\n- plugins:\n    score:\n      disabled: [{name: Typo}]\n")
    assert 'unknown plugin "Typo"' in msg and "plugins.score.disabled[0]" in msg


def test_upstream_plugins_not_implemented_may_be_disabled_and_configured() -> None:
    cfg = parse_config(HEAD + """\
profiles:
- plugins:
    multiPoint:
      disabled: [{name: VolumeBinding}, {name: PodTopologySpread}]
  pluginConfig:
  - name: PodTopologySpread
    args: {defaultingType: List, defaultConstraints: []}
""", REG)
    assert cfg.profiles[0].plugin_args("PodTopologySpread") == {"defaultingType": "List", "defaultConstraints": []}


def test_plugin_not_extending_point() -> None:
    msg = _err(HEAD + "profiles:\n- plugins:\n    score:\n      enabled: [{name: NodeName}]\n")
    assert msg == 'plugin "NodeName" does not extend score plugin in profile "default-scheduler" at plugins.score.enabled[0]'


def test_unknown_fields_are_errors() -> None:
    assert _err(HEAD + "profiles:\n- plugin: {}\n") == 'unknown field "profiles[0].plugin"'
    assert _err(HEAD + "paralelism: 3\n") == 'unknown field "paralelism"'
    assert _err(HEAD + "leaderElection:\n  leaseDurationSeconds: 3\n") == \
        'unknown field "leaderElection.leaseDurationSeconds"'
    assert _err(HEAD + "profiles:\n- plugins:\n    filters: {}\n") == 'unknown field "profiles[0].plugins.filters"'
    assert _err(HEAD + "profiles:\n- plugins:\n    filter:\n      enable: []\n") == \
        'unknown field "profiles[0].plugins.filter.enable"'
    assert _err(HEAD + "profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoring: {}\n") == \
        'unknown field "profiles[0].pluginConfig[0].args.scoring"'


def test_malformed_yaml_reports_line() -> None:
    msg = _err(HEAD + "profiles:\n  - schedulerName: a\n   plugins: {}\n")
    assert "malformed YAML" in msg and "line 5" in msg
    msg = _err(HEAD + "parallelism: 2\nparallelism: 3\n")
    assert msg == 'malformed configuration: duplicate field "parallelism" at line 4'
    assert "expected a KubeSchedulerConfiguration object" in _err("- a\n- b\n")
    assert "is empty" in _err("")


def test_api_version_and_kind() -> None:
    msg = _err("apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n")
    assert 'apiVersion "kubescheduler.config.k8s.io/v1beta3" is no longer served' in msg
    assert 'unsupported apiVersion "v1"' in _err("apiVersion: v1\nkind: KubeSchedulerConfiguration\n")
    assert 'unsupported kind "KubeProxyConfiguration"' in _err(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeProxyConfiguration\n")
    assert "apiVersion and kind are required" in _err("parallelism: 3\n")


def test_bad_types_and_values() -> None:
    assert _err(HEAD + "parallelism: many\n") == "parallelism: expected integer, got string 'many'"
    assert _err(HEAD + "parallelism: 0\n").startswith("parallelism: Invalid value: 0")
    assert _err(HEAD + "profiles: {}\n") == "profiles: expected array, got object {}"
    assert _err(HEAD + "leaderElection:\n  leaderElect: yes please\n") == \
        "leaderElection.leaderElect: expected boolean, got string 'yes please'"
    assert "not in valid range [0-100]" in _err(HEAD + "percentageOfNodesToScore: 101\n")
    assert "profiles[0].percentageOfNodesToScore" in _err(HEAD + "profiles:\n- percentageOfNodesToScore: -1\n")
    assert _err(HEAD + "podInitialBackoffSeconds: 0\n").startswith("podInitialBackoffSeconds: Invalid value: 0")
    assert "must be greater than or equal to podInitialBackoffSeconds" in _err(
        HEAD + "podInitialBackoffSeconds: 5\npodMaxBackoffSeconds: 4\n")
    assert "weight: Invalid value: -1" in _err(
        HEAD + "profiles:\n- plugins:\n    score:\n      enabled: [{name: ImageLocality, weight: -1}]\n")


def test_profiles_names() -> None:
    assert _err(HEAD + "profiles:\n- schedulerName: a\n- schedulerName: a\n") == \
        'profiles[1].schedulerName: Duplicate value: "a"'
    assert _err(HEAD + "profiles:\n- schedulerName: a\n- {}\n") == "profiles[1].schedulerName: Required value"
    assert parse_config(HEAD + "profiles: []\n", REG).scheduler_names() == ["default-scheduler"]


def test_queue_sort_must_match_across_profiles() -> None:
    msg = _err(HEAD + """\
profiles:
- schedulerName: a
- schedulerName: b
  plugins:
    queueSort:
      disabled: [{name: "*"}]
""")
    assert msg.startswith("profiles[1].plugins.queueSort:") and "no queue sort plugin" in msg
    msg = _err(HEAD + """\
profiles:
- schedulerName: a
- schedulerName: b
  pluginConfig:
  - name: PrioritySort
    args: {foo: 1}
""")
    assert msg == 'profiles[1].pluginConfig: Invalid value: args of queueSort plugin "PrioritySort" must be the ' \
        "same for all profiles"
    # identical (empty) args are fine
    cfg = parse_config(HEAD + "profiles:\n- schedulerName: a\n- schedulerName: b\n  pluginConfig:\n"
                       "  - name: PrioritySort\n    args: {}\n", REG)
    assert cfg.scheduler_names() == ["a", "b"]


def test_queue_sort_plugin_must_match() -> None:
    class OtherSort(REG["PrioritySort"]):  # type: ignore[misc,valid-type]
        name = "OtherSort"

    reg = REG.copy()
    reg.register(OtherSort)
    text = HEAD + """\
profiles:
- schedulerName: a
- schedulerName: b
  plugins:
    queueSort:
      disabled: [{name: "*"}]
      enabled: [{name: OtherSort}]
"""
    with pytest.raises(ConfigError) as ei:
        parse_config(text, reg)
    assert str(ei.value).startswith("profiles[1].plugins.queueSort: Invalid value: ['OtherSort']")
    assert "must be the same for all profiles" in str(ei.value)


def test_extenders() -> None:
    assert _err(HEAD + "extenders:\n- urlPrefix: http://x\n").startswith("extenders: extenders are not supported")
    assert parse_config(HEAD + "extenders: []\n", REG).scheduler_names() == ["default-scheduler"]


def test_leader_election_validation() -> None:
    assert "LeaseDuration must be greater than RenewDeadline" in _err(
        HEAD + "leaderElection:\n  leaseDuration: 10s\n")
    assert 'Unsupported value: "endpoints"' in _err(HEAD + "leaderElection:\n  resourceLock: endpoints\n")
    assert _err(HEAD + "leaderElection:\n  leaseDuration: 15\n") == \
        "leaderElection.leaseDuration: duration must be a string like \"15s\", got 15"
    assert "invalid duration '15 seconds'" in _err(HEAD + "leaderElection:\n  leaseDuration: 15 seconds\n")
    # invalid timings are fine when leader election is off
    cfg = parse_config(HEAD + "leaderElection:\n  leaderElect: false\n  leaseDuration: 1s\n", REG)
    assert cfg.leader_election.leader_elect is False and cfg.leader_election.lease_duration == 1


@pytest.mark.parametrize(("text", "seconds"), [
    ("15s", 15), ("1m30s", 90), ("2h45m", 9900), ("500ms", 0.5), ("1.5h", 5400), ("0", 0), ("100us", 1e-4),
    ("-2s", -2),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15", "s", "1x", "1m 30s", "1.2.3s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read scheduler configuration"):
        load_config(str(tmp_path / "nope.yaml"), REG)


def test_plugin_config_args_checks() -> None:
    assert 'expected "NodeResourcesFitArgs"' in _err(
        HEAD + "profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args: {kind: NodeAffinityArgs}\n")
    assert "Duplicate value" in _err(
        HEAD + "profiles:\n- pluginConfig:\n  - name: NodeAffinity\n  - name: NodeAffinity\n")
    cfg = parse_config(HEAD + "profiles:\n- pluginConfig:\n  - name: NodeAffinity\n", REG)
    assert cfg.profiles[0].plugin_args("NodeAffinity") == {}


def test_accepts_dict_and_json() -> None:
    data = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "profiles": [{"schedulerName": "x"}]}
    assert parse_config(data, REG).scheduler_names() == ["x"]
    js = '{"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration", "parallelism": 4}'
    assert parse_config(js, REG).parallelism == 4
