"""Where the repository's files are, for tests in any tier folder and for the benchmarks
(which import this module by path, so it needs nothing but the standard library)."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
