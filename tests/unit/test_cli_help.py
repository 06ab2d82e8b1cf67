"""Help text on every option of every `rofu` parser: the service's commands, and the own
parsers of replay, ope, evaluate and each `rofu bench` benchmark."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import import_module

import pytest

from rofu import cli

#: command -> (module, function) building the parser that takes its arguments
HARNESS_PARSERS = {
    "replay": ("rofu.replay.arguments", "build_parser"),
    "ope": ("rofu.replay.ope_cli", "build_ope_parser"),
    "evaluate": ("rofu.evaluation.evaluate", "build_parser"),
}


def arguments(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    """(`prog` and name, action) of every argument of `parser` and its sub-commands'."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += arguments(sub)
        else:
            name = "/".join(action.option_strings) or action.dest
            found.append((f"{parser.prog} {name}", action))
    return found


def silent(parser: argparse.ArgumentParser) -> list[str]:
    """Every argument of `parser` and its sub-commands' parsers without help text."""
    return [name for name, action in arguments(parser) if not action.help]


def every_parser() -> dict[str, argparse.ArgumentParser]:
    """The `rofu` parser and each harness command's and benchmark's own parser."""
    builders: dict[str, Callable[[], argparse.ArgumentParser]] = {"rofu": cli.build_parser}
    for command, (module, function) in HARNESS_PARSERS.items():
        builders[command] = getattr(import_module(module), function)
    for name, (module, _) in cli.BENCHMARKS.items():
        builders[f"bench {name}"] = import_module(module).build_parser
    return {name: build() for name, build in builders.items()}


def test_every_harness_command_and_benchmark_has_its_parser_walked() -> None:
    assert set(HARNESS_PARSERS) == set(cli.HARNESS)
    assert set(every_parser()) == {"rofu", *cli.HARNESS, *(f"bench {b}" for b in cli.BENCHMARKS)}


def test_every_option_of_every_rofu_parser_has_help_text() -> None:
    parsers = every_parser()
    walked = {name for parser in parsers.values() for name, _ in arguments(parser)}
    assert {
        "rofu serve --workers",
        "rofu export --format",
        "rofu replay --http",
        "rofu ope --campaign",
        "rofu evaluate --ci",
        "rofu bench kernel --device",
        "rofu bench load --seed",
        "rofu bench stability --every",
    } <= walked
    missing = [name for parser in parsers.values() for name in silent(parser)]
    assert missing == []


def test_the_walk_finds_an_option_without_help() -> None:
    parser = argparse.ArgumentParser(prog="probe")
    commands = parser.add_subparsers()
    commands.add_parser("sub").add_argument("--quiet-one")
    parser.add_argument("--fine", help="has help")
    assert silent(parser) == ["probe sub --quiet-one"]


@pytest.mark.parametrize(
    "name", ["bench kernel", "bench load", "bench stability", "ope", "evaluate", "replay"]
)
def test_every_harness_help_renders(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*name.split(), "--help"])
    assert exited.value.code == 0
    assert "--" in capsys.readouterr().out
