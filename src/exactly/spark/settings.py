"""``[spark]``: the Spark master and how the driver JVM starts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The JIT's options per [spark] jit: "quick" compiles each hot method once, with C1 (HotSpot's
# fast compiler), and never again with C2; "full" is HotSpot's default, tiered up to C2.
JIT_OPTIONS = {"quick": "-XX:TieredStopAtLevel=1", "full": ""}


class SparkSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = Field("local[*]", description="Spark master URL")
    class_sharing: bool = Field(
        True,
        description="start the driver JVM from an archive of Spark's classes, made once in the "
        "background under ~/.cache/exactly (a streaming command starts about a quarter sooner)",
    )
    jit: Literal["quick", "full"] = Field(
        "quick",
        description="how the driver JVM compiles: quick (C1 only: a JVM minutes old spends a "
        "third less CPU) or full (HotSpot's default, C1 then C2: faster code after the "
        "compiling)",
    )
