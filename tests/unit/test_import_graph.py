"""The package's imports run one way (README's Architecture): system <- sources <- engine
<- render <- daemon, syscalls <- wrap, inject, webhook <- cli; stages of one rank never import each
other, renderers import only pure modules (an allowlist), and no module imports itself
back through a cycle. Read with ast, so a function-level import counts as much as a top
one."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

PKG = REPO / "guestfs"
# Rank of each stage: a module may import its own stage or a lower one, never a higher,
# nor another stage of its own rank. fuse/ (the FUSE protocol engine) sits just below the
# daemon, which may use it. webhook/ (the admission webhook) runs in a cluster's control
# plane, not on a node: it may import nothing of guestfs but itself (checked below).
STAGES = {"system": 0, "sources": 1, "engine": 2, "render": 3, "fuse": 4, "daemon": 5,
          "syscalls": 5, "wrap": 6, "inject": 6, "webhook": 6, "cli": 7}
PACKAGE = -1   # guestfs/__init__.py: the version and default paths, beneath everything
TOP = 8        # guestfs/__main__.py, _boot.py: the entry points, above every stage
# What a renderer may import from outside render/: the engine's results and the pure
# parsers of sources/, by name. Anything else (a reader of host files) makes it impure.
PURE_FOR_RENDER = {
    "guestfs.engine.limits": {"EffectiveLimits"},
    "guestfs.sources.cgroup_files": {"parse_cpu_list"},
    "guestfs.sources.host_proc": {"parse_meminfo", "parse_uptime"},
    "guestfs.sources.usage_parsers": {"ContainerAge", "CpuUsage", "IoCounters",
                                      "TaskCounts", "USER_HZ"},
}


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


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else ""


def test_peers_of_one_rank_never_import_each_other():
    across = sorted(f"{m} -> {i}" for m, deps in _graph().items() for i in deps
                    if _stage(m) in STAGES and _stage(i) in STAGES
                    and _stage(m) != _stage(i) and _rank(m) == _rank(i))
    assert across == []


def test_the_webhook_imports_nothing_of_guestfs_but_itself():
    """Its image needs neither FUSE nor the node's /proc: no daemon, FUSE, source or
    system module may come in with it."""
    outside = sorted(f"{m} -> {i}" for m, deps in _graph().items()
                     if _stage(m) == "webhook" for i in deps if _stage(i) != "webhook")
    assert outside == []
    assert any(_stage(m) == "webhook" for m in _graph())


def test_every_stage_folder_says_its_purpose():
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((PKG / stage / "__init__.py").read_text()))
        assert doc and len(doc) > 40, stage
    assert sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__") \
        == sorted(STAGES)


def _names_imported(path: Path) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("guestfs."):
            out.extend((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((a.name, "*") for a in node.names if a.name.startswith("guestfs"))
    return out


def test_renderers_import_only_pure_modules():
    impure = sorted(f"{p.name}: {mod}.{name}" for p in (PKG / "render").glob("*.py")
                    for mod, name in _names_imported(p)
                    if not mod.startswith("guestfs.render")
                    and name not in PURE_FOR_RENDER.get(mod, set()))
    assert impure == []


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
