"""``[[destinations]]`` and ``[delivery]``: where events are delivered and how (docs/delivery.md).

Durations are written as ``"5s"``, ``"5m"``, ``"4h"`` (or a number of seconds) and held as seconds.
Every check names its key, so a wrong destination stops the command with one line.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from yarl import URL

from exactly.errors import ConfigError
from exactly.urls import redact, scrub

NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")  # fullmatch
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")  # an RFC 9110 token
MAX_SECRETS = 10
MAX_LANES = 64  # a single-event destination's buckets per source, cut by user (``lanes``)
MAX_FILTER = 5_000  # characters in a filter at most (Segment's FQL limit)
TRANSFORM = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")  # fullmatch
# The route query's micro-batch bound when none is given (--max-records-per-trigger): a batch's
# jobs are held in the driver.
ROUTE_RECORDS_PER_TRIGGER = 50_000
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/?#]*)@")
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


class RetrySettings(BaseModel):
    """``[destinations.retry]``: how long and how often a failing job is tried."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window: float = Field(
        24 * 3600.0, gt=0, description="a job is tried until this long after it was created"
    )
    max_attempts: int | None = Field(None, ge=1, description="... or this many tries (no limit)")

    @field_validator("window", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return seconds(value, "retry.window")


class BreakerSettings(BaseModel):
    """``[destinations.breaker]``: a failing destination paused and probed, not hammered."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    open_after: int = Field(
        20, ge=0, description="consecutive failed requests that pause the destination (0: never)"
    )
    failing_for: float = Field(
        30.0, ge=0, description="... and no success for this long (seconds or '30s')"
    )

    @field_validator("failing_for", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return seconds(value, "breaker.failing_for")


class BatchSettings(BaseModel):
    """``[destinations.batch]``: several events in one request (docs/delivery.md, "Batches").

    ``max_events = 1`` (the default) sends one event per request, each with its messageId as
    the key; above 1 a batch is formed once, recorded in the JobDB, and keyed by its own id.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_events: int = Field(1, ge=1, le=100_000, description="events in one request at most")
    max_bytes: int = Field(
        500_000, ge=1024, le=100_000_000, description="a request's body at most (one event more)"
    )
    max_wait: float = Field(
        1.0, ge=0, le=3600, description="how long a partial batch may wait (seconds or '200ms')"
    )
    format: Literal["json-array", "ndjson", "segment"] = Field(
        "json-array",
        description="json-array: [e1, e2]; ndjson: one event a line; segment: a /v1/batch "
        'body {"batch": [...], "sentAt": ...}',
    )

    @field_validator("max_wait", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return seconds(value, "batch.max_wait")


class DestinationSettings(BaseModel):
    """One ``[[destinations]]`` entry: an HTTP endpoint and the events it receives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="unique name; 1 to 100 letters, digits, '.', '_' or '-'")
    headers: dict[str, str] = Field(default_factory=dict, description="added to every request")
    # after headers: the url's check sees them (user info and an Authorization header clash)
    url: str = Field(description="http:// or https:// endpoint receiving one POST per event")
    sources: tuple[str, ...] | None = Field(None, description="only events of these sources")
    events: tuple[str, ...] | None = Field(None, description="only these track event names")
    filter: str | None = Field(
        None,
        description="only events for which this Spark SQL condition is true, over the event's "
        "fields: \"type = 'identify' or properties.plan = 'pro'\"",
    )
    transform: str | None = Field(
        None,
        description="MODULE:FUNCTION called with each event as a dict; returns the body to "
        "send (a dict) or None to send nothing",
    )
    transform_dir: str | None = Field(
        None,
        description="where transform's module is looked for first (default: the config "
        "file's directory)",
    )
    ignore_integrations: bool = Field(
        False, description="send whatever the event's Segment `integrations` object says"
    )
    secret: SecretStr | tuple[SecretStr, ...] | None = Field(
        None,
        description="Standard Webhooks signing key, whsec_...; or a list of up to "
        f"{MAX_SECRETS} while one is rotated (every request is signed with each)",
    )
    timeout: float = Field(10.0, gt=0, le=3600, description="seconds a request may take")
    max_in_flight: int = Field(8, ge=1, le=10_000, description="concurrent requests")
    rate: float | None = Field(None, gt=0, description="requests per second at most (GCRA)")
    burst: int = Field(1, ge=1, le=10_000, description="requests at once within rate")
    ordered: bool = Field(False, description="deliver each userId's events in order")
    lanes: int = Field(
        1,
        ge=1,
        le=MAX_LANES,
        description="buckets a source's events for this destination are cut into by userId, "
        "so as many directors can share it (single events only)",
    )
    expire: float | None = Field(
        None, gt=0, description="the older name of retry.window; give one or the other"
    )
    backoff: BackoffSettings = BackoffSettings()
    retry: RetrySettings = RetrySettings()
    breaker: BreakerSettings = BreakerSettings()
    batch: BatchSettings = BatchSettings()

    @field_validator("timeout", "expire", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return seconds(value, "duration")

    @model_validator(mode="after")
    def _expire_is_the_window(self) -> DestinationSettings:
        if self.expire is None:
            return self
        if "window" in self.retry.model_fields_set:
            raise ValueError("give retry.window or expire (its older name), not both")
        retry = self.retry.model_copy(update={"window": self.expire})
        object.__setattr__(self, "retry", retry)
        return self

    @model_validator(mode="after")
    def _lanes_single_events(self) -> DestinationSettings:
        if self.lanes > 1 and self.batching:
            raise ValueError(
                "lanes is for single-event destinations: a batching destination sends each "
                "source's batches from one bucket; leave lanes out or set it to 1"
            )
        return self

    @property
    def batching(self) -> bool:
        """Whether requests carry batches (``batch.max_events`` above 1)."""
        return self.batch.max_events > 1

    @property
    def window(self) -> float:
        """Seconds after its creation a job of this destination may still be tried."""
        return self.retry.window

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError(
                f"destination name {value!r} is not allowed: "
                "use 1 to 100 letters, digits, '.', '_' or '-'"
            )
        if value == "All":
            raise ValueError(
                "destination name 'All' is not allowed: Segment's integrations object uses it "
                "for every destination"
            )
        return value

    @field_validator("filter")
    @classmethod
    def _filter(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.strip():
            raise ValueError("filter is blank: write a condition, or leave filter out")
        if len(value) > MAX_FILTER:
            raise ValueError(f"filter has {len(value):,} characters; at most {MAX_FILTER:,}")
        return value

    @field_validator("transform")
    @classmethod
    def _transform(cls, value: str | None) -> str | None:
        if value is not None and not TRANSFORM.fullmatch(value):
            raise ValueError(
                f"transform {value!r} is not MODULE:FUNCTION (such as 'shapes:to_crm')"
            )
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str, info: ValidationInfo) -> str:
        url = sendable(value)
        headers = info.data.get("headers", {})
        if (url.raw_user is not None or url.raw_password is not None) and any(
            name.lower() == "authorization" for name in headers
        ):
            raise ValueError(
                f"{_shown(value)!r} has user info and headers has an Authorization header; "
                "a request cannot carry both: keep one of them"
            )
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

    @field_validator("secret", mode="before")
    @classmethod
    def _secret_text(cls, value: object) -> object:
        if value is None or isinstance(value, str | SecretStr):
            return value
        if isinstance(value, list | tuple) and all(isinstance(v, str | SecretStr) for v in value):
            return tuple(value)
        raise ValueError("secret must be a 'whsec_...' string or a list of them")

    @field_validator("secret")
    @classmethod
    def _secret(
        cls, value: SecretStr | tuple[SecretStr, ...] | None
    ) -> SecretStr | tuple[SecretStr, ...] | None:
        secrets = (value,) if isinstance(value, SecretStr) else value or ()
        if isinstance(value, tuple) and not 1 <= len(value) <= MAX_SECRETS:
            raise ValueError(f"give 1 to {MAX_SECRETS} secrets, not {len(value)}")
        for secret in secrets:
            signing_key(secret.get_secret_value())
        return value

    def signing_keys(self) -> tuple[bytes, ...]:
        """The HMAC keys the secret (or secrets) encode; none when requests are not signed."""
        secrets = (self.secret,) if isinstance(self.secret, SecretStr) else self.secret or ()
        return tuple(signing_key(secret.get_secret_value()) for secret in secrets)

    def matches(self, source: str | None, event: str | None) -> bool:
        """Whether an event of ``source`` named ``event`` goes to this destination."""
        if self.sources is not None and source not in self.sources:
            return False
        return self.events is None or event in self.events


def sendable(value: str) -> URL:
    """``value`` as the director's client will send to it, or ValueError saying what to fix.

    Refuses what fails every request: a scheme other than http/https, no host, a port out of
    range or 0, a host the resolver cannot encode (an empty label or one over 63 characters, a
    bad ``xn--`` label) and an IPv4 address that is not four numbers (``1.2.3.4.5``, and
    ``127.1``, which the resolver would read as another address than it seems to name).
    """
    shown = repr(_shown(value))
    try:
        url = URL(value)
    except ValueError as error:  # yarl's: a bad port, bracket, character (UnicodeError too)
        raise ValueError(f"{shown} is not a valid URL: {_detail(error, value)}") from None
    if url.scheme not in ("http", "https"):
        raise ValueError(f"{shown} is not an http:// or https:// URL")
    host = url.raw_host
    if not host:
        raise ValueError(f"{shown} has no host: write http://HOST[:PORT]/PATH")
    if url.explicit_port == 0:
        raise ValueError(f"{shown} has port 0, which nothing can be reached on")
    if ":" in host:  # an IPv6 address, checked by yarl
        return url
    if host.replace(".", "").isdigit():
        if not _canonical_ipv4(host):
            raise ValueError(f"{shown}: {host!r} is not an IPv4 address (write four numbers 0-255)")
        return url
    try:
        host.encode("idna")  # what socket.getaddrinfo does with it: labels of 1 to 63 characters
        url.host  # noqa: B018 (decoding each xn-- label)
    except UnicodeError:
        raise ValueError(
            f"{shown}: the host {host!r} cannot be looked up: each dot-separated part must be 1 "
            "to 63 characters, and one starting with 'xn--' valid punycode"
        ) from None
    return url


def _canonical_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(
        part.isascii()
        and 1 <= len(part) <= 3
        and (part == "0" or part[0] != "0")
        and int(part) < 256
        for part in parts
    )


def _shown(url: str) -> str:
    """``url`` for a message: its user info (a user name may be a token too) and secret options
    masked."""
    return redact(_USERINFO.sub(r"\g<scheme>***@", url, count=1))


def _detail(error: ValueError, url: str) -> str:
    """yarl's reason on one line, with the URL's user info masked wherever it quotes it."""
    found = _USERINFO.match(url)
    info = found["info"] if found is not None else ""
    return " ".join(scrub(str(error), [info, *info.split(":")]).split())


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
    page_size: int = Field(
        10_000, ge=1, description="jobs paged in per source and destination at most"
    )
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
    partitions: int = Field(
        1,
        ge=1,
        le=4096,
        description="the JobDB's buckets are spread over this many partitions; each director "
        "leases some (the most directors that can share the work)",
    )
    directors: int = Field(
        1, ge=1, le=64, description="how many `exactly deliver` processes `exactly up` starts"
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
