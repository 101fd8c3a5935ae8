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
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from exactly.delivery.settings import DeliverySettings, DestinationSettings, unique_names
from exactly.errors import ConfigError

DEFAULT_CONFIG = Path("exactly.toml")
SOURCE_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")  # use fullmatch: "$" would let "web\n" pass


class LogSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(None, description="log URL; default sqlite://DATA_DIR/log")
    max_record_bytes: int = Field(1024 * 1024, gt=0, description="largest record accepted")


class SparkSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = Field("local[*]", description="Spark master URL")
    class_sharing: bool = Field(
        True,
        description="start the driver JVM from an archive of Spark's classes, made once in the "
        "background under ~/.cache/exactly (a streaming command starts about a quarter sooner)",
    )


class AggregateTableSettings(BaseModel):
    """A user-defined aggregate table: ``[[aggregate.tables]]`` (see docs/aggregate.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="SQL table name")
    group_by: dict[str, str] = Field(description="column name -> Spark SQL expression")
    measures: dict[str, str] = Field(description="column name -> count(...) or sum(...)")


class AggregateSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(None, description="sqlite:///FILE or postgresql://...")
    tables: tuple[AggregateTableSettings, ...] = Field((), description="user-defined tables")
    retry_seconds: float = Field(
        600.0, ge=0, description="how long a micro-batch retries an unavailable database"
    )


class DedupeSettings(BaseModel):
    """``[dedupe]``: where seen messageIds are kept, for how long, and what makes two records
    duplicates (see docs/dedupe.md); ``exactly dedupe``'s flags override each."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str = Field(
        "rocksdb",
        description="store URL: rocksdb (DATA_DIR/dedupe/SOURCE/rocksdb) or rocksdb://DIR; "
        "redis://HOST:PORT[,HOST:PORT...][/DB][?namespace=..&buckets=..&slot=..&previous=.."
        "&cutover=..]; spark-state (Spark's own state, in the query's checkpoint)",
    )
    window: str = Field("24h", description="how long a messageId is remembered")
    max_keys: int | None = Field(None, ge=1, description="rocksdb: ids kept per partition at most")
    max_bytes: str | None = Field(None, description="rocksdb: disk per partition at most")
    min_window: str = Field("24h", description="warn when the bounds shrink the window below")
    scope: Literal["source", "workspace"] = Field(
        "source",
        description="source: a messageId is a duplicate only of one from the same source, so "
        "no write key can suppress another source's events; workspace: of any source",
    )

    @field_validator("window", "min_window")
    @classmethod
    def _duration(cls, value: str) -> str:
        from exactly.units import parse_duration

        try:
            parse_duration(value)
        except ConfigError as error:
            raise ValueError(str(error).removeprefix("window ")) from None
        return value

    @field_validator("max_bytes")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        from exactly.units import parse_size

        if value is not None:
            try:
                parse_size(value)
            except ConfigError as error:
                raise ValueError(str(error).removeprefix("size ")) from None
        return value


class CollectorConfig(BaseModel):
    """``[collector]``: the tracking API served by ``exactly collect`` (docs/collector.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8088, ge=0, le=65535, description="port to listen on")
    workers: int = Field(1, ge=1, le=256, description="worker processes")
    topic: str = Field("raw", description="topic the events go to")
    partitions: int = Field(8, ge=1, le=4096, description="partitions of the topic, if created")
    max_queue_mb: int = Field(64, ge=1, description="events waiting for the log, per worker")
    sources: Annotated[dict[str, SecretStr], NoDecode] = Field(
        default_factory=dict, description="source name -> write key"
    )
    max_buffered_mb: int = Field(
        200,
        ge=1,
        description="MB of request bodies still arriving that each worker buffers at most; "
        "beyond, a body waits up to 1 s, then gets 503 with Retry-After",
    )
    max_event_bytes: int = Field(
        32 * 1024, ge=1024, le=64 * 1024 * 1024, description="largest event, as stored"
    )
    max_append_mb: float = Field(
        8.0, gt=0, description="most one request may append, as stored (after batch context)"
    )
    read_timeout: float = Field(10.0, gt=0, description="seconds a request body may stall")
    body_timeout: float = Field(
        30.0, gt=0, description="seconds a whole request body may take to arrive (408 beyond)"
    )
    shutdown_timeout: float = Field(10.0, gt=0, description="seconds SIGTERM waits for requests")
    idle_timeout: float = Field(
        5.0,
        gt=0,
        description="seconds a connection may stay open without a whole request head "
        "(idle keep-alive, a new connection that sends nothing, slow headers)",
    )
    max_connections: int = Field(
        10_000, ge=16, description="open connections per worker; more wait in the listen backlog"
    )
    allowed_origins: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="source name -> origins of the pages it takes events from "
        '(["https://shop.example"]); a source not named takes any',
    )

    rate_limit: float = Field(
        0.0,
        ge=0,
        description="requests per second a client address may send to a source, per worker "
        "(0: no limit); 429 with Retry-After beyond",
    )
    rate_limits: dict[str, float] = Field(
        default_factory=dict, description="source name -> its own rate_limit (0: no limit)"
    )
    rate_limit_burst: int = Field(
        20, ge=1, description="requests a quiet client may send at once before the rate applies"
    )
    max_expansion: float = Field(
        100.0,
        ge=1,
        description="most one request may store (after inflating and copying the batch context "
        "into each event) per byte it sent, beyond 64 KiB; 413 beyond",
    )
    byte_limit: int = Field(
        0,
        ge=0,
        description="bytes per second, as stored, a client address may send to a source, per "
        "worker (0: no limit), 10 s worth at once; 429 with Retry-After beyond",
    )
    byte_limits: dict[str, int] = Field(
        default_factory=dict, description="source name -> its own byte_limit (0: no limit)"
    )

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        from exactly.collector.cors import normalise_origin

        return {
            name: tuple(normalise_origin(origin) for origin in origins)
            for name, origins in value.items()
        }

    @field_validator("sources", mode="before")
    @classmethod
    def _sources_from_text(cls, value: object) -> object:
        """``EXACTLY_COLLECTOR__SOURCES=web=KEY1,ios=KEY2`` (or a table in the file)."""
        if not isinstance(value, str):
            return value
        sources: dict[str, str] = {}
        for part in filter(None, (text.strip() for text in value.split(","))):
            name, sep, key = part.partition("=")
            if not sep or not key:
                raise ValueError(f"a source is NAME=WRITE_KEY, not {name!r}")
            sources[name] = key
        return sources

    @field_validator("sources")
    @classmethod
    def _source_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, key in value.items():
            if not SOURCE_NAME.fullmatch(name):
                raise ValueError(
                    f"source name {name!r} is not allowed: "
                    "use 1 to 100 letters, digits, '.', '_' or '-'"
                )
            if not key.get_secret_value():
                raise ValueError(f"source {name!r} has an empty write key")
        keys = [key.get_secret_value() for key in value.values()]
        if len(set(keys)) != len(keys):
            raise ValueError("two sources have the same write key")
        return value

    @field_validator("rate_limits", "byte_limits")
    @classmethod
    def _rates(cls, value: dict[str, float]) -> dict[str, float]:
        for name, rate in value.items():
            if rate < 0:
                raise ValueError(f"the rate limit of {name!r} is negative: use 0 for no limit")
        return value

    def rate_limit_of(self, source: str) -> float:
        """Requests per second per client address for ``source`` (0: no limit)."""
        return self.rate_limits.get(source, self.rate_limit)

    def byte_limit_of(self, source: str) -> int:
        """Stored bytes per second per client address for ``source`` (0: no limit)."""
        return self.byte_limits.get(source, self.byte_limit)


class ConsoleSettings(BaseModel):
    """``[console]``: the web console ``exactly up`` serves (docs/up.md): numbers, no controls."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="serve the console (port 0 turns it off too)")
    host: str = Field(
        "127.0.0.1", description="address to listen on; it has no login, so keep it local"
    )
    port: int = Field(8089, ge=0, le=65535, description="port to listen on; 0: no console")

    @property
    def on(self) -> bool:
        return self.enabled and self.port != 0


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
    ``sqlite://FILE``, ``[dedupe] store`` as ``rocksdb://DIR`` or ``spark-state://DIR``) and
    ``[delivery] archive`` (a directory or ``file://DIR``). A server's URL is left as written, and
    so are ``file:PATH`` secret references, which each process (a Spark executor too) reads from
    its own working directory.
    """
    found = dict(document)
    data_dir = found.get("data_dir", ".exactly")
    found["data_dir"] = _anchored(data_dir, base) if isinstance(data_dir, str) else data_dir
    for section, key, schemes in (
        ("log", "url", ("sqlite",)),
        ("aggregate", "url", ("sqlite",)),
        ("dedupe", "store", ("rocksdb", "spark-state")),
        ("delivery", "jobdb", ("sqlite",)),
        ("delivery", "archive", ("file", "")),
    ):
        table = found.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str):
            found[section] = {**table, key: _anchored_url(table[key], base, schemes)}
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

    ``overrides`` are the flags given on the command line; None values are ignored. Raises
    :class:`ConfigError` naming the offending key.
    """
    path = config
    if path is None:
        env_path = os.environ.get("EXACTLY_CONFIG")
        path = Path(env_path) if env_path else (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    document = read_toml(path) if path is not None else {}

    class FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=path)

    given = {key: value for key, value in overrides.items() if value is not None}
    if "log_url" in given:
        given["log"] = {**document.get("log", {}), "url": given.pop("log_url")}
    try:
        return FileSettings(**given)
    except ValidationError as error:
        first = error.errors()[0]
        where = _where(first["loc"], document) or "config"
        origin = f" in {path}" if path is not None else ""
        message = first["msg"]
        if first["type"] == "extra_forbidden" and where.startswith("dedupe.redis"):
            message = (
                "not a setting any more: give the redis store as one URL, "
                'dedupe.store = "redis://HOST:PORT,HOST:PORT/DB" (EXACTLY_DEDUPE__STORE)'
            )
        raise ConfigError(
            f"setting {where}{origin}: {message} (check the file or EXACTLY_* variables)"
        ) from error
    except SettingsError as error:  # an EXACTLY_* variable that is not valid JSON for its key
        raise ConfigError(f"{error} (check the EXACTLY_* variables)") from error


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
