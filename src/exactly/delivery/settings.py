"""``[[destinations]]`` and ``[delivery]``: where events are delivered and how (docs/delivery.md).

Durations are written as ``"5s"``, ``"5m"``, ``"4h"`` (or a number of seconds) and held as seconds.
Every check names its key, so a wrong destination stops the command with one line.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from exactly.errors import ConfigError

NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")  # fullmatch
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")  # an RFC 9110 token
RESERVED_HEADERS = frozenset(
    {
        "idempotency-key",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "content-type",
        "content-length",
        "host",
        "transfer-encoding",
        "connection",
    }
)


def seconds(value: object, name: str) -> object:
    """A duration written as text (``"5s"``, ``"1h30m"``) in seconds; numbers pass through."""
    if not isinstance(value, str):
        return value
    from exactly.units import parse_duration

    try:
        return parse_duration(value, name) / 1000.0
    except ConfigError as error:
        raise ValueError(str(error)) from None


class BackoffSettings(BaseModel):
    """``[destinations.backoff]``: the delays between tries (:func:`exactly.backoff.backoff`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    minimum: float = Field(5.0, alias="min", gt=0, description="first delay, seconds or '5s'")
    maximum: float = Field(300.0, alias="max", gt=0, description="longest delay, or '5m'")
    coefficient: float = Field(2.0, ge=1.0, le=100.0, description="growth per attempt")

    @field_validator("minimum", "maximum", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return seconds(value, "backoff")

    @model_validator(mode="after")
    def _ordered(self) -> BackoffSettings:
        if self.maximum < self.minimum:
            raise ValueError(f"max ({self.maximum} s) is below min ({self.minimum} s)")
        return self


class DestinationSettings(BaseModel):
    """One ``[[destinations]]`` entry: an HTTP endpoint and the events it receives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="unique name; 1 to 100 letters, digits, '.', '_' or '-'")
    url: str = Field(description="http:// or https:// endpoint receiving one POST per event")
    sources: tuple[str, ...] | None = Field(None, description="only events of these sources")
    events: tuple[str, ...] | None = Field(None, description="only these track event names")
    headers: dict[str, str] = Field(default_factory=dict, description="added to every request")
    secret: SecretStr | None = Field(None, description="Standard Webhooks signing key, whsec_...")
    timeout: float = Field(10.0, gt=0, le=3600, description="seconds a request may take")
    max_in_flight: int = Field(8, ge=1, le=10_000, description="concurrent requests")
    rate: float | None = Field(None, gt=0, description="requests per second at most (GCRA)")
    burst: int = Field(1, ge=1, le=10_000, description="requests at once within rate")
    ordered: bool = Field(False, description="deliver each userId's events in order")
    expire: float = Field(4 * 3600.0, gt=0, description="give up on a job this long after it")
    backoff: BackoffSettings = BackoffSettings()

    @field_validator("timeout", "expire", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return seconds(value, "duration")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError(
                f"destination name {value!r} is not allowed: "
                "use 1 to 100 letters, digits, '.', '_' or '-'"
            )
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by exactly and cannot be configured")
            if any(c in text for c in "\r\n\0"):
                raise ValueError(f"header {name!r} has a line break or NUL in its value")
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            signing_key(value.get_secret_value())
        return value

    def signing_key(self) -> bytes | None:
        """The HMAC key the secret encodes, or None when requests are not signed."""
        return None if self.secret is None else signing_key(self.secret.get_secret_value())

    def matches(self, source: str | None, event: str | None) -> bool:
        """Whether an event of ``source`` named ``event`` goes to this destination."""
        if self.sources is not None and source not in self.sources:
            return False
        return self.events is None or event in self.events


def signing_key(secret: str) -> bytes:
    """The key of a Standard Webhooks secret: ``whsec_`` then base64 of 24 to 64 bytes."""
    if not secret.startswith("whsec_"):
        raise ValueError("secret must start with 'whsec_' (a Standard Webhooks secret)")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("secret is not 'whsec_' followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"secret decodes to {len(key)} bytes; use 24 to 64 random bytes")
    return key


class DeliverySettings(BaseModel):
    """``[delivery]``: the JobDB and the director's limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    jobdb: str | None = Field(
        None, description="sqlite://DIR, postgresql://... or mysql://...; default DATA_DIR/jobdb"
    )
    dataset_rows: int = Field(100_000, ge=1, description="a new dataset after this many jobs")
    dataset_minutes: float = Field(60.0, gt=0, description="... or after this many minutes")
    page_size: int = Field(10_000, ge=1, description="jobs paged in per bucket at most")
    archive: str | None = Field(
        None,
        description="where finished jobs are archived: a directory, file://DIR or "
        "s3://BUCKET/PREFIX[?endpoint=URL&region=R&profile=P]; default DATA_DIR/archive",
    )
    jobdb_patience: float = Field(
        60.0, gt=0, description="how long the director retries a failing JobDB before it stops"
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve Prometheus /metrics on 127.0.0.1:PORT (off)"
    )

    @field_validator("jobdb_patience", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return seconds(value, "jobdb_patience")


def unique_names(destinations: tuple[Any, ...]) -> tuple[Any, ...]:
    names = [destination.name for destination in destinations]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"two destinations are named {name!r}")
    return destinations
