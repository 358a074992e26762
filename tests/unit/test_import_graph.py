"""The pipeline's imports run one way (README's Architecture): sources <- engine <- render
<- daemon <- commands, with system/ beneath them all, and no module imports itself back
through a cycle. Read with ast, so a function-level import counts as much as a top one."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

PKG = REPO / "guestfs"
# Rank of each stage: a module may import its own stage or a lower one, never a higher.
# fuse/ (the FUSE protocol engine) sits just below the daemon, which may use it.
STAGES = {"system": 0, "sources": 1, "engine": 2, "render": 3, "fuse": 4, "daemon": 5,
          "commands": 6}
PACKAGE = -1   # guestfs/__init__.py: the version and default paths, beneath everything
TOP = 7        # guestfs/__main__.py, _boot.py: the entry points, above every stage


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The guestfs modules ``path`` imports (``from guestfs.x import y`` names x, or x.y
    when y is itself a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "guestfs")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "guestfs":
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}


def _rank(module: str) -> int:
    parts = module.split(".")
    return PACKAGE if len(parts) == 1 else STAGES.get(parts[1], TOP)


def test_every_module_sits_in_a_stage():
    loose = [m for m in _graph() if _rank(m) == TOP
             and m not in ("guestfs.__main__", "guestfs._boot")]
    assert loose == []


def test_no_import_points_up_the_pipeline():
    up = sorted(f"{m} -> {i}" for m, deps in _graph().items() for i in deps
                if _rank(i) > _rank(m))
    assert up == []


def test_no_import_cycles():
    graph = _graph()
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        if m in stack:
            cycles.append([*stack[stack.index(m):], m])
            return
        if m in done:
            return
        for dep in sorted(graph[m]):
            visit(dep, [*stack, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])
    assert cycles == []
