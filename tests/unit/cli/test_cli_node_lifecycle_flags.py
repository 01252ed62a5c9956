"""kube-controller-manager's node lifecycle and pod GC flags: parsed as Go
durations, handed to the controllers (and to the split child) as
ControllerOptions, bad values refused before anything starts."""

from __future__ import annotations

import json

import click
from click.testing import CliRunner

from kubeplane.cli.main import _controller_flag_argv, _controller_flag_options, _controller_flag_values
from kubeplane.cluster import ControllerOptions, build_selected
from kubeplane.client.informer import SharedInformerFactory


@click.command()
@_controller_flag_options
def probe() -> None:
    click.echo(json.dumps(_controller_flag_values(), sort_keys=True))
    click.echo(" ".join(_controller_flag_argv()))


def test_defaults_and_values():
    out = CliRunner().invoke(probe, []).output.splitlines()
    ours = ("node_monitor_grace_period", "node_startup_grace_period", "node_monitor_period",
            "terminated_pod_gc_threshold")
    assert {k: v for k, v in json.loads(out[0]).items() if k in ours} == {"node_monitor_grace_period": 50.0, "node_startup_grace_period": 60.0,
                                  "node_monitor_period": 5.0, "terminated_pod_gc_threshold": 12500}
    res = CliRunner().invoke(probe, ["--node-monitor-grace-period", "1m30s", "--terminated-pod-gc-threshold", "0"])
    assert res.exit_code == 0
    values = json.loads(res.output.splitlines()[0])
    assert values["node_monitor_grace_period"] == 90.0 and values["terminated_pod_gc_threshold"] == 0
    assert "--node-monitor-grace-period 90s" in res.output.splitlines()[1]


def test_bad_values_are_usage_errors():
    for args in (["--node-monitor-grace-period", "soon"], ["--node-monitor-period", "0s"],
                 ["--terminated-pod-gc-threshold", "-1"]):
        res = CliRunner().invoke(probe, args)
        assert res.exit_code == 2, args
        assert "Invalid value" in res.output


def test_options_reach_the_controllers():
    opts = ControllerOptions(node_monitor_grace_period=7.0, node_startup_grace_period=9.0, node_monitor_period=1.0,
                             terminated_pod_gc_threshold=3)
    factory = SharedInformerFactory(client=None)  # type: ignore[arg-type]
    built = dict((d.name, ctrls) for d, ctrls in build_selected(
        None, factory, opts, ["node-lifecycle-controller", "podgc", "taint-eviction-controller", "disruption"]))
    nlc = built["node-lifecycle-controller"][0]
    assert (nlc.monitor_grace, nlc.startup_grace, nlc.monitor_period) == (7.0, 9.0, 1.0)
    assert built["pod-garbage-collector-controller"][0].threshold == 3
    assert set(built) == {"node-lifecycle-controller", "pod-garbage-collector-controller",
                          "taint-eviction-controller", "disruption-controller"}
