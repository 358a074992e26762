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


MAX_LINES = 60   # a function longer than this says why in its docstring ("Long: ...")


def test_no_function_is_longer_than_a_screen_without_saying_why():
    import ast

    long = []
    for path in sorted((REPO / "guestfs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                doc = ast.get_docstring(node) or ""
                if lines > MAX_LINES and "Long:" not in doc:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} "
                                f"({lines} lines)")
    assert long == []
