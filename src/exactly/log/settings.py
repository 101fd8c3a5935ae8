"""``[log]``: where the log is and the largest record it takes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LogSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(None, description="log URL; default sqlite://DATA_DIR/log")
    max_record_bytes: int = Field(1024 * 1024, gt=0, description="largest record accepted")
