"""``[aggregate]``: where the counts go and which tables are counted (docs/aggregate.md); a
section of :class:`exactly.config.Settings`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The aggregate query's micro-batch bound when none is given (--max-records-per-trigger), for the
# same reason as the dedupe query's (exactly.dedupe.settings.RECORDS_PER_TRIGGER).
RECORDS_PER_TRIGGER = 200_000


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
