"""Every option of every command is described: a help text in `guestfs CMD --help`, and a
mention where the command is documented (its README bullet, or the docs page of the
command). Defaults agree: what --help says is the parser's default, and what README says
is what --help says."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from guestfs.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
# Where each command is documented beside its README bullet.
PAGES = {
    "explain": ["docs/limits.md", "docs/explain-json.md"],
    "show": ["docs/files.md"],
    "mount": ["docs/mount.md"],
    "fuse-holder": ["docs/mount.md"],
    "run": ["docs/run.md", "docs/syscalls.md"],
    "attach": ["docs/deploy.md"],
    "oci-hook": ["docs/deploy.md"],
    "seccomp-agent": ["docs/syscalls.md"],
    "seccomp-guard": ["docs/syscalls.md"],
    "webhook": ["docs/deploy.md"],
}
# Options deliberately left out of --help (argparse.SUPPRESS), with the reason. None today.
HIDDEN: dict[tuple[str, str], str] = {}
# What README states as the default of an option, worked out from the code by hand:
# guestfs/__init__.py (DEFAULT_MOUNTPOINT, DEFAULT_HOOK_SOURCE), daemon/server.py
# (DEFAULT_VIEW, DEFAULT_CACHE_TTL), options.py (run's view, "ceil"), cli.py, webhook/files.py
# and cli/webhook.py (the webhook's).
README_DEFAULTS = {
    ("mount", "--view"): "caller",
    ("run", "--view"): "self",
    ("mount", "--cache-ttl"): "0.5",
    ("run", "--mountpoint"): "/run/guestfs",
    ("run", "--cpu-affinity"): "view",
    ("attach", "--source"): "/run/guestfs",
    ("attach", "--interval"): "2",
    ("oci-hook", "--source"): "/var/lib/guestfs/by-container",
    ("oci-hook", "--timeout"): "5",
    ("seccomp-agent", "--socket"): "/run/guestfs-seccomp/agent.sock",
    ("seccomp-agent", "--source"): "/var/lib/guestfs/by-container",
    ("seccomp-agent", "--cpu-affinity"): "view",
    ("seccomp-guard", "--dir"): "/run/guestfs-seccomp",
    ("webhook", "--source"): "/var/lib/guestfs/by-caller",
    ("webhook", "--files"): "meminfo,cpuinfo,stat,uptime,loadavg,swaps,diskstats,online",
    ("webhook", "--seccomp-profile"): "guestfs-notify.json",
    ("webhook", "--max-request-bytes"): "3145728",
    ("webhook", "--request-timeout"): "10",
    ("webhook", "--max-connections"): "128",
    ("explain", "--cpu-rounding"): "ceil",
    ("explain", "--memory-divisor"): "1",
}


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options() -> list[tuple[str, str, argparse.Action]]:
    """(command, long option, action) for every option but --help."""
    return [(name, opt, action) for name, p in commands().items() for action in p._actions
            for opt in action.option_strings
            if opt.startswith("--") and not isinstance(action, argparse._HelpAction)]


def mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def readme_text(command: str) -> str:
    """The README bullets of the Commands section that show `guestfs COMMAND` (the
    seccomp agent's also shows the guard's), and for the commands that take them the
    limit options' table."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    chunks = re.split(r"\n(?=- `guestfs )|\n\n", section)
    mine = [c for c in chunks if f"`guestfs {command} " in c or f"`guestfs {command}`" in c]
    table = next(c for c in chunks if c.startswith("Limit options, shared by"))
    if f"`{command}`" in table.split(":", 1)[0]:
        mine.append(section[section.index(table):])
    return "\n".join(mine)


def documented_text(command: str) -> str:
    return "\n".join([readme_text(command),
                      *((REPO / p).read_text() for p in PAGES[command])])


def test_every_command_has_a_place_in_the_docs():
    assert sorted(commands()) == sorted(PAGES)
    for name in commands():
        assert readme_text(name), f"README.md has no bullet for `guestfs {name}`"


OPTIONS = options()


@pytest.mark.parametrize(("command", "opt", "action"), OPTIONS,
                         ids=[f"{c} {o}" for c, o, _ in OPTIONS])
def test_every_option_has_help(command, opt, action):
    if action.help == argparse.SUPPRESS:
        assert (command, opt) in HIDDEN, f"guestfs {command} {opt} is hidden from --help"
        return
    assert action.help and action.help.strip(), f"guestfs {command} {opt}: no help text"


@pytest.mark.parametrize(("command", "opt", "action"), OPTIONS,
                         ids=[f"{c} {o}" for c, o, _ in OPTIONS])
def test_every_option_is_in_the_commands_docs(command, opt, action):
    if (command, opt) in HIDDEN:
        return
    assert mentions(documented_text(command), opt), \
        f"guestfs {command} {opt}: in neither its README bullet nor {PAGES[command]}"


def shown(default: object) -> str:
    return f"{default:g}" if isinstance(default, float) else str(default)


@pytest.mark.parametrize(("command", "opt", "action"), OPTIONS,
                         ids=[f"{c} {o}" for c, o, _ in OPTIONS])
def test_help_states_the_parsers_default(command, opt, action):
    """A default the parser fills in (a path, a number, a choice) is the one --help
    names; flags (store_true/false) and options without one have nothing to state."""
    default = action.default
    if default in (None, True, False, [], argparse.SUPPRESS) or action.nargs == 0:
        return
    assert re.search(rf"default:? '?{re.escape(shown(default))}'?(?![\w.])",
                     action.help or "") or \
        re.search(rf"'?{re.escape(shown(default))}'? \(default\)", action.help or ""), \
        f"guestfs {command} {opt}: default {shown(default)} not in its help: {action.help}"


@pytest.mark.parametrize(("command", "opt"), list(README_DEFAULTS),
                         ids=[f"{c} {o}" for c, o in README_DEFAULTS])
def test_readme_states_the_default_help_states(command, opt):
    value = README_DEFAULTS[(command, opt)]
    action = next(a for c, o, a in OPTIONS if (c, o) == (command, opt))
    if action.default is not None:
        assert shown(action.default) == value, (command, opt, action.default)
    assert re.search(rf"default:? '?{re.escape(value)}'?(?![\w.])|'?{re.escape(value)}'? "
                     r"\(default\)", action.help or ""), (command, opt, action.help)
    text = readme_text(command)
    # The option, then within the same sentence "default" and the value.
    found = [m for m in re.finditer(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text)
             if re.search(rf"default[^.]{{0,80}}?`?{re.escape(value)}`?(?![\w.])",
                          text[m.start():m.start() + 400].split(". ")[0])]
    assert found, f"README's guestfs {command} does not state {opt}'s default {value}"
