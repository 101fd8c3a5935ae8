"""The segment layout's micro-batch shaped on the executors (step 4b of :mod:`exactly.lake.query`).

Shaping in the driver's one Python thread (:meth:`Warehouse.shape
<exactly.lake.warehouse.Warehouse.shape>`) parses every event of the batch there and holds the
GIL that ``exactly up`` shares with its other queries. Here each Spark task shapes its own
records (:func:`~exactly.lake.segment.parts.shape_part`: parse, rows per table typed, tallies,
profiles) and sends the driver its rows as Arrow; the driver settles the batch's columns from
the tallies and merges (:func:`~exactly.lake.segment.parts.shape_in_parts`), so the
:class:`~exactly.lake.warehouse.Batch` is the one :meth:`Warehouse.shape` gives for the same
events in one piece, and :meth:`Warehouse.commit <exactly.lake.warehouse.Warehouse.commit>`
commits it unchanged. What runs where, per batch:

1. the driver reads the tables' columns once (:meth:`Warehouse.schemas
   <exactly.lake.warehouse.Warehouse.schemas>`) and picks ``loaded_at`` (every row's
   ``uuid_ts``); both go to the tasks in the closure;
2. one job: each task shapes its records alone and returns one row per table (its rows and
   tally, pickled) and one for its profiles;
3. the driver settles; only when a part typed a table otherwise than the whole (a batch that
   brings new columns whose kinds differ between parts) a second job retypes those tables with
   the settled columns;
4. the driver concatenates each table's parts and merges the profiles (one per user or group).

The rows come to the driver once, as Arrow (the commits run there); the events never do.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from exactly.lake.segment import Limits
from exactly.lake.segment.parts import Part, shape_in_parts, shape_part
from exactly.lake.segment.table import Columns
from exactly.lake.warehouse import Batch, Warehouse

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SHAPED = "part int, table string, body binary"  # a task's rows: one per table, one of profiles
PROFILES = ""  # the ``table`` of the row that holds a part's profiles


@dataclass(frozen=True)
class PartJob:
    """What each task needs to shape its part (pickled into the closure)."""

    schemas: Mapping[str, Mapping[str, str]]
    loaded_at: datetime
    limits: Limits
    can_widen: bool
    decided: Mapping[str, Columns] | None = None


def shape_batch(records: DataFrame, warehouse: Warehouse, *, loaded_at: datetime) -> Batch:
    """The records' events (the ``value`` column, Segment events as JSON) shaped on the
    executors for ``warehouse``: what :meth:`Warehouse.shape` gives for them (module
    docstring, steps 1-4)."""
    from pyspark.sql import functions as F

    schemas = warehouse.schemas()  # 1.
    values = records.select(F.col("value").cast("string").alias("value"))

    def run(decided: Mapping[str, Columns] | None) -> list[Part]:  # 2. (3. with decided)
        job = PartJob(schemas, loaded_at, warehouse.limits, warehouse.can_widen, decided)
        return parts_of(values.mapInArrow(partial(shape_task, job), SHAPED).toArrow())

    shaped, made = shape_in_parts(  # 3., 4.
        run, schemas, limits=warehouse.limits, can_widen=warehouse.can_widen
    )
    return Batch(shaped, made)


def shape_task(job: PartJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One task's part (step 2, or 3 with ``job.decided``) as rows of :data:`SHAPED`."""
    from pyspark import TaskContext

    events = [orjson.loads(v) for batch in batches for v in batch.column(0).to_pylist() if v]
    if not events:
        return
    part = shape_part(
        events,
        job.schemas,
        loaded_at=job.loaded_at,
        limits=job.limits,
        can_widen=job.can_widen,
        decided=job.decided,
    )
    context = TaskContext.get()
    index = 0 if context is None else context.partitionId()
    tables = list(part.tables)
    bodies = [pickle.dumps((part.tables[t], part.tallies.get(t)), protocol=5) for t in tables]
    if job.decided is None:
        tables.append(PROFILES)
        bodies.append(pickle.dumps(part.profiles, protocol=5))
    yield pa.RecordBatch.from_pydict(
        {"part": [index] * len(tables), "table": tables, "body": bodies},
        schema=pa.schema([("part", pa.int32()), ("table", pa.string()), ("body", pa.binary())]),
    )


def parts_of(rows: pa.Table) -> list[Part]:
    """The tasks' rows of :data:`SHAPED` as one :class:`Part` each, in the parts' order."""
    found: dict[int, Part] = {}
    for index, table, body in zip(
        rows.column("part").to_pylist(),
        rows.column("table").to_pylist(),
        rows.column("body").to_pylist(),
        strict=True,
    ):
        part = found.setdefault(index, Part({}, {}, {}))
        if table == PROFILES:
            part.profiles.update(pickle.loads(body))
            continue
        batch, tally = pickle.loads(body)
        part.tables[table] = batch
        if tally is not None:
            part.tallies[table] = tally
    return [found[index] for index in sorted(found)]
