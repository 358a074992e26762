"""The race a fixture cannot show (tests/unit/test_reader_root.py has the rest): a tmpfs
mounted over the reader's cgroup directory after its mountinfo was read."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.unit.test_reader_root import MEM, NAME, assert_memory_refused, plant_fake_memory


@pytest.mark.real
def test_a_tmpfs_mounted_after_mountinfo_was_read_is_refused_by_its_device(copy_fixture):
    """mountinfo still lists the cgroup mount (the race: the tenant mounts between our read
    of mountinfo and our open): the directory's st_dev is not the hierarchy's."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    root = copy_fixture(NAME)
    target = root / MEM
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    try:
        plant_fake_memory(target)
        assert_memory_refused(root, "cannot be opened safely")
    finally:
        subprocess.run(["umount", str(target)], check=True)
