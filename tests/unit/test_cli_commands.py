"""cli/main.py builds only the parser of the command named first; its table of which
module registers which command must match what the modules register."""

from __future__ import annotations

import argparse

import pytest

from guestfs.cli.main import MODULE_OF, build_parser, commands


def _registered(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_every_command_is_listed_in_help_order() -> None:
    assert _registered(build_parser()) == list(MODULE_OF)


@pytest.mark.parametrize("name", sorted(MODULE_OF))
def test_the_module_named_for_a_command_registers_it(name: str) -> None:
    (module,) = commands(name)
    assert module.__name__ == f"guestfs.cli.{MODULE_OF[name]}"
    assert name in _registered(build_parser([name, "--help"]))


def test_an_unknown_first_word_gets_every_command_to_choose_from() -> None:
    assert _registered(build_parser(["runx"])) == list(MODULE_OF)
