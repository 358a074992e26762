"""Kubernetes resource quantities (``512Mi``, ``1G``, ``1500m``, ``2``, ``1e9``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
    "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30),
    "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^\s*([+]?(?:\d+\.?\d*|\.\d+)(?:[eE]([+-]?\d+))?)\s*([a-zA-Z]*)\s*$",
                       re.ASCII)
# Every quantity must be below 2**63 in its base unit (bytes, CPUs): the kernel cannot hold
# a larger limit, and "1e400" would otherwise mean "no limit" as any value above the host's
# does. The exponent is bounded before the number is built: Decimal("1e999999999") as an
# exact fraction is a billion-digit integer (the CLI spun at 100% CPU on it).
MAX_QUANTITY = 2**63 - 1
_MAX_EXPONENT = 40
_MAX_DIGITS = 100

# How a fractional CPU limit becomes a CPU count (--cpu-rounding).
ROUNDERS: dict[str, Callable[[Fraction], int]] = {
    "ceil": math.ceil,
    "floor": math.floor,
    "round": lambda q: math.floor(q + Fraction(1, 2)),  # half up, as GNU nproc does
}
ROUNDINGS = tuple(ROUNDERS)


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity; ValueError for anything Kubernetes would reject."""
    m = _QUANTITY.match(text)
    if not m or m.group(3) not in _SUFFIX:
        raise ValueError(f"not a Kubernetes quantity: {_short(text)!r}")
    exponent = (m.group(2) or "0").lstrip("+-").lstrip("0") or "0"
    if len(exponent) > 3 or int(exponent) > _MAX_EXPONENT or len(m.group(1)) > _MAX_DIGITS:
        raise ValueError(f"quantity out of range: {_short(text)!r}")
    try:
        number = Fraction(Decimal(m.group(1)))
    except InvalidOperation as e:
        raise ValueError(f"not a Kubernetes quantity: {_short(text)!r}") from e
    return in_range(number * _SUFFIX[m.group(3)], text)


def in_range(value: Fraction, text: str) -> Fraction:
    """``value`` (parsed from ``text``, perhaps times a downward API divisor), checked to
    be below 2**63."""
    if value > MAX_QUANTITY:
        raise ValueError(f"quantity too large (at most 2^63-1): {_short(text)!r}")
    return value


def _short(text: str, limit: int = 40) -> str:
    """``text`` cut for an error message: a bad value may be a whole file."""
    return text if len(text) <= limit else text[:limit] + "..."


def parse_memory_quantity(text: str) -> int:
    """Bytes, rounded up as the kubelet does for fractional byte counts."""
    value = parse_quantity(text)
    if value <= 0:
        raise ValueError(f"memory quantity must be positive: {text!r}")
    return math.ceil(value)


def parse_cpu_quantity(text: str) -> Fraction:
    """CPUs as an exact fraction (``1500m`` -> 3/2)."""
    value = parse_quantity(text)
    if value <= 0:
        raise ValueError(f"cpu quantity must be positive: {text!r}")
    return value
