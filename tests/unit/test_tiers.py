"""The test suite's own machinery: the tier a folder gives its tests, the CRI tests last,
and the hypothesis profile chosen from the environment (docs/developing.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import settings

from tests.conftest import (
    CRI_TESTS,
    FIXTURE_NAMES,
    fixture_root,
    pytest_collection_modifyitems,
    tier_of,
)
from tests.support.fuzzing import PROFILES, examples, load_profile, profile_name
from tests.support.paths import REPO, TESTS


def test_the_folder_is_the_tier():
    assert tier_of(TESTS / "unit" / "test_x.py") == "unit"
    assert tier_of(TESTS / "external" / "cri" / "test_patterns.py") == "external"
    assert tier_of(TESTS / "test_flat.py") is None          # not in a tier folder yet
    assert tier_of(TESTS / "support" / "realcg.py") is None
    assert tier_of(TESTS / "fixtures" / "docker-v1" / "proc") is None
    assert tier_of(REPO / "benchmarks" / "bench_read.py") is None


def test_this_test_carries_its_folders_marker(request):
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("host") is None


class Item(SimpleNamespace):
    def add_marker(self, name: str) -> None:
        self.markers.append(name)


def test_cri_tests_go_last_and_every_test_is_marked():
    items = [Item(path=CRI_TESTS / "test_patterns.py", markers=[]),
             Item(path=TESTS / "host" / "test_attach.py", markers=[]),
             Item(path=TESTS / "test_flat.py", markers=[]),
             Item(path=TESTS / "unit" / "test_quantity.py", markers=[])]
    pytest_collection_modifyitems(None, items)
    assert [i.path.name for i in items] == ["test_attach.py", "test_flat.py",
                                            "test_quantity.py", "test_patterns.py"]
    assert [i.markers for i in items] == [["host"], [], ["unit"], ["external"]]


@pytest.mark.parametrize("env,name", [
    ({}, "dev"),
    ({"CI": "true"}, "ci"),
    ({"CI": "TRUE"}, "ci"),
    ({"CI": "false"}, "dev"),
    ({"CI": "true", "HYPOTHESIS_PROFILE": "dev"}, "dev"),
    ({"HYPOTHESIS_PROFILE": "ci"}, "ci"),
])
def test_the_profile_comes_from_the_environment(env, name):
    assert profile_name(env) == name


def test_an_unknown_profile_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="HYPOTHESIS_PROFILE='fast': the profiles are ci, dev"):
        load_profile({"HYPOTHESIS_PROFILE": "fast"})


def test_ci_runs_the_written_counts_and_dev_a_tenth():
    before = profile_name()
    try:
        load_profile({"HYPOTHESIS_PROFILE": "ci"})
        assert settings.default.max_examples == PROFILES["ci"] == 100
        assert [examples(n) for n in (500, 300, 80, 1)] == [500, 300, 80, 1]
        load_profile({"HYPOTHESIS_PROFILE": "dev"})
        assert settings.default.max_examples == 10
        assert [examples(n) for n in (500, 300, 80, 5)] == [50, 30, 8, 1]
    finally:
        load_profile({"HYPOTHESIS_PROFILE": before})


def test_fixture_roots_are_found_from_every_tier():
    assert "docker-v1" in FIXTURE_NAMES
    assert fixture_root("docker-v1") == TESTS / "fixtures" / "docker-v1"
    assert (fixture_root("docker-v1") / "proc" / "meminfo").is_file()
    assert (REPO / "pyproject.toml").is_file()
