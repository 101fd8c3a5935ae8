"""What every command shares: the settings resolved from file, environment and global flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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
