from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from guestfs.engine.explicit import ExplicitSettings, collect_explicit
from guestfs.engine.limits import EffectiveLimits, effective_limits
from guestfs.sources.host_root import HostRoot
from guestfs.sources.snapshot import read_snapshot
from tests.support.fuzzing import load_profile
from tests.support.paths import FIXTURES, TESTS

# Before any test module is imported: their @settings read the profile's example count.
HYPOTHESIS_PROFILE = load_profile()

CRI_TESTS = TESTS / "external" / "cri"
# Each folder is a tier, and its tests carry its marker (registered in pyproject.toml), so
# `-m unit` or `-m "not external"` selects by what a test needs (docs/developing.md).
TIERS = ("unit", "fuzz", "cli", "host", "external")
FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())

MiB, GiB = 1 << 20, 1 << 30


def fixture_root(name: str) -> Path:
    return FIXTURES / name


def limits_of(root: str | Path, pid: str = "self", rounding: str = "ceil",
              **explicit: object) -> EffectiveLimits:
    env = explicit.pop("env", {})
    settings = ExplicitSettings(env=env, **explicit)  # type: ignore[arg-type]
    snap = read_snapshot(HostRoot(str(root)), pid)
    return effective_limits(snap, collect_explicit(settings), rounding)


@pytest.fixture
def copy_fixture(tmp_path: Path):
    """A writable copy of a fixture root, for tests that break files."""

    def make(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    return make


def pytest_report_header(config):
    return (f"hypothesis profile: {HYPOTHESIS_PROFILE} "
            "(HYPOTHESIS_PROFILE=dev|ci; default ci where CI=true, else dev)")


def tier_of(path: Path) -> str | None:
    """The tier folder ``path`` lies in (tests/<tier>/...), or None."""
    if not path.is_relative_to(TESTS):
        return None
    parts = path.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_collection_modifyitems(config, items):
    """Every test gets its folder's tier marker. Then the CRI tests go last: their gRPC
    client keeps threads for the rest of the session, and grpc's fork handlers start
    threads in every child forked afterwards, where the other tests' children must be
    single-threaded (setns into a mount namespace fails with EINVAL in a threaded process;
    with the handlers off, a child may inherit a lock a grpc thread held)."""
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)
    items.sort(key=lambda item: item.path.is_relative_to(CRI_TESTS))


@pytest.fixture(scope="session")
def cri_node_session():
    """One private containerd for the whole session (tests/support/cri/node.py); after it,
    nothing of it may be left: no pod, containerd process, mount, cgroup or scratch file."""
    from tests.support.cri.node import node_session

    yield from node_session()


@pytest.fixture
def cri_node(cri_node_session):
    """The session's CriNode; pods a test leaves running are removed after it (pods of a
    wider fixture, started before the test, stay)."""
    before = list(cri_node_session.pods)
    yield cri_node_session
    for pod in list(cri_node_session.pods):
        if not any(pod is b for b in before):
            pod.remove()
