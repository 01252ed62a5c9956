"""YAML alias expansion is bounded as sigs.k8s.io/yaml bounds it, before
anything is built from the document; ordinary anchors keep working."""

from __future__ import annotations

import time
import tracemalloc

import pytest
import yaml

from kubeplane.api.errors import StatusError
from kubeplane.apiserver import codec


def laughs(levels: int, width: int = 10) -> bytes:
    """The "billion laughs" document: width**levels strings from a few hundred bytes."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata: {name: lol}", "data:", '  a0: &a0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return ("\n".join(lines) + "\n").encode()


def test_alias_bomb_is_rejected_at_once_with_bounded_memory():
    body = laughs(7)  # 10**7 nodes once expanded
    assert len(body) < 500
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(StatusError) as err:
            codec.decode_body(body, "application/yaml")
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.code == 400
    assert err.value.message == "error converting YAML to JSON: yaml: document contains excessive aliasing"
    assert elapsed < 0.5, elapsed
    assert peak < 2 * 1024 * 1024, peak


def test_apply_patch_bodies_are_bounded_too():
    with pytest.raises(StatusError) as err:
        codec.decode_patch(laughs(6), "application/apply-patch+yaml")
    assert err.value.code == 400 and "excessive aliasing" in err.value.message


def test_aliases_of_one_large_string_are_bounded_by_size():
    # Few aliases (the ratio rule allows them) of a 100 kB string: 20 MB of JSON.
    big = "x" * 100_000
    body = ("a: &a " + big + "\nb: [" + ",".join(["*a"] * 200) + "]\nc: [" + ",".join(["1"] * 2000) + "]\n")
    with pytest.raises(StatusError) as err:
        codec.decode_yaml(body.encode())
    assert err.value.code == 413 and err.value.reason == "RequestEntityTooLarge"


def test_a_self_containing_anchor_is_rejected():
    with pytest.raises(StatusError) as err:
        codec.decode_yaml(b"a: &a [1, *a]\n")
    assert err.value.code == 400


def test_go_yaml_ratio_rule():
    # 1,001+ nodes of which aliases are more than 99%: rejected ...
    anchor = "base: &b {" + ", ".join(f"k{i}: {i}" for i in range(10)) + "}\n"
    many = anchor + "l: [" + ",".join(["*b"] * 200) + "]\n"  # ~4,200 nodes, ~99.5% from aliases
    with pytest.raises(StatusError):
        codec.decode_yaml(many.encode())
    # ... while the same aliases next to enough plain content are fine.
    plain = "p: [" + ",".join(str(i) for i in range(100)) + "]\n"
    ok = anchor + plain + "l: [" + ",".join(["*b"] * 20) + "]\n"
    assert len(codec.decode_yaml(ok.encode())["l"]) == 20


def test_ordinary_anchors_aliases_and_merge_keys_still_work():
    body = b"""
base: &base {image: nginx, ports: [80, 443]}
m:
  <<: *base
  name: web
l: [*base, *base]
s: &s hello
t: *s
"""
    doc = codec.decode_yaml(body)
    assert doc["m"] == {"image": "nginx", "ports": [80, 443], "name": "web"}
    assert doc["l"] == [doc["base"], doc["base"]]
    assert doc["t"] == "hello"
    # The decoded tree shares nothing, as a JSON body's does.
    doc["l"][0]["ports"].append(1)
    assert doc["base"]["ports"] == [80, 443]


def test_the_c_loader_is_kept():
    if not hasattr(yaml, "CSafeLoader"):
        pytest.fail("libyaml is required")
    assert issubclass(codec._CheckedYamlLoader, yaml.CSafeLoader)
    assert codec._YamlLoader is yaml.CSafeLoader
