"""What a forgotten person's event becomes in a log topic: a stub that counts and holds nobody.

The embedded log rewrites a forgotten event in place (its offset, key and headers kept) with
:func:`stub` of it: the fields the event counts need (``exactly.aggregate.spec``: the source,
type, event name, the times its buckets come from, a numeric revenue) and the mark
``"exactly": {"forgotten": true}``. So the aggregates, which hold counts and no person, stay
exact under ``exactly audit``, and every reader that lands or sends events (the lake, the route,
backfill) skips a stub (:func:`is_stub`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from pyspark.sql import Column

KEPT = ("messageId", "type", "event", "sourceId", "timestamp", "receivedAt", "sentAt")
KEPT_TOO = ("originalTimestamp",)
MARK = b'"exactly":{"forgotten":true}'


def stub(event: Mapping[str, Any]) -> bytes:
    """The stub of a stored event: what counting needs of it, and the mark."""
    kept: dict[str, Any] = {
        name: event[name] for name in (*KEPT, *KEPT_TOO) if isinstance(event.get(name), str)
    }
    properties = event.get("properties")
    revenue = properties.get("revenue") if isinstance(properties, dict) else None
    if isinstance(revenue, int | float) and not isinstance(revenue, bool):
        kept["properties"] = {"revenue": revenue}
    kept["exactly"] = {"forgotten": True}
    return orjson.dumps(kept)


def is_stub(value: bytes | None) -> bool:
    """Whether a stored value is a stub (its mark is written last, by :func:`stub` only)."""
    return bool(value) and value.endswith(MARK + b"}")  # type: ignore[union-attr]


def not_stub(value: Column) -> Column:
    """A Spark column: whether a record's ``value`` is not a stub (the lake's and the route's
    filter, on the executors, before anything is parsed)."""
    from pyspark.sql import functions as F

    return ~F.coalesce(F.endswith(value, F.lit(bytearray(MARK + b"}"))), F.lit(False))
