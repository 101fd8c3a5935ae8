"""The Parquet files of a batch, written by the executors before the driver commits them.

The driver asks the table for a :class:`FileWriter` (:meth:`LakeTable.file_writer
<exactly.lake.base.LakeTable.file_writer>`), Spark pickles it to the tasks, and each task writes
its rows, conformed to the batch's target schema, as one Parquet file per ``date`` under the
table's data location (``date=YYYY-MM-DD/``, Hive-style), on a local path or S3 through
``pyarrow.fs``: executors need pyarrow, never ``deltalake`` or ``pyiceberg``. A file is named
``exactly-b<batch id>-<uuid>.parquet`` (:func:`file_name`): the batch that wrote it, and a uuid
so that a rerun task, a speculative attempt or a replayed batch never overwrites another's file.

The files are in no version of the table until the driver commits the ones it collected
(:meth:`LakeTable.append_files <exactly.lake.base.LakeTable.append_files>`); those of a failed
attempt or of a batch killed before its commit are never seen, and ``exactly lake vacuum``
removes them.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from exactly.lake.columns import PARTITION, TIME_COLUMNS, conform
from exactly.lake.storage import S3, located

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # the directory of rows without a day (Hive's)
FILE_NAME = re.compile(
    r"^exactly-b(?P<batch>\d+)-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.parquet$"
)
STATS_COLUMNS = ("messageId", *TIME_COLUMNS)  # Delta's stats beyond numRecords


@dataclass(frozen=True)
class DataFile:
    """A Parquet file of a batch's rows that an executor wrote: in no version of the table
    until the driver commits it (:meth:`LakeTable.append_files
    <exactly.lake.base.LakeTable.append_files>`)."""

    path: str  # relative to the table's root (Delta's table, Iceberg's location())
    size: int  # bytes
    partition: Mapping[str, str | None]  # {"date": "2026-01-01"}; None for rows without a day
    records: int
    modified_ms: int  # when written, ms since the epoch (Delta's modificationTime)
    stats: str = ""  # Delta's add action stats (JSON); Iceberg reads the file's footer itself


def file_name(batch_id: int) -> str:
    """A new data file's name: the batch that writes it and a uuid (module docstring)."""
    return f"exactly-b{batch_id}-{uuid.uuid4()}.parquet"


@dataclass(frozen=True)
class FileWriter:
    """Writes a task's rows of one batch as Parquet files where the table's data files go.

    Picklable (Spark sends it to the executors). ``root`` is the table's root (Delta's table
    URI, Iceberg's ``location()``) and data files go under ``root/directory``; the paths in the
    :class:`DataFile` descriptions are relative to ``root``.
    """

    root: str
    directory: str  # "" (Delta) or "data" (Iceberg)
    schema: pa.Schema  # the target: the table's columns, then the batch's new ones
    batch_id: int
    s3: S3 | None = None
    partition_in_file: bool = False  # Iceberg's add_files reads the day from the column's stats
    delta_stats: bool = False  # Delta's add action carries the stats JSON

    def write(self, batches: Iterable[pa.RecordBatch]) -> list[DataFile]:
        """One file per day of the task's rows (all of them in memory: a task's share of the
        micro-batch, which ``max_records_per_trigger`` bounds); none for no rows."""
        found = list(batches)
        if not found:
            return []
        rows = conform(pa.Table.from_batches(found), self.schema)
        days = rows.column(PARTITION)
        written = []
        for day in pc.unique(days).to_pylist():
            if_day = pc.is_null(days) if day is None else pc.equal(days, pa.scalar(day, days.type))
            part = rows.filter(if_day)
            if part.num_rows:
                written.append(self._write_day(part, day))
        return written

    def _write_day(self, rows: pa.Table, day: date | None) -> DataFile:
        value = None if day is None else day.isoformat()
        directory = f"{PARTITION}={NULL_PARTITION if value is None else value}"
        relative = "/".join(p for p in (self.directory, directory, file_name(self.batch_id)) if p)
        filesystem, root = located(self.root, self.s3)
        path = f"{root}/{relative}"
        if isinstance(filesystem, pafs.LocalFileSystem):
            filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        data = rows if self.partition_in_file else rows.drop_columns([PARTITION])
        with filesystem.open_output_stream(path) as stream:
            pq.write_table(data, stream)
            size = stream.tell()
        return DataFile(
            path=relative,
            size=size,
            partition={PARTITION: value},
            records=rows.num_rows,
            modified_ms=int(time.time() * 1000),
            stats=delta_stats(rows) if self.delta_stats else "",
        )


def delta_stats(rows: pa.Table) -> str:
    """Delta's ``stats`` of a file of ``rows``: numRecords, and the minimum, maximum and null
    count of the messageId and the times, which readers skip files by. Times are written to the
    millisecond as delta-rs writes them, the maximum rounded up so that it is never below a
    value the file holds."""
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in STATS_COLUMNS:
        column = rows.column(name)
        nulls[name] = column.null_count
        bounds = pc.min_max(column).as_py()
        if bounds["min"] is not None:
            low[name] = _stat(bounds["min"], up=False)
            high[name] = _stat(bounds["max"], up=True)
    stats = {"numRecords": rows.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}
    return json.dumps(stats)


def _stat(value: Any, *, up: bool) -> Any:
    if not isinstance(value, datetime):
        return value
    at = value.astimezone(UTC)
    millis = (math.ceil if up else math.floor)(at.microsecond / 1000)
    at = at.replace(microsecond=0) + timedelta(milliseconds=millis)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
