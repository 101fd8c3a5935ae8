"""``[dedupe]``: the store, the window and the scope (docs/dedupe.md); a section of
:class:`exactly.config.Settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from exactly.errors import ConfigError

# The dedupe query's micro-batch bound when none is given (--max-records-per-trigger): a backlog
# is worked off in batches of at most this many records, so a run restarted after a kill replays
# a batch of seconds, not the whole backlog it planned at once (docs/up.md, "Recovery").
RECORDS_PER_TRIGGER = 100_000


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
