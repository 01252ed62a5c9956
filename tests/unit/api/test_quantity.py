from fractions import Fraction

import pytest

from kubeplane.api.quantity import (
    FORMAT_ERROR,
    canonical_quantity,
    format_quantity,
    int_value,
    is_quantity,
    milli_value,
    parse_quantity,
    parse_quantity_with_format,
)


@pytest.mark.parametrize(
    "text,value",
    [
        ("0", Fraction(0)),
        ("1", Fraction(1)),
        ("100m", Fraction(1, 10)),
        ("0.1", Fraction(1, 10)),
        ("1.5Gi", Fraction(3, 2) * 2**30),
        ("1Ki", Fraction(1024)),
        ("1Ei", Fraction(2**60)),
        ("2k", Fraction(2000)),
        ("1M", Fraction(10**6)),
        ("1E", Fraction(10**18)),
        ("5n", Fraction(5, 10**9)),
        ("3u", Fraction(3, 10**6)),
        ("1e3", Fraction(1000)),
        ("1.5E-2", Fraction(15, 1000)),
        ("+2", Fraction(2)),
        ("-1.5", Fraction(-3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        (3, Fraction(3)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_exact_values(text, value):
    assert parse_quantity(text) == value


def test_sub_nano_precision_rounds_up_away_from_zero():
    assert parse_quantity("0.1n") == Fraction(1, 10**9)
    assert parse_quantity("-0.1n") == Fraction(-1, 10**9)


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", ".", "Ki", "1 Ki", "--1", "1KiB"])
def test_malformed_quantities_use_upstream_message(bad):
    with pytest.raises(ValueError) as ei:
        parse_quantity(bad)
    assert str(ei.value) == FORMAT_ERROR
    assert "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$" in FORMAT_ERROR


@pytest.mark.parametrize("bad", ["1e", "1Ki2", "1mm"])
def test_bad_suffix(bad):
    with pytest.raises(ValueError, match="unable to parse quantity's suffix"):
        parse_quantity(bad)


def test_is_quantity():
    assert is_quantity("10Gi") and not is_quantity("ten")


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("1.5Gi", "1536Mi"),
        ("0.1", "100m"),
        ("100m", "100m"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("1500000", "1500k"),
        ("0.0001", "100u"),
        ("2048Ki", "2Mi"),
        ("1024", "1024"),  # decimal SI input keeps decimal form
        ("1024Ki", "1Mi"),
        ("1025Ki", "1025Ki"),
        ("0.5Ki", "512"),
        ("0.5Gi", "512Mi"),
        ("1e3", "1e3"),
        ("1.5e3", "1500"),
        ("80e-3", "80e-3"),
        ("12e18", "12e18"),
        ("0", "0"),
        ("0Gi", "0"),
        ("-1.5Gi", "-1536Mi"),
        ("1.5n", "2n"),
        ("0.1Ki", "102400m"),
    ],
)
def test_canonical_form(text, canonical):
    assert canonical_quantity(text) == canonical


def test_format_quantity_in_each_family():
    gib = Fraction(3, 2) * 2**30
    assert format_quantity(gib, "BinarySI") == "1536Mi"
    assert format_quantity(gib, "DecimalSI") == "1610612736"
    assert format_quantity(Fraction(1, 10), "DecimalSI") == "100m"
    assert format_quantity(Fraction(1, 10), "BinarySI") == "100m"  # fractional: falls back to decimal
    assert format_quantity(1000, "BinarySI") == "1k"  # below 1024: shown as decimal
    assert format_quantity(2000, "BinarySI") == "2000"  # not a multiple of 1024
    assert format_quantity(Fraction(1, 1000), "DecimalExponent") == "1e-3"
    assert format_quantity(10**21, "DecimalSI") == "1000E"


def test_parse_reports_format_family():
    assert parse_quantity_with_format("1Gi")[1] == "BinarySI"
    assert parse_quantity_with_format("1G")[1] == "DecimalSI"
    assert parse_quantity_with_format("1e9")[1] == "DecimalExponent"


@pytest.mark.parametrize(
    "text,whole,milli",
    [("100m", 1, 100), ("1", 1, 1000), ("1.5", 2, 1500), ("0.5", 1, 500), ("1n", 1, 1),
     ("-100m", -1, -100), ("2Gi", 2 * 2**30, 2 * 2**30 * 1000), ("0", 0, 0)],
)
def test_value_and_milli_value_round_up(text, whole, milli):
    assert int_value(text) == whole
    assert milli_value(text) == milli
