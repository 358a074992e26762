"""One guestfs mount per mountpoint: the mount lock and its directory's safety checks
(real daemons racing for one mountpoint: tests/host/test_mount_lock_daemons.py)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from guestfs.daemon import mountlock
from guestfs.daemon.mount import hold_mount_lock
from guestfs.daemon.mountpoint import MountError


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "locks"
    monkeypatch.setattr(mountlock, "LOCK_DIR", str(d))
    return d


def test_the_key_names_the_mountpoint_through_its_parents_real_path(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert mountlock.mount_key(str(tmp_path / "real/m")) == \
        mountlock.mount_key(str(tmp_path / "alias/m")) == \
        mountlock.mount_key(str(tmp_path / "real/./m"))
    assert mountlock.mount_key(str(tmp_path / "real/m")) != \
        mountlock.mount_key(str(tmp_path / "real/n"))


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path, lock_dir):
    mp = str(tmp_path / "m")
    assert not mountlock.served_by_other(mp)
    fd = hold_mount_lock(mp)
    try:
        mountlock.write_owner(fd, f"{os.getpid()} {mp}\n")
        with pytest.raises(MountError, match=rf"already served .*\(pid {os.getpid()}\)"):
            hold_mount_lock(mp, timeout=0.1)
        assert mountlock.served_by_other(mp)
    finally:
        os.close(fd)
    assert not mountlock.served_by_other(mp)
    again = hold_mount_lock(mp, timeout=0.1)  # free again once its holder is gone
    assert mountlock.release_removing(again, mp, "mount")
    assert not mountlock.served_by_other(mp)
    assert oct(lock_dir.stat().st_mode & 0o777) == oct(0o700)


def test_a_symlink_in_place_of_the_lock_directory_is_refused(tmp_path, lock_dir):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    lock_dir.symlink_to(target)
    with pytest.raises(mountlock.LockError, match="symlink"):
        mountlock.open_lock(str(tmp_path / "m"), "mount")
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("mode", [0o1777, 0o775, 0o757])
def test_a_lock_directory_others_can_write_is_refused(tmp_path, lock_dir, mode):
    lock_dir.mkdir()
    lock_dir.chmod(mode)
    with pytest.raises(mountlock.LockError, match="writable by no one else"):
        mountlock.open_lock(str(tmp_path / "m"), "users")


def test_a_lock_directory_others_can_only_read_is_used(tmp_path, lock_dir):
    """A DaemonSet shares the node's lock directory through a hostPath, which kubelet
    creates 0755: nobody else can plant anything there."""
    lock_dir.mkdir()
    lock_dir.chmod(0o755)
    os.close(mountlock.open_lock(str(tmp_path / "m"), "users"))


def test_a_symlink_planted_as_the_lock_file_is_not_followed(tmp_path, lock_dir):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    lock_dir.mkdir(mode=0o700)
    mp = str(tmp_path / "m")
    (lock_dir / f"{mountlock.mount_key(mp)}.mount").symlink_to(victim)
    with pytest.raises(mountlock.LockError, match="symlink"):
        hold_mount_lock(mp)
    assert victim.read_text() == "precious\n"


def test_a_shared_users_lock_keeps_an_exclusive_probe_out(tmp_path, lock_dir):
    mp = str(tmp_path / "m")
    users = [mountlock.acquire(mp, "users", fcntl.LOCK_SH) for _ in range(2)]
    assert None not in users
    assert mountlock.acquire(mp, "users", fcntl.LOCK_EX) is None
    assert not mountlock.release_removing(users.pop(), mp, "users")  # another still holds
    assert mountlock.acquire(mp, "users", fcntl.LOCK_EX) is None
    os.close(users.pop())
    last = mountlock.acquire(mp, "users", fcntl.LOCK_EX)
    assert last is not None
    assert mountlock.release_removing(last, mp, "users")
    assert list(lock_dir.iterdir()) == []  # the last one out removes the file


def test_a_file_removed_between_open_and_flock_is_not_trusted(tmp_path, lock_dir):
    """A locker that opened the file just before its last holder removed it must not count
    on that orphan: acquire() opens the path afresh."""
    mp = str(tmp_path / "m")
    holder = mountlock.acquire(mp, "mount", fcntl.LOCK_EX)
    orphan = mountlock.open_lock(mp, "mount")  # opened, not yet locked
    assert mountlock.release_removing(holder, mp, "mount")
    try:
        assert mountlock.try_flock(orphan, fcntl.LOCK_EX)  # an orphan locks freely...
        fresh = mountlock.acquire(mp, "mount", fcntl.LOCK_EX)
        assert fresh is not None  # ...but the lock that counts is on the new file
        assert mountlock.served_by_other(mp)
        assert mountlock.acquire(mp, "mount", fcntl.LOCK_EX, timeout=0.1) is None
        os.close(fresh)
    finally:
        os.close(orphan)


def test_a_users_locks_are_its_own(monkeypatch, tmp_path):
    """Non-root, the node's /run/guestfs-locks is not writable (mount blamed it): a user's
    locks go in its runtime directory, else a directory of its uid under /tmp."""
    from guestfs.daemon import mountlock

    monkeypatch.setattr(mountlock.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert mountlock.default_lock_dir() == str(tmp_path / "guestfs-locks")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert mountlock.default_lock_dir() == "/tmp/guestfs-locks-1000"
    monkeypatch.setattr(mountlock.os, "geteuid", lambda: 0)
    assert mountlock.default_lock_dir() == "/run/guestfs-locks"
