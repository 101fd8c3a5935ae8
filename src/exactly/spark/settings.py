"""``[spark]``: the Spark master and how the driver JVM starts."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SparkSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = Field("local[*]", description="Spark master URL")
    class_sharing: bool = Field(
        True,
        description="start the driver JVM from an archive of Spark's classes, made once in the "
        "background under ~/.cache/exactly (a streaming command starts about a quarter sooner)",
    )
