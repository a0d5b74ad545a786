"""Unit strings, parsed in one place.

Every quantity in a scenario or a catalog may be given as an SI number or as a
string with a unit: ``"2.9TB/s"``, ``"96GiB"``, ``"200Gbps"``, ``"30min"``,
``"1.5us"``. Parsers return plain floats in base SI units: bytes, bytes per
second, seconds, FLOP/s, watts.

Bandwidth in bits (``Gbps``, ``Tb/s``) is converted to bytes per second.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

__all__ = [
    "UnitError",
    "format_bytes",
    "format_seconds",
    "parse_bandwidth",
    "parse_bytes",
    "parse_duration",
    "parse_flops",
    "parse_power",
]


class UnitError(ValueError):
    """A value that is not a valid quantity of the expected kind."""


_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}

# ``\d+(?:\.\d*)?`` rather than ``\d+\.?\d*``: the latter backtracks polynomially on a
# long run of digits followed by junk (10,000 digits took seconds).
_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(_NUMBER + r"\s*(?P<unit>[A-Za-z/%µ]*)\s*$")
MAX_QUANTITY_CHARS = 64
"""Longer strings are not quantities: refused before any parsing."""
MAX_MAGNITUDE = 1e30
"""Largest absolute value (in base SI units) of any quantity; 1e30 bytes, FLOP/s or
seconds is far beyond anything real, and the bound keeps products of quantities
finite (no ``inf`` from a huge value meeting another one downstream)."""
MIN_MAGNITUDE = 1e-30
"""Smallest non-zero absolute value: dividing by a rate of 1e-300 overflows."""

_TIME = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}  # fmt: skip

_EXAMPLES = {
    "size": "'96GiB', '32GB'",
    "bandwidth": "'2.9TB/s', '200Gbps'",
    "duration": "'30min', '2us', '54d'",
    "compute rate": "'667TFLOPS'",
    "power": "'500W', '1kW'",
}


def _split(value: object, kind: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise UnitError(f"expected a {kind}, not a boolean")
    if isinstance(value, int | float):
        number, unit = _to_float(value, kind), ""
    elif isinstance(value, str):
        if len(value) > MAX_QUANTITY_CHARS:
            raise UnitError(f"a {kind} is at most {MAX_QUANTITY_CHARS} characters long")
        match = _QUANTITY.match(value.strip().replace("_", ""))
        if match is None:
            raise UnitError(f"cannot read {value!r} as a {kind} (try e.g. {_EXAMPLES[kind]})")
        number, unit = float(match["num"]), match["unit"]
    else:
        raise UnitError(
            f"expected a {kind} (number or string with unit), not {type(value).__name__}"
        )
    if not math.isfinite(number):
        raise UnitError(f"a {kind} must be finite")
    return number, unit


def _to_float(value: int | float, kind: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range (about 1.8e308)
        raise UnitError(f"a {kind} must be at most {MAX_MAGNITUDE:g}") from None


def _in_range(number: float, kind: str) -> float:
    """``number`` (already scaled to base units) if it is finite, non-negative and sane."""
    if number < 0:
        raise UnitError(f"a {kind} cannot be negative")
    if not math.isfinite(number) or number > MAX_MAGNITUDE:
        raise UnitError(f"a {kind} must be at most {MAX_MAGNITUDE:g} in base units")
    if 0 < number < MIN_MAGNITUDE:
        raise UnitError(f"a {kind} must be 0 or at least {MIN_MAGNITUDE:g} in base units")
    return number


def _prefixed(unit: str, base_units: dict[str, float], kind: str) -> float:
    """Scale of ``unit`` = SI or binary prefix + one of ``base_units``."""
    for base, factor in sorted(base_units.items(), key=lambda kv: -len(kv[0])):
        if base and not unit.endswith(base):
            continue
        prefix = unit[: len(unit) - len(base)] if base else unit
        if prefix in _BINARY:
            return _BINARY[prefix] * factor
        if prefix in _DECIMAL:
            return _DECIMAL[prefix] * factor
    raise UnitError(f"unknown {kind} unit {unit!r} (try e.g. {_EXAMPLES[kind]})")


def parse_bytes(value: object) -> float:
    """``"96GiB"`` -> 103079215104.0; ``"32GB"`` -> 3.2e10; a bare number is bytes."""
    number, unit = _split(value, "size")
    scale = _prefixed(unit, {"B": 1.0, "": 1.0}, "size")
    return _in_range(number * scale, "size")


def parse_bandwidth(value: object) -> float:
    """Bytes per second. ``"2.9TB/s"`` -> 2.9e12; ``"200Gbps"`` -> 2.5e10."""
    number, unit = _split(value, "bandwidth")
    bases = {"B/s": 1.0, "Bps": 1.0, "b/s": 0.125, "bps": 0.125, "bit/s": 0.125, "": 1.0}
    scale = _prefixed(unit, bases, "bandwidth")
    return _in_range(number * scale, "bandwidth")


def parse_duration(value: object) -> float:
    """Seconds. ``"30min"`` -> 1800.0; ``"1.5us"`` -> 1.5e-6; a bare number is seconds."""
    number, unit = _split(value, "duration")
    if unit not in _TIME:
        raise UnitError(f"unknown duration unit {unit!r} (try e.g. {_EXAMPLES['duration']})")
    return _in_range(number * _TIME[unit], "duration")


def parse_flops(value: object) -> float:
    """FLOP/s. ``"667TFLOPS"`` -> 6.67e14; a bare number is FLOP/s."""
    number, unit = _split(value, "compute rate")
    bases = {"FLOPS": 1.0, "FLOP/s": 1.0, "flops": 1.0, "flop/s": 1.0, "": 1.0}
    scale = _prefixed(unit, bases, "compute rate")
    return _in_range(number * scale, "compute rate")


def parse_power(value: object) -> float:
    """Watts. ``"1kW"`` -> 1000.0."""
    number, unit = _split(value, "power")
    scale = _prefixed(unit, {"W": 1.0, "": 1.0}, "power")
    return _in_range(number * scale, "power")


def _format(value: float, steps: list[tuple[float, str]], digits: int = 3) -> str:
    for scale, name in steps:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {name}"
    scale, name = steps[-1]
    return f"{value / scale:.{digits}g} {name}"


def format_bytes(n: float) -> str:
    """Binary units for sizes: ``format_bytes(2**30)`` -> ``'1 GiB'``."""
    steps = [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")]
    return _format(n, steps)


def format_seconds(t: float) -> str:
    steps = [(86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "us")]
    return _format(t, steps)


Parser = Callable[[object], float]
