"""The hypothesis profiles and each property's share of them.

``ci`` runs every property as many times as it ran before there were profiles (hypothesis's
default of 100 where a test names no count); ``dev`` runs a tenth of that, for a quick
local signal. tests/conftest.py loads one before any test module is imported, so that the
``examples(n)`` of a ``@settings`` decorator sees it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import settings

CI_EXAMPLES = 100          # hypothesis's default max_examples
PROFILES = {"ci": CI_EXAMPLES, "dev": CI_EXAMPLES // 10}
ENV = "HYPOTHESIS_PROFILE"


def profile_name(env: Mapping[str, str] = os.environ) -> str:
    """HYPOTHESIS_PROFILE if set, else ``ci`` where CI=true (what CI services set), else
    ``dev``."""
    return env.get(ENV) or ("ci" if env.get("CI", "").lower() == "true" else "dev")


def load_profile(env: Mapping[str, str] = os.environ) -> str:
    name = profile_name(env)
    if name not in PROFILES:
        raise ValueError(f"{ENV}={name!r}: the profiles are {', '.join(PROFILES)}")
    for profile, count in PROFILES.items():
        settings.register_profile(profile, max_examples=count)
    settings.load_profile(name)
    return name


def examples(ci: int) -> int:
    """A property's example count: ``ci`` under the ci profile, the same share of the
    loaded profile's count under any other (dev: a tenth, at least 1)."""
    return max(1, ci * settings.default.max_examples // CI_EXAMPLES)
