"""What every command shares: the settings resolved from file, environment and global flags."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import typer

from exactly.config import Settings, load_settings
from exactly.log import Log, open_log


@dataclass
class Context:
    config: Path | None = None
    data_dir: Path | None = None
    log_url: str | None = None
    master: str | None = None  # a command's --master: overrides [spark] master
    _settings: Settings | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(
                self.config, data_dir=self.data_dir, log_url=self.log_url
            )
            if self.master is not None:
                spark = self._settings.spark.model_copy(update={"master": self.master})
                self._settings = self._settings.model_copy(update={"spark": spark})
        return self._settings

    def open_log(self) -> Log:
        return open_log(self.settings.log_url, max_record_bytes=self.settings.log.max_record_bytes)


def context(ctx: typer.Context) -> Context:
    found = ctx.find_root().obj
    return found if isinstance(found, Context) else Context()


def with_master(ctx: typer.Context, master: str | None) -> Context:
    """The context, with ``--master`` (when given) in place of ``[spark] master``."""
    found = context(ctx)
    if master is not None:
        found.master = master
        found._settings = None
    return found


def stop_if_never_ran(settings: Settings, *stores: tuple[Path | None, str]) -> None:
    """Stop a read-only command, exit status 1, if an embedded store it reads is not there.

    ``stores``: each store's file or directory (None: a server, which is asked instead) and the
    command that makes it (``"exactly aggregate"``). Opening an embedded store creates it, so a
    look at a data dir where nothing ran would leave empty databases behind, and from the wrong
    directory would answer as if nothing was there. One line on stderr instead: "nothing has run
    in DIR yet", DIR the data dir (or the store's own path outside it), naming the command that
    makes the store when the data dir exists.
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
    print(line, file=sys.stderr)
    raise typer.Exit(1)
