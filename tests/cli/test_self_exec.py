"""How guestfs starts itself (`guestfs_argv`): an absolute, isolated interpreter that never
imports a package planted in the working directory or PYTHONPATH."""

from __future__ import annotations

import os
import subprocess

from guestfs.system.selfexec import BOOT, guestfs_argv
from tests.support.planted import plant_package, pwn


def test_the_self_exec_command_is_isolated_and_absolute():
    argv = guestfs_argv(["mount", "/x"])
    assert os.path.isabs(argv[0]) and argv[1] == "-I" and argv[2] == BOOT
    assert os.path.isabs(BOOT) and argv[3:] == ["mount", "/x"]


def test_self_exec_ignores_a_package_planted_in_cwd_and_pythonpath(tmp_path):
    marker = tmp_path / "pwned"
    plant_package(tmp_path, pwn(marker))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONSTARTUP=str(tmp_path / "x.py"))
    out = subprocess.run(guestfs_argv(["--version"]), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("guestfs ")
    assert not marker.exists()
