"""Configuration: one TOML file, environment overrides, one frozen model.

Precedence, highest first: command-line flags, ``EXACTLY_*`` environment variables (nested keys
joined by ``__``, e.g. ``EXACTLY_LOG__URL``), the TOML file (``./exactly.toml`` or ``--config``),
defaults. Every embedded default lives under ``data_dir`` (default ``.exactly``).

A relative path written in the file is relative to the file's directory, so a command finds the
same data wherever it runs from (:func:`anchor_paths`); so is the default ``data_dir`` when there
is a file. Paths given as flags or ``EXACTLY_*`` variables, and every path when there is no file,
are relative to the working directory, as a shell user expects.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from exactly.aggregate.settings import AggregateSettings
from exactly.collector.settings import CollectorConfig
from exactly.console.settings import ConsoleSettings
from exactly.dedupe.settings import DedupeSettings
from exactly.delivery.settings import DeliverySettings, DestinationSettings, unique_names
from exactly.errors import ConfigError
from exactly.lake.settings import LakeSettings
from exactly.log.settings import LogSettings
from exactly.spark.settings import SparkSettings

DEFAULT_CONFIG = Path("exactly.toml")


class Settings(BaseSettings):
    """Everything configurable; build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix="EXACTLY_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    data_dir: Path = Field(Path(".exactly"), description="where every embedded default lives")
    log: LogSettings = LogSettings()
    spark: SparkSettings = SparkSettings()
    aggregate: AggregateSettings = AggregateSettings()
    dedupe: DedupeSettings = DedupeSettings()
    lake: LakeSettings = LakeSettings()

    collector: CollectorConfig = CollectorConfig()
    console: ConsoleSettings = ConsoleSettings()
    delivery: DeliverySettings = DeliverySettings()
    destinations: tuple[DestinationSettings, ...] = Field(
        (), description="[[destinations]]: HTTP endpoints events are delivered to"
    )

    @field_validator("destinations")
    @classmethod
    def _unique_destinations(
        cls, value: tuple[DestinationSettings, ...]
    ) -> tuple[DestinationSettings, ...]:
        return unique_names(value)

    @property
    def log_url(self) -> str:
        return self.log.url or f"sqlite://{self.data_dir.resolve() / 'log'}"

    @property
    def aggregate_url(self) -> str:
        return self.aggregate.url or f"sqlite://{self.data_dir.resolve() / 'aggregates.db'}"

    @property
    def lake_url(self) -> str:
        return self.lake.url or f"delta://{self.default_lake}"

    @property
    def default_lake(self) -> Path:
        """The embedded Delta table's directory, when ``[lake] url`` is not set."""
        return self.data_dir.resolve() / "lake" / "events"

    @property
    def has_lake(self) -> bool:
        """Whether there is a lake to read (status, audit, trace): a ``[lake] url``, or the
        default table once something wrote it."""
        return bool(self.lake.url) or self.default_lake.exists()

    @property
    def jobdb_url(self) -> str:
        return self.delivery.jobdb or f"sqlite://{self.data_dir.resolve() / 'jobdb'}"

    @property
    def archive_url(self) -> str:
        return self.delivery.archive or str(self.data_dir.resolve() / "archive")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, FileSource(settings_cls)


class FileSource(TomlConfigSettingsSource):
    """The TOML file, its relative paths made relative to the file's directory."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        document = super()._read_file(file_path)
        return anchor_paths(document, Path(file_path).resolve().parent)


def anchor_paths(document: dict[str, Any], base: Path) -> dict[str, Any]:
    """``document`` (a config file's content) with each relative path in it joined to ``base``.

    The paths: ``data_dir`` (``.exactly`` when not given), the embedded stores' URLs (``[log]
    url`` and ``[delivery] jobdb`` as ``sqlite://DIR``, ``[aggregate] url`` as
    ``sqlite://FILE``, ``[dedupe] store`` as ``rocksdb://DIR`` or ``spark-state://DIR``,
    ``[lake] url`` as ``delta://DIR`` or ``iceberg://DIR``), ``[delivery] archive`` (a
    directory or ``file://DIR``) and a destination's ``transform_dir`` (the file's directory
    when the destination has a ``transform``). A server's URL is left as written, and so are
    ``file:PATH`` secret references, which each process (a Spark executor too) reads from its
    own working directory.
    """
    found = dict(document)
    data_dir = found.get("data_dir", ".exactly")
    found["data_dir"] = _anchored(data_dir, base) if isinstance(data_dir, str) else data_dir
    for section, key, schemes in (
        ("log", "url", ("sqlite",)),
        ("aggregate", "url", ("sqlite",)),
        ("dedupe", "store", ("rocksdb", "spark-state")),
        ("delivery", "jobdb", ("sqlite",)),
        ("lake", "url", ("delta", "iceberg")),
        ("delivery", "archive", ("file", "")),
    ):
        table = found.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str):
            found[section] = {**table, key: _anchored_url(table[key], base, schemes)}
    destinations = found.get("destinations")
    if isinstance(destinations, list):  # a transform's module is looked for beside the file
        found["destinations"] = [
            {**entry, "transform_dir": _anchored(entry.get("transform_dir", "."), base)}
            if isinstance(entry, dict)
            and "transform" in entry
            and isinstance(entry.get("transform_dir", "."), str)
            else entry
            for entry in destinations
        ]
    return found


def _anchored(path: str, base: Path) -> str:
    given = Path(path).expanduser()
    return str(given if given.is_absolute() else base / given)


def _anchored_url(url: str, base: Path, schemes: tuple[str, ...]) -> str:
    """``url`` with its relative path joined to ``base`` when its scheme is one of ``schemes``
    (``""``: a plain path); a URL of another scheme, or naming no path, is returned as given."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if scheme not in schemes or rest in ("", "/"):
        return url
    return f"{scheme}{sep}{_anchored(rest, base)}"


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from error


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``config`` (or ./exactly.toml if present), the environment and ``overrides``.

    ``overrides`` are the flags given on the command line, over the file and the environment:
    each by its setting's dotted path (``**{"collector.port": 9000}``), as nested keys
    (``collector={"port": 9000}``) or, at the top, by name (``data_dir=...``); ``log_url`` is
    ``log.url``. None values are ignored. They are validated like the file's values: raises
    :class:`ConfigError` naming the offending key.
    """
    path = config
    if path is None:
        env_path = os.environ.get("EXACTLY_CONFIG")
        path = Path(env_path) if env_path else (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    document = read_toml(path) if path is not None else {}

    class FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=path)

    given = nested_overrides(overrides)
    try:
        return FileSettings(**given)
    except ValidationError as error:
        first = error.errors()[0]
        where = _where(first["loc"], document) or "config"
        message = first["msg"]
        if first["type"] == "extra_forbidden" and where.startswith("dedupe.redis"):
            message = (
                "not a setting any more: give the redis store as one URL, "
                'dedupe.store = "redis://HOST:PORT,HOST:PORT/DB" (EXACTLY_DEDUPE__STORE)'
            )
        if _given(first["loc"], given):
            raise ConfigError(
                f"setting {where}: {message} (check the command-line flag or its EXACTLY_* "
                "variable)"
            ) from error
        origin = f" in {path}" if path is not None else ""
        raise ConfigError(
            f"setting {where}{origin}: {message} (check the file or EXACTLY_* variables)"
        ) from error
    except SettingsError as error:  # an EXACTLY_* variable that is not valid JSON for its key
        raise ConfigError(f"{error} (check the EXACTLY_* variables)") from error


def nested_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"collector.port": 1, "log_url": "x"}`` as ``{"collector": {"port": 1}, "log": {"url":
    "x"}}``, None values left out; keys given as nested dicts are taken the same way."""
    given: dict[str, Any] = {}
    for key, value in _flat(overrides):
        parts = ("log", "url") if key == "log_url" else tuple(key.split("."))
        node = given
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"setting {key}: {part} is not a section")
        node[parts[-1]] = value
    return given


def _flat(overrides: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in overrides.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        elif value is not None:
            yield f"{prefix}{key}", value


def _given(loc: tuple[int | str, ...], given: dict[str, Any]) -> bool:
    """Whether the value at ``loc`` (or a section holding it) came from ``given`` (the flags)."""
    node: Any = given
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        if not isinstance(node, dict):
            return True
    return True


def _where(loc: tuple[int | str, ...], document: dict[str, Any]) -> str:
    """``destinations[0] (orders-hook).backoff.min`` for a location pydantic gives as a tuple."""
    where = ""
    node: Any = document
    for part in loc:
        if isinstance(part, int):
            where += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                where += f" ({node['name']})"
        else:
            where += f".{part}" if where else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return where
