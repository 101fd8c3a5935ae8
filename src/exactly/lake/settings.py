"""``[lake]``: the table events land in, its promoted columns and its upkeep (docs/lake.md); a
section of :class:`exactly.config.Settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from exactly.errors import ConfigError

# The lake query's micro-batch bound when none is given (--max-records-per-trigger).
RECORDS_PER_TRIGGER = 50_000


class LakeSettings(BaseModel):
    """``[lake]``: where the events land; ``exactly lake``'s flags override it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(
        None,
        description="delta://PATH (default: delta://DATA_DIR/lake/events), delta+s3://BUCKET/KEY,"
        " iceberg://DIR, iceberg+postgresql://USER@HOST/DB?warehouse=URI or "
        "postgresql://USER@HOST/DB?table=events",
    )
    columns: dict[str, str] = Field(
        {},
        description='promoted columns: NAME = "properties.KEY KIND" (KIND string, double, '
        "bigint, boolean or timestamp); adding one adds a column, older rows read null",
    )
    layout: Literal["events", "segment"] = Field(
        "segment",
        description='"segment": Segment\'s warehouse tables (tracks, one per event, identifies, '
        "pages, screens, groups, aliases, users, accounts) beside the events table, each batch "
        'exactly once in each (docs/segment.md); "events": the events table alone',
    )
    max_tables: int = Field(
        500,
        ge=0,
        description="the segment layout's most per-event tables; the events of names past it go "
        "to tracks alone, counted by exactly status",
    )
    max_columns: int = Field(
        1000,
        ge=32,
        le=1600,
        description="the segment layout's most columns per table (PostgreSQL stops at 1,600); "
        "values of columns past it are kept in the row's _rejected, counted by exactly status",
    )
    compact_every: int = Field(
        100,
        ge=0,
        description="the lake query compacts the table (exactly lake optimize) and expires "
        "versions older than retention after this many of its commits; 0: never",
    )
    retention: str = Field("7d", description="how long old table versions are kept")
    vacuum_age: str = Field(
        "1h", description="files no version refers to are removed once older than this"
    )

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: dict[str, str]) -> dict[str, str]:
        from exactly.lake.columns import promoted_columns

        try:
            promoted_columns(value)
        except ConfigError as error:
            raise ValueError(str(error).removeprefix("[lake] columns: ")) from None
        return value

    @field_validator("retention", "vacuum_age")
    @classmethod
    def _duration(cls, value: str) -> str:
        from exactly.units import parse_duration

        try:
            parse_duration(value, "duration")
        except ConfigError as error:
            raise ValueError(str(error).removeprefix("duration ")) from None
        return value
