"""Records as Arrow columns: what the Spark sink appends without a Python object per record.

A batch of records in columns is a ``pyarrow.RecordBatch`` of :data:`SCHEMA`: ``value``
(binary, never null), ``key`` (binary; null: no key), ``headers`` (a list of ``(key: string,
value: binary)`` structs per record; null: none) and ``timestamp`` (int64 ms; null: the append's
time). They are the same records as the :class:`~exactly.log.Record` objects
``exactly.log.base.records_of`` returns, and every backend appends either form
(``Log.append_columns``, ``PartitionWriter.append_columns``). The sqlite log packs columns with
Arrow's kernels (``sqlite_format.pack_columns``), byte for byte as it packs Records; a backend
without a columnar path appends them as Records (Kafka's producer takes records one by one).

Everything here is pure; :func:`check` refuses what ``Log.append`` refuses, with the same
messages.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from exactly.errors import InvalidRecord, RecordTooLarge
from exactly.log.base import RESERVED_HEADERS
from exactly.log.column_reads import HEADER, HEADERS

SCHEMA = pa.schema(
    [
        pa.field("value", pa.binary(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("headers", HEADERS),
        pa.field("timestamp", pa.int64()),
    ]
)


def record_columns(
    value: pa.Array, key: pa.Array, headers: pa.ListArray, timestamp: pa.Array
) -> pa.RecordBatch:
    """Columns of one length as a batch of :data:`SCHEMA`."""
    return pa.RecordBatch.from_arrays([value, key, headers, timestamp], schema=SCHEMA)


def check(batch: pa.RecordBatch, max_record_bytes: int) -> None:
    """Refuse the batch as ``Log.append`` refuses its records, naming the same record with the
    same message: a null value, a reserved header name, or a record over ``max_record_bytes``
    (value, key, and each header's name in characters and value in bytes)."""
    values = batch.column("value")
    entries, counts = header_entries(batch.column("headers"))
    names = entries.field("key")
    sizes = lengths(values) + lengths(batch.column("key"))
    reserved = np.zeros(0, np.int64)
    if len(entries):
        owners = _owners(counts)
        taken = pc.is_in(names, pa.array(sorted(RESERVED_HEADERS), pa.string()))
        reserved = owners[pc.fill_null(taken, False).to_numpy(zero_copy_only=False)]
        characters = pc.fill_null(pc.utf8_length(names), 0).to_numpy().astype(np.int64)
        header_sizes = characters + lengths(entries.field("value"))
        sizes += np.bincount(owners, header_sizes, minlength=len(sizes)).astype(np.int64)
    nulls = np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))
    large = np.flatnonzero(sizes > max_record_bytes)
    # the first record at fault, for its first fault in the order Log.append checks them
    faults = [
        (int(found[0]), rank) for rank, found in enumerate((nulls, reserved, large)) if len(found)
    ]
    if not faults:
        return
    index, fault = min(faults)
    if fault == 0:
        raise InvalidRecord(f"record {index}: the value must be bytes")
    if fault == 1:
        raise InvalidRecord(f"record {index}: header names {sorted(RESERVED_HEADERS)} are reserved")
    raise RecordTooLarge(
        f"record {index} is {int(sizes[index])} bytes; this log accepts at most "
        f"{max_record_bytes} (set log.max_record_bytes to raise the limit)"
    )


def with_header(headers: pa.ListArray, name: str, values: pa.Array) -> pa.ListArray:
    """Each record's headers less any named ``name`` (:func:`without_header`), then
    ``(name, value)`` last: how the sink marks records, a copied record's old mark giving way."""
    headers = without_header(headers, name)
    entries, counts = header_entries(headers)
    count = len(values)
    added = pa.StructArray.from_arrays(
        [pa.array([name] * count, pa.string()), values.cast(pa.binary())], fields=list(HEADER)
    )
    offsets = list_offsets(counts + 1)  # each record's entries, the added one last
    if len(entries):
        mine = np.zeros(len(entries) + count, bool)
        mine[offsets.to_numpy()[1:] - 1] = True  # the added entry closes each record's list
        order = np.empty(len(mine), np.int64)
        order[~mine] = np.arange(len(entries))
        order[mine] = np.arange(len(entries), len(mine))
        added = pa.concat_arrays([entries, added]).take(pa.array(order))
    return pa.ListArray.from_arrays(offsets, added, type=HEADERS)


def without_header(headers: pa.ListArray, name: str) -> pa.ListArray:
    """Each record's headers less those named ``name`` (null lists become empty ones)."""
    entries, counts = header_entries(headers)
    if not len(entries):
        return headers
    kept = pc.not_equal(entries.field("key"), name)
    if pc.all(kept).as_py():
        return headers
    dropped = ~kept.to_numpy(zero_copy_only=False)
    counts = counts - np.bincount(_owners(counts), dropped, len(counts)).astype(np.int64)
    return pa.ListArray.from_arrays(list_offsets(counts), entries.filter(kept), type=HEADERS)


def header_entries(headers: pa.ListArray) -> tuple[pa.StructArray, np.ndarray]:
    """The headers' entries in order (null lists hold none), and how many each record has."""
    counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy().astype(np.int64)
    entries = headers.flatten()  # minds the slice's offset and skips null lists
    return entries.cast(HEADER), counts


def list_offsets(counts: np.ndarray) -> pa.Array:
    """The offsets of lists of ``counts`` items each, for ``ListArray.from_arrays``."""
    return pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))


def _owners(counts: np.ndarray) -> np.ndarray:
    """The record each entry belongs to."""
    return np.repeat(np.arange(len(counts)), counts)


def lengths(column: pa.Array) -> np.ndarray:
    """Each item's length in bytes (0 where null)."""
    lengths: np.ndarray = pc.fill_null(pc.binary_length(column), 0).to_numpy().astype(np.int64)
    return lengths
