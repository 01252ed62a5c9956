"""kube-controller-manager's --horizontal-pod-autoscaler-* flags: Go durations
and a tolerance, refused clearly when wrong, handed to the controller (and to
the components process of ``up --split``)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from kubeplane.cli.main import _controller_flag_argv, _controller_flag_options, _controller_flag_values
from kubeplane.cluster import CONTROLLERS, ControllerOptions

HPA = ("hpa_sync_period", "hpa_downscale_stabilization", "hpa_cpu_initialization_period",
       "hpa_initial_readiness_delay", "hpa_tolerance")


@click.command()
@_controller_flag_options
def probe() -> None:
    values = _controller_flag_values()
    click.echo(json.dumps({k: v for k, v in values.items() if k in HPA}, sort_keys=True))
    click.echo(json.dumps([a for a in _controller_flag_argv()]))


def test_defaults_are_upstreams() -> None:
    out = CliRunner().invoke(probe, []).output.splitlines()[0]
    assert json.loads(out) == {
        "hpa_sync_period": 15.0, "hpa_downscale_stabilization": 300.0, "hpa_cpu_initialization_period": 300.0,
        "hpa_initial_readiness_delay": 30.0, "hpa_tolerance": 0.1}


def test_durations_are_parsed_and_passed_on() -> None:
    res = CliRunner().invoke(probe, ["--horizontal-pod-autoscaler-sync-period=1m30s",
                                     "--horizontal-pod-autoscaler-tolerance", "0.25"])
    assert res.exit_code == 0
    first, argv_line = res.output.splitlines()
    options = json.loads(first)
    assert options["hpa_sync_period"] == 90.0 and options["hpa_tolerance"] == 0.25
    argv = json.loads(argv_line)
    pairs = list(zip(argv[::2], argv[1::2]))
    assert ("--horizontal-pod-autoscaler-sync-period", "90s") in pairs
    assert ("--horizontal-pod-autoscaler-tolerance", "0.25") in pairs
    # what the components process of `up --split` is given reads back the same
    again = CliRunner().invoke(probe, argv)
    assert json.loads(again.output.splitlines()[0]) == options


@pytest.mark.parametrize("args, message", [
    (["--horizontal-pod-autoscaler-sync-period=fast"], 'time: invalid duration "fast"'),
    (["--horizontal-pod-autoscaler-sync-period=0s"], "must be greater than 0"),
    (["--horizontal-pod-autoscaler-downscale-stabilization=-1m"], "must not be negative, got -1m"),
    (["--horizontal-pod-autoscaler-tolerance=-0.1"], "-0.1 is not in the range x>=0"),
])
def test_wrong_values_are_usage_errors(args: list[str], message: str) -> None:
    res = CliRunner().invoke(probe, args)
    assert res.exit_code == 2
    assert message in res.output


def test_the_controller_gets_them() -> None:
    [definition] = [d for d in CONTROLLERS if d.name == "horizontal-pod-autoscaler-controller"]
    assert definition.aliases == ("horizontalpodautoscaling",)
    assert definition.account == "horizontal-pod-autoscaler"
    opts = ControllerOptions(hpa_sync_period=2.0, hpa_tolerance=0.2, hpa_downscale_stabilization=7.0)
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.registry.registry import Registry
    from kubeplane.storage.memory import MemoryStore

    client = InProcessClient(Registry(MemoryStore()))
    [ctrl] = definition.build(client, SharedInformerFactory(client), opts)
    assert (ctrl.sync_period, ctrl.tolerance, ctrl.downscale_stabilization) == (2.0, 0.2, 7.0)
