"""The project is ruff clean (the developers' guide); CI enforces it through this test."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO


def test_ruff_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: .ci/setup installs it with the test extras")
    out = subprocess.run([ruff, "check", str(REPO)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
