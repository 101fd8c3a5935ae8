"""``[console]``: the web console ``exactly up`` serves."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConsoleSettings(BaseModel):
    """``[console]``: the web console ``exactly up`` serves (docs/up.md): numbers, no controls."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="serve the console (port 0 turns it off too)")
    host: str = Field(
        "127.0.0.1", description="address to listen on; it has no login, so keep it local"
    )
    port: int = Field(8089, ge=0, le=65535, description="port to listen on; 0: no console")

    @property
    def on(self) -> bool:
        return self.enabled and self.port != 0
