"""Run commands with files bind-mounted over /proc and /sys in a private mount namespace.

The same mechanism users get from `guestfs run`; here the files are regular files rendered
from fixtures or a real cgroup, so the real tools parse exactly what guestfs serves.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

SEP = "----guestfs-test-sep----"


def require_unshare() -> None:
    if os.geteuid() != 0:
        pytest.skip("bind mounts over /proc need root")
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is missing: .ci/setup installs it")


def run_overlaid(files: dict[str, str], commands: list[str], workdir: Path,
                 env: dict[str, str] | None = None) -> list[str]:
    """Outputs of ``commands``, each run by sh in one private mount namespace where every
    guest path of ``files`` is bind-mounted from a rendered copy. Nothing outlives the
    namespace: its mounts vanish with it, whatever happens."""
    require_unshare()
    script = ["set -e"]
    for i, (guest, text) in enumerate(sorted(files.items())):
        src = workdir / f"f{i}"
        src.write_text(text)
        script.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(guest)}")
    script.append("set +e")
    for cmd in commands:
        script.append(f"{cmd}; echo {SEP}")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          "\n".join(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    parts = out.stdout.split(SEP + "\n")
    assert len(parts) == len(commands) + 1, out.stdout + out.stderr
    return parts[:-1]
