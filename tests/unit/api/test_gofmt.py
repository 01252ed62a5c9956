"""Values printed as Go prints them."""

from __future__ import annotations

import pytest

from kubeplane.api.gofmt import format_pod, go_duration, go_duration_ns, go_list, go_quote, grpc_code_name


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (1, "1s"), (10.0, "10s"), (15, "15s"), (1.5, "1.5s"), (60, "1m0s"), (80, "1m20s"),
    (90, "1m30s"), (300, "5m0s"), (900, "15m0s"), (3600, "1h0m0s"), (3661, "1h1m1s"), (0.5, "500ms"),
    (0.25, "250ms"), (0.0005, "500\u00b5s"), (1e-9, "1ns"), (-2.5, "-2.5s"),
])
def test_go_duration(seconds, text):
    assert go_duration(seconds) == text


def test_go_duration_ns():
    assert go_duration_ns(0) == "0s"
    assert go_duration_ns(90 * 10**9) == "1m30s"
    assert go_duration_ns(1_500_000) == "1.5ms"
    assert go_duration_ns(-2_500_000_000) == "-2.5s"
    assert go_duration_ns(3723_500_000_000) == "1h2m3.5s"


def test_go_quote():
    assert go_quote('a"b\n\x01') == '"a\\"b\\n\\x01"'
    assert go_quote('a"b\\c\n\t\x01é') == '"a\\"b\\\\c\\n\\t\\x01é"'
    assert go_quote("\u00a0\U0001d400\u200b") == '"\\u00a0\U0001d400\\u200b"'


def test_go_list_grpc_codes_and_pods():
    assert go_list(["a", "b"]) == "[a b]" and go_list([]) == "[]"
    assert grpc_code_name("NOT_FOUND") == "NotFound"
    assert grpc_code_name("CANCELLED") == "Canceled" and grpc_code_name("OK") == "OK"
    assert format_pod({"metadata": {"name": "p", "namespace": "n", "uid": "u"}}) == "p_n(u)"
