"""Where `guestfs run` mounts: the shared default where it can be made, a private tmpfs
over a directory run does not need otherwise, and one-line errors (runspace.py). The
mounts themselves are tested in real containers: tests/external/test_real_runc_caps.py."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from guestfs.daemon import mountlock
from guestfs.wrap import runspace


def test_the_parent_skips_missing_symlinked_and_needed_directories(tmp_path, monkeypatch):
    (tmp_path / "needed/python").mkdir(parents=True)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "free").mkdir()
    monkeypatch.setattr(runspace, "_needed_paths", lambda: [str(tmp_path / "needed/python")])
    candidates = tuple(str(tmp_path / d) for d in ("missing", "link", "needed", "free"))
    assert runspace.pick_parent(candidates) == str(tmp_path / "free")
    assert runspace.pick_parent(candidates[:3]) is None


def test_a_directory_only_covers_what_is_beneath_it():
    assert runspace._covers("/run", ["/run/venv/bin/python"])
    assert runspace._covers("/run", ["/run"])
    assert not runspace._covers("/run", ["/runtime/python"])


def test_a_usable_default_is_shared(tmp_path, monkeypatch):
    monkeypatch.setattr(mountlock, "LOCK_DIR", str(tmp_path / "locks"))
    mp = str(tmp_path / "run/guestfs")
    space = runspace.choose(mp, explicit=False)
    assert space == runspace.RunSpace(mp) and space.daemon_args == []
    assert space.daemon_env() is None
    assert os.path.isdir(mp) and os.path.isdir(tmp_path / "locks")


def test_an_unusable_lock_directory_is_one_line_with_the_fix(tmp_path):
    with pytest.raises(mountlock.LockError) as e:
        mountlock.open_lock_dir(str(tmp_path / "no/such/locks"))
    assert e.value.errno == errno.ENOENT
    assert str(e.value) == (f"lock directory {tmp_path}/no/such/locks: cannot create it "
                            f"(No such file or directory); mount a writable volume there "
                            f"or at {tmp_path}/no/such (an emptyDir)")


def test_a_private_space_passes_its_lock_dir_and_tmpdir_to_the_daemon():
    space = runspace.RunSpace("/dev/mqueue/guestfs", "/dev/mqueue/guestfs-locks",
                              "/dev/mqueue")
    assert space.daemon_args == ["--lock-dir", "/dev/mqueue/guestfs-locks"]
    assert space.daemon_env()["TMPDIR"] == "/dev/mqueue"  # type: ignore[index]


def test_an_explicit_mountpoint_that_cannot_be_made_is_one_line(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(runspace.RunSpaceError) as e:
        runspace.choose(str(blocker / "mp"), explicit=True)
    assert str(e.value) == (f"cannot use --mountpoint {blocker}/mp: Not a directory; give a "
                            "writable directory (an emptyDir volume), or omit --mountpoint "
                            "for a private one")
