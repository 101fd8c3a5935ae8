"""Every command's ``--help`` at 80 columns keeps its words, fits, and reads as wrapped paragraphs.

Rich markup once ate every ``[section]`` the help names (``exactly up --help`` read "the collector
()"), and docstring line breaks showed mid-sentence; this renders the help of every command and
sub-command as a user sees it in an 80-column terminal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from exactly.cli import app

WIDTH = 80
BRACKETED = re.compile(r"\[\[?[^\[\]]*\]?\]")  # [collector], [[destinations]], local[N], []
SECTION = re.compile(r"\s*(╭─ )?(Arguments|Options|Commands)\b")  # plain or Rich panels


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each command of the tree under ``command`` with the words that call it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


COMMANDS = dict(commands(typer.main.get_command(app)))


def source_texts(command: Any) -> list[str]:
    """The help text as written: the command's docstring and each parameter's help."""
    texts = [command.help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return [text for text in texts if text]


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def description(rendered: str) -> list[list[str]]:
    """The paragraphs between the usage line and the first section (Arguments, Options …)."""
    lines = rendered.splitlines()
    start = next(at for at, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:]:
        if SECTION.match(line):
            break
        if line.strip():
            paragraphs[-1].append(line.rstrip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [paragraph for paragraph in paragraphs if paragraph]


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda path: " ".join(path) or "exactly")
def test_help_keeps_every_word_and_fits_80_columns(path: tuple[str, ...]) -> None:
    done = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert done.exit_code == 0, done.output
    shown = squeezed(done.output)
    for text in source_texts(COMMANDS[path]):
        for bracketed in BRACKETED.findall(text):
            assert squeezed(bracketed) in shown, f"{bracketed!r} lost from the help"
        assert squeezed(text) in shown, f"help text changed in rendering: {text!r}"
    too_wide = [line for line in done.output.splitlines() if len(line) > WIDTH]
    assert not too_wide
    # a paragraph is filled: the next line's first word would not have fitted on the line before
    # (a formatter keeps a margin of up to 4 columns); a docstring's own line breaks fail this
    for paragraph in description(done.output):
        for line, following in pairwise(paragraph):
            assert len(line) + 1 + len(following.split()[0]) > WIDTH - 4, (line, following)


def test_the_walk_reaches_every_group_and_sub_command() -> None:
    assert {("log", "append"), ("sink", "release"), ("deliveries", "expire"), ("up",)} <= set(
        COMMANDS
    )
