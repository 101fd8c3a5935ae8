"""What every command shares: the settings resolved from file, environment and global flags."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import typer

from exactly.config import Settings, load_settings
from exactly.log import Log, open_log
from exactly.text import message


@dataclass
class Context:
    config: Path | None = None
    data_dir: Path | None = None
    log_url: str | None = None
    master: str | None = None  # a command's --master: overrides [spark] master
    flags: dict[str, Any] = field(default_factory=dict)  # a command's flags, by setting path
    _settings: Settings | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        """The settings: file, environment, then the global flags and the command's flags."""
        if self._settings is None:
            self._settings = load_settings(
                self.config,
                data_dir=self.data_dir,
                **{"log.url": self.log_url, "spark.master": self.master, **self.flags},
            )
        return self._settings

    def open_log(self) -> Log:
        return open_log(self.settings.log_url, max_record_bytes=self.settings.log.max_record_bytes)


def context(ctx: typer.Context) -> Context:
    found = ctx.find_root().obj
    return found if isinstance(found, Context) else Context()


def with_master(ctx: typer.Context, master: str | None) -> Context:
    """The context, with ``--master`` (when given) in place of ``[spark] master``."""
    return with_flags(ctx, {}, master=master)


def with_flags(
    ctx: typer.Context, flags: Mapping[str, Any], *, master: str | None = None
) -> Context:
    """The context, with a command's flags over the settings they name.

    ``flags``: each flag's value by its setting's dotted path (``{"aggregate.url": db}``); None,
    a flag not given, leaves the setting to the file and its ``EXACTLY_*`` variable. The values
    are checked as the file's are (:func:`~exactly.config.load_settings`).
    """
    found = context(ctx)
    given = {path: value for path, value in flags.items() if value is not None}
    if master is not None:
        found.master = master
    if given or master is not None:
        found.flags.update(given)
        found._settings = None
    return found


def stop_if_never_ran(settings: Settings, *stores: tuple[Path | None, str]) -> None:
    """Stop a read-only command, exit status 1, if an embedded store it reads is not there.

    ``stores``: each store's file or directory (None: a server, which is asked instead) and the
    command that makes it (``"exactly aggregate"``). Opening an embedded store creates it, so a
    look at a data dir where nothing ran would leave empty databases behind, and from the wrong
    directory would answer as if nothing was there. One message on stderr instead: "nothing has
    run in DIR yet", DIR the data dir (or the store's own path outside it), naming the command
    that makes the store when the data dir exists; within 80 columns, a long DIR on a line of
    its own.
    """
    for path, maker in stores:
        if path is not None and not path.exists():
            never_ran(settings, path.resolve(), maker)


def never_ran(settings: Settings, path: Path | None = None, maker: str = "") -> NoReturn:
    """Say "nothing has run in DIR yet" on stderr and exit 1 (:func:`stop_if_never_ran`)."""
    data_dir = settings.data_dir.resolve()
    if path is not None and not path.is_relative_to(data_dir):
        line = f"nothing has run in {path} yet ({maker} makes it)"
    elif path is not None and data_dir.exists():
        inside = path.relative_to(data_dir)
        line = f"nothing has run in {data_dir} yet: no {inside} ({maker} makes it)"
    else:
        line = f"nothing has run in {data_dir} yet"
    print(message(line), file=sys.stderr)
    raise typer.Exit(1)
