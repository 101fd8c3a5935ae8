"""The ``exactly`` command line: global options, sub-command groups, errors told in a few lines
of 80 columns (never a traceback, unless it is a bug)."""

from __future__ import annotations

import importlib
import io
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import Context
from exactly.errors import ExactlyError
from exactly.text import message

cli = typer.Typer(
    name="exactly",
    help="An effectively-once analytics event pipeline on Apache Spark.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's plain help: Rich markup would eat every [section] named in the help, and click
    # rewraps a docstring's paragraphs to the terminal instead of keeping its line breaks
    rich_markup_mode=None,
)

GLOBAL_OPTIONS = ("--config", "--data-dir", "--log")
GLOBAL_FLAGS = ("--verbose",)  # global options that take no value
VERBOSE = "EXACTLY_VERBOSE"  # read by exactly.spark.session (not imported: slower start)


@cli.callback()
def global_options(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(help="TOML config file (default ./exactly.toml).", envvar="EXACTLY_CONFIG"),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where embedded defaults live (default ./.exactly).", envvar="EXACTLY_DATA_DIR"
        ),
    ] = None,
    log: Annotated[
        str | None,
        typer.Option(
            help="Log URL: sqlite://DIR or kafka://HOST:PORT (default: sqlite in the data dir).",
            envvar="EXACTLY_LOG__URL",
        ),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Show what Spark's JVM prints (its log at WARN and above, the JDK's and the "
            "launcher's messages); without it they go to DATA_DIR/logs/spark-*.log only.",
            envvar=VERBOSE,
        ),
    ] = False,
) -> None:
    """Global options; they may also be given after the sub-command."""
    if verbose:  # read where a session starts (spark/session.py), here and in child processes
        os.environ[VERBOSE] = "1"
    ctx.obj = Context(config=config, data_dir=data_dir, log_url=log)


def hoist_global_options(args: list[str]) -> list[str]:
    """Move global options given after a sub-command to the front, where click expects them."""
    front: list[str] = []
    rest: list[str] = []
    at = 0
    while at < len(args):
        arg = args[at]
        if arg == "--":
            rest += args[at:]
            break
        name = arg.split("=", 1)[0]
        if arg in GLOBAL_FLAGS:
            front.append(arg)
        elif name in GLOBAL_OPTIONS:
            if "=" in arg:
                front.append(arg)
            else:
                front += args[at : at + 2]
                at += 1
        else:
            rest.append(arg)
        at += 1
    return front + rest


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI; a user's error is told (within 80 columns) and exits 1.

    click (typer's) runs outside its standalone mode so that its usage errors are told here too,
    in the same lines of 80 columns; what standalone mode did with the rest is done here (a
    command's ``typer.Exit(code)`` comes back as its return value).
    """
    args = hoist_global_options(sys.argv[1:] if argv is None else argv)
    named = sub_command(args)
    add_sub_commands([named] if named else SUB_COMMANDS)
    try:
        code = cli(args=args, prog_name="exactly", standalone_mode=False)
    except typer.TyperException as error:  # a usage error: what click says, in 80 columns
        print(message(usage_error(error)), file=sys.stderr)
        sys.exit(error.exit_code)
    except typer.Abort:  # end of input at a prompt
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except Exception as error:
        told = one_line(error)
        if told is None:
            raise
        print(message(f"error: {told}"), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)  # as standalone mode did: a SystemExit, 0 after success


def usage_error(error: typer.TyperException) -> str:
    """What click's standalone mode printed of ``error``: the usage, a hint, ``Error: ...``."""
    shown = io.StringIO()
    show = getattr(error, "show", None)  # every error of typer's click has it
    if show is None:
        return f"Error: {error.format_message()}"
    show(file=shown)
    return shown.getvalue().rstrip("\n")


def one_line(error: Exception) -> str | None:
    """What the user is told of ``error``, in one line; None for a bug (then a traceback).

    Spark's JVM gone comes before the ``OSError`` catch-all: py4j's refused reconnection is an
    ``OSError`` too, and it is not the data dir's fault.
    """
    if isinstance(error, ExactlyError):
        return str(error)
    from exactly.spark.streaming import JVM_EXITED, jvm_exited

    if jvm_exited(error):
        return JVM_EXITED
    if isinstance(error, OSError):  # a read-only or full data dir, a missing permission
        where = f" {error.filename}" if error.filename else ""
        return (
            f"cannot use{where}: {error.strerror or error}; check that the data dir "
            "(--data-dir, EXACTLY_DATA_DIR) and the files under it are writable"
        )
    return None


# Each sub-command's name, the module of exactly.cli that holds it and the function there (or
# the sub-group's Typer, ``app``). A command line imports only the module of the sub-command it
# names: all of them take about 0.13 CPU s to import, of a call's 0.6-0.95 s, and the tests and
# ``exactly up`` make thousands of calls.
SUB_COMMANDS: dict[str, tuple[str, str]] = {
    "log": ("log", "app"),
    "sink": ("sink", "app"),
    "copy": ("copy", "copy"),
    "doctor": ("doctor", "doctor"),
    "demo": ("demo", "demo"),
    "collect": ("collect", "collect"),
    "import": ("import_file", "import_file"),
    "dedupe": ("dedupe", "dedupe"),
    "status": ("status", "status"),
    "aggregate": ("aggregate", "aggregate"),
    "stats": ("aggregate", "stats"),
    "audit": ("aggregate", "audit"),
    "lake": ("lake", "app"),
    "route": ("route", "route"),
    "deliver": ("deliver", "deliver"),
    "deliveries": ("deliveries", "app"),
    "up": ("up", "up"),
    "pipeline": ("up", "pipeline"),
    "replay": ("replay", "replay"),
    "backfill": ("backfill", "backfill"),
    "forget": ("forget", "forget"),
    "trace": ("trace", "trace"),
    "transform": ("transform", "transform"),
}
HIDDEN = frozenset({"pipeline"})  # run by ``exactly up`` for each stage, not by users
_added: set[str] = set()


def add_sub_commands(names: Iterable[str] = SUB_COMMANDS) -> typer.Typer:
    """Add the sub-commands ``names`` (default: all) to the CLI, importing their modules."""
    for name in names:
        if name in _added:
            continue
        module, attribute = SUB_COMMANDS[name]
        found = getattr(importlib.import_module(f"exactly.cli.{module}"), attribute)
        if isinstance(found, typer.Typer):
            cli.add_typer(found, name=name)
        else:
            cli.command(name, hidden=name in HIDDEN)(found)
        _added.add(name)
    return cli


def sub_command(args: list[str]) -> str | None:
    """The sub-command ``args`` name (global options first, as :func:`hoist_global_options`
    leaves them), or None when they name none that exists (``--help``, a misspelling)."""
    at = 0
    while at < len(args):
        name = args[at].split("=", 1)[0]
        if args[at] in GLOBAL_FLAGS:
            at += 1
        elif name in GLOBAL_OPTIONS:
            at += 1 if "=" in args[at] else 2
        else:
            return args[at] if args[at] in SUB_COMMANDS else None
    return None


def __getattr__(name: str) -> typer.Typer:
    """``exactly.cli.app``: the CLI with every sub-command, for tests and tools that walk it."""
    if name == "app":
        return add_sub_commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
