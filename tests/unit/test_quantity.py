from fractions import Fraction

import pytest

from guestfs.engine.quantity import parse_cpu_quantity, parse_memory_quantity


@pytest.mark.parametrize("text,expected", [
    ("512Mi", 512 * 1024 * 1024), ("1G", 1_000_000_000), ("1Gi", 1 << 30),
    ("600M", 600_000_000), ("536870912", 536870912), ("1.5Gi", 3 << 29),
    ("1e9", 1_000_000_000), ("128974848", 128974848), ("129e6", 129_000_000), ("1k", 1000),
    ("123Ki", 125952), (" 64Mi\n", 64 << 20),
])
def test_memory_quantities(text, expected):
    assert parse_memory_quantity(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("1500m", Fraction(3, 2)), ("2", Fraction(2)), ("0.5", Fraction(1, 2)),
    ("250m", Fraction(1, 4)), ("1", Fraction(1)), ("100m", Fraction(1, 10)),
])
def test_cpu_quantities(text, expected):
    assert parse_cpu_quantity(text) == expected


@pytest.mark.parametrize("bad", ["", "max", "-1", "0", "12XB", "1.2.3", "Mi", "0m"])
def test_rejects(bad):
    with pytest.raises(ValueError):
        parse_memory_quantity(bad)
    with pytest.raises(ValueError):
        parse_cpu_quantity(bad)
