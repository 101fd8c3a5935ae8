"""The lake's part of a regulation: what the command and the lake query both run."""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exactly.forget.regulations import Forgotten
    from exactly.lake.base import LakeTable


def forget_lake(table: LakeTable, forgotten: Forgotten, message_ids: Set[str]) -> dict[str, int]:
    """Every table of the lake (``table`` and the segment layout's beside it) without the
    people ``forgotten`` names, nor any old version that held them."""
    removed = tables = 0
    for each in [table, *(table.sibling(name) for name in table.siblings())]:
        gone = each.forget(forgotten, message_ids)
        removed += gone
        tables += gone > 0
    return {"rows deleted": removed, "tables changed": tables}
