"""CEL device selectors: compilation, runtime errors and the device environment."""

from __future__ import annotations

import pytest

from kubeplane.dra.cel import CELCompileError, CELRuntimeError, DeviceEnv, compile_selector, semver_compare

DRIVER = "gpu.example.com"


def gpu(**extra_attrs):
    attrs = {"model": {"string": "a100"}, "index": {"int": 3}, "healthy": {"bool": True},
             "driverVersion": {"version": "1.2.3"}, "other.io/numa": {"int": 1}}
    attrs.update(extra_attrs)
    return DeviceEnv(DRIVER, {"name": "gpu-0", "attributes": attrs,
                              "capacity": {"memory": {"value": "80Gi"}, "other.io/slots": {"value": "4"}}})


@pytest.mark.parametrize(
    "expr,expected",
    [
        ('device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "a100"', True),
        ('device.driver == "other"', False),
        ('device.attributes["gpu.example.com"].index == 3', True),
        ('device.attributes["gpu.example.com"].healthy', True),
        ('device.attributes["other.io"].numa == 1', True),
        ('device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.example.com"].memory.compareTo(quantity("81920Mi")) == 0', True),
        ('device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("100Gi"))', False),
        ('device.capacity["gpu.example.com"].memory.isLessThan(quantity("100Gi"))', True),
        ('device.capacity["other.io"].slots == quantity("4000m")', True),
        ('device.capacity["gpu.example.com"].memory.sub(quantity("80Gi")).sign() == 0', True),
        ('quantity("1.5").isInteger() == false && quantity("2k").asInteger() == 2000', True),
        ('device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.2.3-rc.1"))', True),
        ('device.attributes["gpu.example.com"].driverVersion.major() == 1', True),
        ('device.attributes["gpu.example.com"].driverVersion == semver("1.2.3")', True),
        ('device.attributes["unknown.example.com"].size() == 0', True),
        ('!("model" in device.attributes["unknown.example.com"])', True),
        ('"model" in device.attributes["gpu.example.com"]', True),
        ('isQuantity("10Gi") && !isQuantity("ten") && isSemver("1.0.0") && !isSemver("1.0")', True),
        ('cel.bind(m, device.attributes["gpu.example.com"].model, m.startsWith("a"))', True),
    ],
)
def test_selector_results(expr, expected):
    assert compile_selector(expr).matches(gpu()) is expected


@pytest.mark.parametrize(
    "expr,fragment",
    [
        ("noSuchVar == 1", "undeclared reference"),
        ("device.driver ==", "Syntax error"),
        ('"just a string"', "must evaluate to bool"),
        ('quantity(1) == quantity("1")', "no matching overload"),
        ("", "empty"),
    ],
)
def test_compile_errors(expr, fragment):
    with pytest.raises(CELCompileError) as info:
        compile_selector(expr)
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "expr,fragment",
    [
        ('device.attributes["gpu.example.com"].missing == "x"', "missing"),
        ('device.attributes["gpu.example.com"].index', "must evaluate to bool"),
        ('quantity("not-a-quantity").sign() == 0', "quantities must match"),
    ],
)
def test_runtime_errors(expr, fragment):
    sel = compile_selector(expr)
    with pytest.raises(CELRuntimeError) as info:
        sel.matches(gpu())
    assert fragment in info.value.message


def test_compare_quantity_with_semver_is_a_runtime_error():
    sel = compile_selector('device.attributes["gpu.example.com"].driverVersion.compareTo(quantity("1")) == 0')
    with pytest.raises(CELRuntimeError):
        sel.matches(gpu())


def test_compile_cache_returns_same_object():
    a = compile_selector('device.driver == "cache.example.com"')
    b = compile_selector('device.driver == "cache.example.com"')
    assert a is b
    with pytest.raises(CELCompileError):
        compile_selector("bad ((")
    with pytest.raises(CELCompileError):
        compile_selector("bad ((")


def test_device_env_domains():
    env = gpu()
    assert env.attributes[DRIVER]["model"] == "a100"
    assert env.attributes["other.io"]["numa"] == 1
    assert compile_selector('device.capacity["other.io"].slots.compareTo(quantity("4")) == 0').matches(env)


def test_unqualified_names_belong_to_driver_domain():
    env = DeviceEnv("drv.io", {"name": "d", "attributes": {"numa": {"int": 7}, "x.io/numa": {"int": 8}}})
    assert env.attributes["drv.io"] == {"numa": 7}
    assert env.attributes["x.io"] == {"numa": 8}
    assert compile_selector('device.attributes["drv.io"].numa == 7 && device.attributes["x.io"].numa == 8').matches(env)


def test_env_reused_after_new_domain_referenced():
    env = gpu()
    assert compile_selector('device.driver == "gpu.example.com"').matches(env)
    # A selector referencing a domain never seen before still reads it as empty.
    assert compile_selector('device.capacity["brand-new.example.com"].size() == 0').matches(env)


@pytest.mark.parametrize(
    "a,b,want",
    [("1.0.0", "1.0.0", 0), ("1.0.0", "2.0.0", -1), ("1.10.0", "1.9.0", 1), ("1.0.0-alpha", "1.0.0", -1),
     ("1.0.0-alpha.1", "1.0.0-alpha.beta", -1), ("1.0.0-rc.1", "1.0.0-beta.11", 1), ("1.0.0+b1", "1.0.0+b2", 0)],
)
def test_semver_order(a, b, want):
    assert semver_compare(a, b) == want
