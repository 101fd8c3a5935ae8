"""Reads answered in Arrow columns: ``Log.read_range_columns``'s batches.

A batch of :data:`READ` holds a partition's records read from the log: ``offset``, ``key``
(binary; null: no key), ``value``, ``timestamp`` (int64 ms) and, when the reader asked for them,
``headers`` (a list of ``(key: string, value: binary)`` structs, empty for none; without them the
batch is of :data:`READ_WITHOUT_HEADERS`). The sqlite log cuts these columns out of its stored
batches (``sqlite_format.decode_columns``); a backend that reads records one by one (Kafka)
answers them through :func:`of_records`. Pure, and it imports nothing of the log: the log's
base class answers through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS = pa.list_(HEADER)

READ = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("headers", HEADERS),
    ]
)
READ_WITHOUT_HEADERS = READ.remove(READ.get_field_index("headers"))


def read_columns(
    offsets: np.ndarray,
    keys: pa.Array,
    values: pa.Array,
    stamps: np.ndarray,
    headers: Sequence[Sequence[tuple[str, bytes]]] | pa.ListArray | None,
) -> pa.RecordBatch:
    """A batch of :data:`READ` (``headers`` None: of :data:`READ_WITHOUT_HEADERS`); the
    headers as each record's pairs, or already a column."""
    columns = [pa.array(offsets, pa.int64()), keys, values, pa.array(stamps, pa.int64())]
    if headers is None:
        return pa.RecordBatch.from_arrays(columns, schema=READ_WITHOUT_HEADERS)
    if not isinstance(headers, pa.ListArray):
        headers = header_column(headers)
    return pa.RecordBatch.from_arrays([*columns, headers], schema=READ)


def no_headers(count: int) -> pa.ListArray:
    """The headers column of ``count`` records that have none."""
    empty = pa.StructArray.from_arrays(
        [pa.array([], pa.string()), pa.array([], pa.binary())], fields=list(HEADER)
    )
    return pa.ListArray.from_arrays(pa.array(np.zeros(count + 1, np.int32)), empty)


def of_records(records: Sequence[tuple[Any, ...]], headers: bool) -> pa.RecordBatch:
    """``LogRecord`` tuples read from one partition as a batch of :data:`READ`: what a backend
    without a columnar read of its own answers."""
    if not records:
        schema = READ if headers else READ_WITHOUT_HEADERS
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    _, offsets, keys, values, found, stamps = zip(*records, strict=True)
    return read_columns(
        np.array(offsets, np.int64),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        np.array(stamps, np.int64),
        found if headers else None,
    )


def header_column(found: Sequence[Sequence[tuple[str, bytes]]]) -> pa.ListArray:
    """Each record's headers as one ``list<struct<key, value>>`` column, built from flat lists
    of names and values (no dict per header)."""
    starts = [0, *accumulate(map(len, found))]
    pairs = [pair for one in found for pair in one]
    names = pa.array([name for name, _ in pairs], pa.string())
    data = pa.array([value for _, value in pairs], pa.binary())
    entries = pa.StructArray.from_arrays([names, data], fields=list(HEADER))
    return pa.ListArray.from_arrays(pa.array(starts, pa.int32()), entries)
