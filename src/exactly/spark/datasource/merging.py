"""Records alike merged into one weighted row, in the source's Python worker (option ``merge``).

A query that only adds up events (the aggregate job: every measure is a count or a sum) needs
one row per kind of event, not one per event, if each row says how many it stands for. With
option ``fields`` and ``merge=<time fields>`` (``timestamp,receivedAt`` for the aggregate job),
the source gives its rows a ``weight`` column and merges the records that are alike:

- **which records**: those whose ``fields`` were read (not left to ``from_json``), whose map
  fields have none of their keys, and whose time, the first of the ``merge`` fields that is not
  null, else the record's own timestamp, is not before 1970;
- **alike**: equal in every other field (null apart from ``''``), and in that time's minute
  (UTC). The row that stands for them has those fields, the minute's start as its first time
  field and as its record timestamp, its other ``merge`` fields and its maps null, no key and no
  value, the smallest partition and offset among them, and their number as its ``weight``;
- every other record is a row of its own with weight 1.

So the query must read the ``merge`` fields and the record's timestamp only through their
minute (or a coarser bucket), never a record's key, value, partition or offset, and must weigh
each row: ``count(*)`` becomes ``sum(weight)``, a sum multiplies by it
(``exactly.aggregate.frame``). A replayed micro-batch reads the same records, so it merges them
the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from exactly.events.fields import Fields

WEIGHT = "weight"
MINUTE_MICROS = 60_000_000
_TIME = pa.timestamp("us", tz="UTC")


def with_weight(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field(WEIGHT, pa.int64()))


def merged(batch: pa.RecordBatch, fields: Fields, times: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """``batch`` (the source's columns, ``fields`` last) as weighted rows: the records that
    merge (module docstring), then the others, each a batch of ``with_weight(batch.schema)``."""
    schema = with_weight(batch.schema)
    read: pa.StructArray = batch.column("fields")
    values = dict(zip((f.name for f in read.type), read.flatten(), strict=True))  # null: null
    when = _first_time([values[name] for name in times], batch.column("timestamp"))
    alike = read.is_valid().to_numpy(zero_copy_only=False) & (when >= 0)
    for field in fields.fields:
        if field.kind == "map":
            alike &= _no_entries(values[field.name])
    rest = batch.filter(pa.array(~alike, pa.bool_()))
    if rest.num_rows:
        yield pa.RecordBatch.from_arrays(
            [*rest.columns, pa.array(np.ones(rest.num_rows, np.int64))], schema=schema
        )
    if not alike.any():
        return
    picked = np.flatnonzero(alike)
    names = [f.name for f in fields.fields if f.kind != "map" and f.name not in times]
    table = pa.table(
        {
            **{f"k{n}": values[name].take(picked) for n, name in enumerate(names)},
            "minute": pa.array(when[picked] // MINUTE_MICROS),
            "partition": batch.column("partition").take(picked),
            "offset": batch.column("offset").take(picked),
        }
    )
    groups = table.group_by([*(f"k{n}" for n in range(len(names))), "minute"], use_threads=False)
    found = groups.aggregate([("partition", "min"), ("offset", "min"), ([], "count_all")])
    rows = found.num_rows
    start = pc.cast(pc.multiply(found.column("minute"), MINUTE_MICROS), pa.int64()).cast(_TIME)
    start = start.combine_chunks()
    kept = {name: found.column(f"k{n}").combine_chunks() for n, name in enumerate(names)}
    children = []
    for field in read.type:
        if field.name in kept:
            children.append(kept[field.name])
        elif field.name == times[0]:
            children.append(start)
        else:  # the other time fields, and the maps
            children.append(pa.nulls(rows, field.type))
    columns = {
        "partition": found.column("partition_min").combine_chunks().cast(pa.int32()),
        "offset": found.column("offset_min").combine_chunks(),
        "timestamp": start,
        "fields": pa.StructArray.from_arrays(children, fields=list(read.type)),
        WEIGHT: found.column("count_all").combine_chunks(),
    }
    yield pa.RecordBatch.from_arrays(
        [
            columns[f.name] if f.name in columns else pa.nulls(rows, f.type)
            for f in schema  # key, value (and headers) are null
        ],
        schema=schema,
    )


def _no_entries(maps: pa.MapArray) -> np.ndarray:
    """Whether each map is null or empty."""
    lengths = np.diff(maps.offsets.to_numpy(zero_copy_only=False))
    empty: np.ndarray = (lengths == 0) | maps.is_null().to_numpy(zero_copy_only=False)
    return empty


def _first_time(times: Sequence[pa.Array], stamps: pa.Array) -> np.ndarray:
    """Each row's first time that is not null, else its record timestamp, in UTC microseconds."""
    micros = pc.coalesce(*times, stamps.cast(_TIME)).cast(pa.int64())
    return np.asarray(micros.to_numpy(zero_copy_only=False), np.int64)
