"""Kubernetes resource quantities (``512Mi``, ``1G``, ``1500m``, ``2``, ``1e9``)."""

from __future__ import annotations

import math
import re
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
_QUANTITY = re.compile(r"^\s*([+]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity; ValueError for anything Kubernetes would reject."""
    m = _QUANTITY.match(text)
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    try:
        number = Fraction(Decimal(m.group(1)))
    except InvalidOperation as e:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from e
    return number * _SUFFIX[m.group(2)]


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
