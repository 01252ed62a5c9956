"""The custom resource benchmark measures what it says: the plain server takes
the custom resource unauthenticated, the secure one only from the token's user
through its RoleBinding (a refused or invalid create fails the run)."""

from __future__ import annotations

import pytest

from kubeplane.bench import api


def test_the_crd_has_twenty_fields_a_default_and_a_cel_rule() -> None:
    spec = api.cr_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert len(spec["properties"]) == 20
    assert any("default" in f for f in spec["properties"].values())
    assert spec["x-kubernetes-validations"][0]["rule"]
    assert set(api.cr_body("x")["spec"]) <= set(spec["properties"])


def test_cr_benchmark_runs_plain_and_secure() -> None:
    result = api.cr_creates(runs=1, n=200, clients=2, progress=lambda _m: None)
    for key in ("creates_per_s_cr_http", "creates_per_s_cr_https_authn_rbac"):
        assert result[key] > 0 and len(result[key + "_runs"]) == 1
    assert result["cr_https_authn_rbac_ratio"] > 0
    assert result["cr_server_cpu_us_per_create_http"] > 0


def test_the_secure_server_refuses_the_token_user_without_the_binding(tmp_path) -> None:
    from kubeplane import runtime

    tokens = tmp_path / "tokens.csv"
    tokens.write_text(f'{api.CR_TOKEN},{api.CR_USER},1001,"g"\n')
    srv = api.ServerProc(str(tmp_path), "memory", tls=True, extra=("--token-auth-file", str(tokens)))
    try:
        user_ssl = api._ca_only(str(tmp_path / "data" / "pki" / "ca.crt"))
        runtime.run(api._cr_setup(srv.url, srv.ssl_context(), ["ok"], user_ssl=user_ssl, bind_user=True))
        with pytest.raises(RuntimeError, match="403"):  # a namespace without the RoleBinding
            runtime.run(api._http_creates(srv.url, "other", 2, 1, user_ssl, path=api.CR_PATH, body=api.cr_body,
                                          headers={"Authorization": f"Bearer {api.CR_TOKEN}"}))
    finally:
        srv.stop()
