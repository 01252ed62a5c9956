"""--service-cluster-ip-range, --service-node-port-range and --advertise-address
are checked before anything starts (usage error, exit 2), on apiserver and up."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kubeplane.cli.main import main


@pytest.mark.parametrize("command", ["apiserver", "up"])
@pytest.mark.parametrize("flag, value, message", [
    ("--service-cluster-ip-range", "10.0.0.0/8",
     "specified --service-cluster-ip-range is too large; for 32-bit addresses, the mask must be >= 12"),
    ("--service-cluster-ip-range", "ten", "'ten' is not a valid CIDR"),
    ("--service-node-port-range", "32767-30000", "end port is less than start port: 32767-30000"),
    ("--advertise-address", "127.0.0.1", "cannot be advertised"),
    ("--advertise-address", "host", "'host' is not an IP address"),
])
def test_bad_values_are_usage_errors(tmp_path, command: str, flag: str, value: str, message: str) -> None:
    res = CliRunner().invoke(main, [command, "--data-dir", str(tmp_path), "--storage", "memory", flag, value])
    assert res.exit_code == 2, res.output
    assert message in res.output
