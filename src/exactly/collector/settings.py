"""The collector's settings: ``[collector]`` (:class:`CollectorConfig`, a section of
:class:`exactly.config.Settings`) and what each worker runs with (:class:`CollectorSettings`,
made from it by :meth:`CollectorConfig.worker_settings` and passed to every worker process as
JSON). The source-name and write-key checks are here, once."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode

from exactly.errors import ConfigError
from exactly.events.normalise import MAX_EVENT_BYTES, MAX_MESSAGE_ID_BYTES

ENVIRONMENT_KEY = "EXACTLY_COLLECTOR_SPEC"
MAX_REQUEST_BYTES = 500 * 1024
MAX_BUFFERED_MB = 128  # + what each stalled connection costs besides: 1,000 within 300 MB
# behind the front each connection is two files of its process: 2 x 8,192 + 64 fits a hard
# open-file limit of 20,000 (10,000 did not)
MAX_CONNECTIONS = 8192
EXPANSION_FLOOR = 64 * 1024  # bytes any request may store, whatever it sent (max_expansion)
BYTE_BURST = 64 * 1024  # the least burst of a byte limit: 10 s at its rate, at least this
SOURCE_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")  # use fullmatch: "$" would let "web\n" pass


def check_source_name(name: str) -> str:
    """``name`` when it may name a source (it is stored with each event as ``sourceId``), else
    :class:`ValueError` saying what is allowed."""
    if not SOURCE_NAME.fullmatch(name):
        raise ValueError(
            f"source name {name!r} is not allowed: use 1 to 100 letters, digits, '.', '_' or '-'"
        )
    return name


def check_write_keys(keys: Iterable[str]) -> None:
    """:class:`ValueError` when two sources share a write key: a request's key names its
    source."""
    found = list(keys)
    if len(set(found)) != len(found):
        raise ValueError("two sources have the same write key")


def source_pair(text: str) -> tuple[str, str]:
    """``NAME=WRITE_KEY`` as ``(name, key)``; :class:`ValueError` naming the problem."""
    name, sep, key = text.partition("=")
    if not sep or not key:
        raise ValueError(f"a source is NAME=WRITE_KEY, not {name!r}")
    return check_source_name(name), key


class Source(BaseModel):
    """A source of events: its name (stored with each event as ``sourceId``) and write key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    write_key: SecretStr = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_source_name(value)


class RateLimit(BaseModel):
    """Requests per second per client address for one source, and how many may come at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_second: float = Field(gt=0)
    burst: int = Field(ge=1)


class CollectorSettings(BaseModel):
    """Everything a collector worker needs; built by ``exactly collect`` from flags and env."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    log_url: str
    max_record_bytes: int = Field(1024 * 1024, gt=0)
    topic: str = "raw"
    partitions: int = Field(8, ge=1, le=4096, description="partitions of the topic, if created")
    sources: tuple[Source, ...] = ()
    max_request_bytes: int = Field(MAX_REQUEST_BYTES, ge=1024)
    max_pending_bytes: int = Field(
        64 * 1024 * 1024, ge=MAX_REQUEST_BYTES, description="events queued for the log at most"
    )
    max_buffered_bytes: int = Field(
        MAX_BUFFERED_MB * 1024 * 1024,
        ge=MAX_REQUEST_BYTES,
        description="bytes of bodies still arriving a worker buffers at most (503 beyond)",
    )
    retry_after_seconds: int = Field(1, ge=1)
    max_event_bytes: int = Field(MAX_EVENT_BYTES, ge=1024)
    max_append_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="most one request may append, as stored"
    )
    read_timeout_seconds: float = Field(10.0, gt=0, description="a stalled body gets 408")
    body_timeout_seconds: float = Field(30.0, gt=0, description="a body slower than this: 408")
    allowed_origins: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="source name -> page origins it takes (absent: any)"
    )
    rate_limits: dict[str, RateLimit] = Field(
        default_factory=dict, description="source name -> its limit per client (absent: none)"
    )
    max_expansion: float = Field(
        100.0, ge=1, description="most one request may store per byte it sent (413 beyond)"
    )
    byte_limits: dict[str, RateLimit] = Field(
        default_factory=dict,
        description="source name -> stored bytes per second per client and burst (absent: none)",
    )

    front_directory: str | None = Field(
        None, description="behind the connection front: its private directory (front.py)"
    )
    forget_key_file: str | None = Field(
        None, description="the data dir's forget key: events of forgotten people are suppressed"
    )

    @model_validator(mode="after")
    def _limits_fit(self) -> CollectorSettings:
        check_record_limit(self.max_record_bytes, self.max_event_bytes)
        return self

    def to_environment(self) -> dict[str, str]:
        """The settings as an environment variable for worker processes (keys included)."""
        document = self.model_dump(mode="json")
        document["sources"] = [
            {"name": source.name, "write_key": source.write_key.get_secret_value()}
            for source in self.sources
        ]
        return {ENVIRONMENT_KEY: json.dumps(document)}

    @classmethod
    def from_environment(cls) -> CollectorSettings:
        raw = os.environ.get(ENVIRONMENT_KEY)
        if raw is None:
            raise ConfigError(
                f"{ENVIRONMENT_KEY} is not set: start collectors with exactly collect"
            )
        try:
            return cls.model_validate_json(raw)
        except ValidationError as error:
            first = error.errors()[0]["msg"]
            raise ConfigError(f"{ENVIRONMENT_KEY} is not valid: {first}") from error


def check_record_limit(max_record_bytes: int, max_event_bytes: int) -> None:
    """:class:`ConfigError` when the log could refuse an event the collector accepts: such an
    event would fail the whole group append it shares with other requests' events."""
    needed = max_event_bytes + MAX_MESSAGE_ID_BYTES
    if max_record_bytes < needed:
        raise ConfigError(
            f"log.max_record_bytes ({max_record_bytes}) is below what one event may take "
            f"({needed}: collector.max_event_bytes {max_event_bytes} + the longest messageId); "
            "raise log.max_record_bytes or lower collector.max_event_bytes"
        )


def parse_source(text: str) -> Source:
    """``NAME=WRITE_KEY`` as a :class:`Source`; :class:`ConfigError` naming the problem."""
    try:
        name, key = source_pair(text)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return Source(name=name, write_key=SecretStr(key))


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
        MAX_BUFFERED_MB,
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
        MAX_CONNECTIONS,
        ge=16,
        description="open connections per worker; more wait in the listen backlog (behind the "
        "front: x workers in all, the least recently active closed first)",
    )
    max_connections_per_address: int = Field(
        256,
        ge=0,
        description="open connections per client address (IPv6: per /64), the least recently "
        "active closed first; 0: no cap and no connection front (granian serves the port)",
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
        """``EXACTLY_COLLECTOR__SOURCES=web=KEY1,ios=KEY2`` (or a table in the file, or the
        ``NAME=KEY`` texts of ``exactly collect --source``)."""
        if isinstance(value, str):
            value = [text.strip() for text in value.split(",")]
        if not isinstance(value, list | tuple):
            return value
        sources: dict[str, str] = {}
        for text in filter(None, value):
            name, key = source_pair(str(text))
            if name in sources:
                raise ValueError(f"two sources are named {name!r}")
            sources[name] = key
        return sources

    @field_validator("sources")
    @classmethod
    def _source_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, key in value.items():
            check_source_name(name)
            if not key.get_secret_value():
                raise ValueError(f"source {name!r} has an empty write key")
        check_write_keys(key.get_secret_value() for key in value.values())
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

    def worker_settings(
        self, log_url: str, max_record_bytes: int, forget_key_file: str | None = None
    ) -> CollectorSettings:
        """What each worker of ``exactly collect`` runs with: this section resolved (sources
        as :class:`Source`, megabytes as bytes, each source's rate limit) for the log at
        ``log_url``. :class:`ConfigError` when there is no source, when ``allowed_origins``,
        ``rate_limits`` or ``byte_limits`` name one that is not a source, or when the log's
        record limit is below the event limit."""
        from exactly.log.base import check_topic_name

        check_topic_name(self.topic)
        if not self.sources:
            raise ConfigError(
                "no source: add write keys under [collector.sources] in exactly.toml "
                '(web = "KEY") or set EXACTLY_COLLECTOR__SOURCES=web=KEY'
            )
        for setting in ("allowed_origins", "rate_limits", "byte_limits"):
            unknown = sorted(set(getattr(self, setting)) - set(self.sources))
            if unknown:
                raise ConfigError(
                    f"collector.{setting} names {', '.join(unknown)}, which is not a source: "
                    "use the names of [collector.sources]"
                )
        try:
            return CollectorSettings(
                log_url=log_url,
                max_record_bytes=max_record_bytes,
                forget_key_file=forget_key_file,
                topic=self.topic,
                partitions=self.partitions,
                sources=tuple(Source(name=n, write_key=k) for n, k in self.sources.items()),
                max_pending_bytes=self.max_queue_mb * 1024 * 1024,
                max_event_bytes=self.max_event_bytes,
                max_buffered_bytes=self.max_buffered_mb * 1024 * 1024,
                max_append_bytes=int(self.max_append_mb * 1024 * 1024),
                read_timeout_seconds=self.read_timeout,
                body_timeout_seconds=self.body_timeout,
                allowed_origins=self.allowed_origins,
                rate_limits={
                    name: RateLimit(per_second=rate, burst=self.rate_limit_burst)
                    for name in self.sources
                    if (rate := self.rate_limit_of(name)) > 0
                },
                max_expansion=self.max_expansion,
                byte_limits={
                    name: RateLimit(per_second=rate, burst=max(10 * rate, BYTE_BURST))
                    for name in self.sources
                    if (rate := self.byte_limit_of(name)) > 0
                },
            )
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ConfigError(f"collector setting {where}: {first['msg']}") from None
