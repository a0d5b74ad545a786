"""Unit strings are parsed in one place."""

from __future__ import annotations

import math

import pytest

from clustersim import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("96GiB", 96 * 2**30),
        ("32GB", 32e9),
        ("1.5 KiB", 1536.0),
        (1024, 1024.0),
        ("512", 512.0),
        ("2e3B", 2000.0),
    ],
)
def test_bytes(text: object, expected: float) -> None:
    assert units.parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.9TB/s", 2.9e12),
        ("200Gbps", 25e9),
        ("3.2Tbps", 400e9),
        ("100 GB/s", 100e9),
        ("1GiB/s", 2**30),
        (5e9, 5e9),
    ],
)
def test_bandwidth(text: object, expected: float) -> None:
    assert units.parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30min", 1800.0),
        ("1.5us", 1.5e-6),
        ("2ms", 2e-3),
        ("54d", 54 * 86400.0),
        (3, 3.0),
        ("1h", 3600.0),
    ],
)
def test_duration(text: object, expected: float) -> None:
    assert units.parse_duration(text) == pytest.approx(expected)


def test_flops_and_power() -> None:
    assert units.parse_flops("667TFLOPS") == pytest.approx(667e12)
    assert units.parse_power("1kW") == 1000.0


@pytest.mark.parametrize(
    ("parser", "bad"),
    [
        (units.parse_bytes, "96GiBB"),
        (units.parse_bytes, "-1GB"),
        (units.parse_bandwidth, "2.9TB/sec"),
        (units.parse_duration, "30 fortnights"),
        (units.parse_duration, "nan"),
        (units.parse_bytes, True),
        (units.parse_bytes, [1]),
        (units.parse_bytes, math.inf),
        (units.parse_bytes, ""),
    ],
)
def test_rejects(parser: units.Parser, bad: object) -> None:
    with pytest.raises(units.UnitError):
        parser(bad)


def test_format() -> None:
    assert units.format_bytes(2**30) == "1 GiB"
    assert units.format_seconds(90) == "1.5 min"
