"""String formats custom resources are validated against (upstream's strfmt registry)."""

import pytest

from kubeplane.apiextensions.formats import check_format, supported_format


@pytest.mark.parametrize("fmt,good,bad", [
    ("hostname", ["a", "a-b.example.com", "xn--bcher-kva.example"], ["a_b.com", "-a.com", "a.b.c1", "x" * 64]),
    ("ipv4", ["10.0.0.1", "010.0.0.1"], ["1.2.3", "256.1.1.1", "::1"]),
    ("ipv6", ["::1", "fe80::1"], ["1.2.3.4", "g::1"]),
    ("cidr", ["10.0.0.0/8", "::/0"], ["10.0.0.0", "10.0.0.0/33"]),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000", "123E4567E89B12D3A456426614174000"], ["nope", "123e4567"]),
    ("uuid4", ["123e4567-e89b-42d3-a456-426614174000"], ["123e4567-e89b-12d3-a456-426614174000"]),
    ("date", ["2024-02-29"], ["2023-02-29", "2024-1-1", "2024-01-01T00:00:00Z"]),
    ("date-time", ["2024-01-02T03:04:05Z", "2024-01-02T03:04:05.123+02:00"], ["2024-01-02", "2024-13-02T03:04:05Z"]),
    ("datetime", ["2024-01-02T03:04:05Z"], ["yesterday"]),
    ("byte", ["YWJj", "YWI=", "YQ=="], ["", "YWJ", "!!!!"]),
    ("email", ["a@example.com"], ["a", "a@@b"]),
    ("mac", ["00:11:22:33:44:55", "00-11-22-33-44-55"], ["00:11:22:33:44", "zz:11:22:33:44:55"]),
    ("hexcolor", ["#fff", "a0b1c2"], ["#ffff", "red"]),
    ("rgbcolor", ["rgb(1, 2, 255)"], ["rgb(256,0,0)"]),
    ("isbn10", ["0306406152"], ["0306406153"]),
    ("isbn13", ["9780306406157"], ["9780306406158"]),
    ("creditcard", ["4111 1111 1111 1111"], ["4111 1111 1111 1112"]),
    ("ssn", ["123-45-6789"], ["123-456-789"]),
    ("duration", ["1h", "1h30m", "3 days", "1.5s"], ["1x", "h"]),
    ("bsonobjectid", ["507f1f77bcf86cd799439011"], ["507f1f77bcf86cd79943901"]),
    ("uri", ["https://example.com/x", "/path"], ["", "no scheme"]),
])
def test_formats(fmt, good, bad):
    for value in good:
        assert check_format(fmt, value), (fmt, value)
    for value in bad:
        assert not check_format(fmt, value), (fmt, value)


def test_unsupported_formats_are_ignored():
    assert supported_format("int32") == "" and supported_format("double") == ""
    assert supported_format("date-time") == "date-time" and supported_format("uuid") == "uuid"
    assert check_format("int-or-string", "anything")
