"""The serving-limit flags of `apiserver` and `up` reach the server's limits."""

from __future__ import annotations

import click
from click.testing import CliRunner

from kubeplane.apiserver.serving import ServingLimits
from kubeplane.cli import main as cli


def limits_for(args: list[str]) -> ServingLimits | str:
    seen: list[ServingLimits] = []

    @click.command()
    @cli.server_options
    def probe(**_kw) -> None:
        seen.append(cli._serving_limits())

    result = CliRunner().invoke(probe, args)
    if result.exit_code != 0:
        return result.output
    return seen[0]


def test_defaults_are_upstreams():
    assert limits_for([]) == ServingLimits(max_requests_inflight=400, max_mutating_requests_inflight=200,
                                           request_timeout=60.0, min_request_timeout=1800.0,
                                           header_timeout=32.0, idle_timeout=90.0, max_header_bytes=1 << 20)


def test_flags_set_the_limits():
    got = limits_for(["--max-requests-inflight", "7", "--max-mutating-requests-inflight", "3",
                      "--request-timeout", "1m30s", "--min-request-timeout", "60",
                      "--header-timeout", "2s", "--idle-timeout", "500ms"])
    assert got == ServingLimits(max_requests_inflight=7, max_mutating_requests_inflight=3, request_timeout=90.0,
                                min_request_timeout=60.0, header_timeout=2.0, idle_timeout=0.5)


def test_bad_values_are_refused():
    assert "invalid duration" in limits_for(["--request-timeout", "soon"])
    assert "must not be negative" in limits_for(["--request-timeout", "-1s"])
    assert "Invalid value" in limits_for(["--max-requests-inflight", "-1"])


def test_both_commands_take_them():
    for command in ("apiserver", "up"):
        out = CliRunner().invoke(cli.main, [command, "--help"]).output
        for flag in ("--max-requests-inflight", "--max-mutating-requests-inflight", "--request-timeout",
                     "--min-request-timeout"):
            assert flag in out, (command, flag)
