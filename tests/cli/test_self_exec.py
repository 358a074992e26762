"""How guestfs starts itself (`guestfs_argv`): an absolute, isolated interpreter that never
imports a package planted in the working directory or PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from guestfs.system.selfexec import BOOT, guestfs_argv


def plant_package(d: Path, body: str) -> None:
    (d / "guestfs").mkdir()
    (d / "guestfs" / "__init__.py").write_text(body)
    (d / "guestfs" / "__main__.py").write_text(body)
    (d / "guestfs" / "commands").mkdir()
    (d / "guestfs" / "commands" / "__init__.py").write_text(body)
    (d / "guestfs" / "commands" / "cli.py").write_text(body)


def pwn(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').close()\n"


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
