"""The node IPAM flags: ``up`` allocates node pod CIDRs from 10.244.0.0/16 by
default, the ``controllers`` command (as kube-controller-manager) only when
told; ``--allocate-node-cidrs`` is a bool flag as upstream's (``=true``,
``=false``); what ``up`` hands its components process reads back the same;
without allocation ``up`` has no pod CIDR for a real node and says so."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from kubeplane.cli.main import (_UP_CONTROLLER_DEFAULTS, _controller_flag_argv, _controller_flag_options,
                                _controller_flag_values, _controllers_option, _node_cidrs_unassigned)

FIELDS = ("allocate_node_cidrs", "cluster_cidr")


def _probe(defaults=None):
    @click.command()
    @_controllers_option
    @_controller_flag_options(defaults=defaults)
    def probe(controller_selection) -> None:
        values = _controller_flag_values()
        click.echo(json.dumps({k: values[k] for k in FIELDS}))
        click.echo(json.dumps(_controller_flag_argv()))
        click.echo(json.dumps(_node_cidrs_unassigned(controller_selection)))

    return probe


def _run(probe, args):
    res = CliRunner().invoke(probe, args)
    assert res.exit_code == 0, res.output
    values, argv, why = res.output.splitlines()
    return json.loads(values), json.loads(argv), json.loads(why)


def test_up_allocates_from_10_244_by_default_upstream_does_not() -> None:
    values, argv, why = _run(_probe(_UP_CONTROLLER_DEFAULTS), [])
    assert values == {"allocate_node_cidrs": True, "cluster_cidr": "10.244.0.0/16"}
    assert why is None
    assert "--allocate-node-cidrs=true" in argv and argv[argv.index("--cluster-cidr") + 1] == "10.244.0.0/16"
    # the components process of `up --split` (upstream's defaults) is given the same
    assert _run(_probe(), argv)[0] == values

    values, argv, why = _run(_probe(), [])
    assert values == {"allocate_node_cidrs": False, "cluster_cidr": ""}
    assert "--allocate-node-cidrs=false" in argv
    assert why == ("no pod CIDR for it: the node IPAM controller assigns none without --allocate-node-cidrs and "
                   "--cluster-cidr")


@pytest.mark.parametrize("args, allocate", [
    (["--allocate-node-cidrs"], True), (["--allocate-node-cidrs=true"], True),
    (["--allocate-node-cidrs=false"], False), (["--allocate-node-cidrs", "--cluster-cidr", "10.9.0.0/16"], True),
])
def test_allocate_node_cidrs_is_a_bool_flag(args, allocate) -> None:
    assert _run(_probe(), args)[0]["allocate_node_cidrs"] is allocate


def test_up_without_allocation_or_without_the_controller_has_no_cidr_for_a_real_node() -> None:
    assert _run(_probe(_UP_CONTROLLER_DEFAULTS), ["--allocate-node-cidrs=false"])[2].startswith(
        "no pod CIDR for it: the node IPAM controller assigns none")
    assert _run(_probe(_UP_CONTROLLER_DEFAULTS), ["--controllers", "*,-nodeipam"])[2] == (
        "no pod CIDR for it: the node-ipam-controller is not enabled (--controllers)")
    assert _run(_probe(_UP_CONTROLLER_DEFAULTS), ["--cluster-cidr", "10.9.0.0/16"])[:3:2] == (
        {"allocate_node_cidrs": True, "cluster_cidr": "10.9.0.0/16"}, None)


def test_a_bad_cluster_cidr_is_a_usage_error() -> None:
    res = CliRunner().invoke(_probe(_UP_CONTROLLER_DEFAULTS), ["--cluster-cidr", "10.9.0.300/16"])
    assert res.exit_code == 2
    assert "--cluster-cidr" in res.output
