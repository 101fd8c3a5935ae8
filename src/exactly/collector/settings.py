"""The collector's settings: one frozen model, passed to every worker process as JSON."""

from __future__ import annotations

import json
import os

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from exactly.config import SOURCE_NAME
from exactly.errors import ConfigError
from exactly.events.normalise import MAX_EVENT_BYTES, MAX_MESSAGE_ID_BYTES

ENVIRONMENT_KEY = "EXACTLY_COLLECTOR_SPEC"
MAX_REQUEST_BYTES = 500 * 1024
MAX_BUFFERED_MB = 200
EXPANSION_FLOOR = 64 * 1024  # bytes any request may store, whatever it sent (max_expansion)
BYTE_BURST = 64 * 1024  # the least burst of a byte limit: 10 s at its rate, at least this


class Source(BaseModel):
    """A source of events: its name (stored with each event as ``sourceId``) and write key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=f"^{SOURCE_NAME.pattern}$")
    write_key: SecretStr = Field(min_length=1)


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
    name, sep, key = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"a source is NAME=WRITE_KEY, not {name!r}")
    if not SOURCE_NAME.fullmatch(name):
        raise ConfigError(
            f"source name {name!r} is not allowed: use 1 to 100 letters, digits, '.', '_' or '-'"
        )
    return Source(name=name, write_key=SecretStr(key))
