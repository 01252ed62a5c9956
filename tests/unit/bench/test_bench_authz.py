"""The authorization benchmark measures what it says: the ordinary user's
creates pass RBAC through the aggregated edit role (a refused create fails the run)."""

from __future__ import annotations

from kubeplane.bench import authz


def test_authz_benchmark_runs_all_three_cases() -> None:
    result = authz.run(runs=1, n=16, authorize_samples=200, progress=lambda _m: None)
    for key in ("creates_per_s_http_authz_always_allow", "creates_per_s_http_rbac_masters",
                "creates_per_s_http_rbac_user"):
        assert result[key] > 0 and len(result[key + "_runs"]) == 1
    assert 0 < result["authorize_us_rbac_user"] < 10_000
