"""Resumable import of a JSON-lines file (optionally gzipped) into the ``raw`` topic.

Each line is one event, validated and normalised like the collector's (:mod:`exactly.events`;
the line's own ``type`` says what it is). Guarantee: an import killed at any point and started
again ends with every valid line in the log exactly once (DESIGN.md boundary 2). How:

1. the producer name is derived from the source and the file's identity (a digest of its size and
   first 64 KiB), so the same file resumes as the same producer;
2. each line's sequence id is its byte offset in the (decompressed) file, and its messageId, when
   it has none, is derived from the producer and that offset, so a line lands in the same
   partition on every run;
3. on start, ``last_sequence`` is read for every partition, and a line whose offset is at or below
   its partition's last sequence is skipped: it is already in;
4. lines are appended per partition in file order with their sequence ids, so what a killed run
   left durable in each partition is a prefix of that partition's lines, and the log itself drops
   any line sent twice.

Invalid lines (not JSON, breaking the event rules, nested too deeply, larger than the log's record
limit) are reported with their line numbers and never appended; blank lines are skipped.
One import per file at a time (one writer per producer name).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from exactly.errors import ImportFailed, InvalidEvent, UnknownTopic
from exactly.events import Receipt, ksuid, normalise, parse_millis, partition_for
from exactly.log import Log, Record

IDENTITY_BYTES = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class ImportReport:
    """What an import did. ``skipped``: lines a previous run had already put in the log."""

    path: Path
    producer: str
    lines: int = 0
    imported: int = 0
    skipped: int = 0
    invalid: int = 0
    blank: int = 0
    seconds: float = 0.0

    def summary(self, topic: str) -> str:
        return (
            f"imported {self.imported:,} events into {topic} in {self.seconds:.1f} s\n"
            f"  from {self.path}\n"
            f"  {self.lines:,} lines: {self.skipped:,} already in the log, "
            f"{self.invalid:,} invalid, {self.blank:,} blank"
        )


def file_identity(path: Path) -> str:
    """A digest of the file's size and first 64 KiB: the same bytes, the same identity."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(IDENTITY_BYTES)
    except OSError as error:
        raise ImportFailed(
            f"cannot read {path}: {error.strerror}; check the path and that it is readable"
        ) from error
    return hashlib.blake2b(head + str(size).encode(), digest_size=12).hexdigest()


def producer_name(source: str, path: Path) -> str:
    return f"import:{source}:{file_identity(path)}"


def _open(path: Path) -> tuple[io.BufferedIOBase, io.BufferedIOBase]:
    """(lines to read, the raw file for progress); gzip when the file starts with its magic."""
    try:
        raw = path.open("rb")
    except OSError as error:
        raise ImportFailed(
            f"cannot read {path}: {error.strerror}; check the path and that it is readable"
        ) from error
    if raw.read(2) == _GZIP_MAGIC:
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    raw.seek(0)
    return raw, raw


def lines_with_offsets(handle: io.BufferedIOBase) -> Iterator[tuple[int, int, bytes]]:
    """(line number from 1, byte offset of the line's start, the line) for every line."""
    offset = 0
    for number, line in enumerate(handle, start=1):
        yield number, offset, line
        offset += len(line)


def derived_message_id(producer: str, offset: int, event: dict[str, Any]) -> str:
    """The messageId of a line that has none: the same on every run of the same import.

    A KSUID whose payload is a digest of the producer and the line's offset, and whose time is the
    event's original timestamp (the KSUID epoch if it has none).
    """
    payload = hashlib.blake2b(f"{producer}\0{offset}".encode(), digest_size=16).digest()
    original = event.get("originalTimestamp")
    at = 0.0 if original is None else parse_millis(original, "timestamp") / 1000
    return ksuid(at=at, payload=payload)


class _Batch:
    """Lines waiting to be appended, per partition, with their offsets as sequence ids."""

    def __init__(self) -> None:
        self.records: dict[int, list[Record]] = {}
        self.sequences: dict[int, list[int]] = {}
        self.lines = 0

    def add(self, partition: int, record: Record, sequence: int) -> None:
        if partition not in self.records:
            self.records[partition], self.sequences[partition] = [], []
        self.records[partition].append(record)
        self.sequences[partition].append(sequence)
        self.lines += 1


def import_file(
    log: Log,
    path: Path,
    source: str,
    *,
    topic: str = "raw",
    partitions: int = 8,
    batch_lines: int = 5000,
    producer: str | None = None,
    on_invalid: Callable[[int, str], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> ImportReport:
    """Import ``path`` into ``topic`` (created with ``partitions`` if absent); see the module doc.

    ``on_invalid(line number, reason)`` hears of each invalid line; ``on_progress(bytes read)``
    of the progress through the file as stored.
    """
    started = time.monotonic()
    name = producer or producer_name(source, path)
    report = ImportReport(path, name)
    try:
        count = log.topic_info(topic).partitions
    except UnknownTopic:
        count = log.create_topic(topic, partitions, exist_ok=True).partitions
    # 3. where a previous run of this import stopped, per partition
    last = [log.last_sequence(topic, p, name) for p in range(count)]
    handle, raw = _open(path)
    batch = _Batch()
    limit = log.max_record_bytes  # a line the log would refuse is an invalid line, alone
    receipt = Receipt.of(source, keep_received_at=True, max_record_bytes=limit)
    with handle, raw, ThreadPoolExecutor(max_workers=min(count, 16)) as pool:
        try:
            for number, offset, line in lines_with_offsets(handle):
                report.lines += 1
                if not line.strip():
                    report.blank += 1
                    continue
                try:
                    message_id, value = normalise(
                        orjson.loads(line),
                        receipt,
                        message_id_for=partial(derived_message_id, name, offset),
                    )
                except (orjson.JSONDecodeError, InvalidEvent) as error:
                    report.invalid += 1
                    if on_invalid is not None:
                        reason = (
                            error.message
                            if isinstance(error, InvalidEvent)
                            else f"not valid JSON: {error}"
                        )
                        on_invalid(number, reason)
                    continue
                key = message_id.encode()
                partition = partition_for(key, count)
                seen = last[partition]
                if seen is not None and offset <= seen:
                    report.skipped += 1
                    continue
                batch.add(partition, Record(value, key), offset)
                if batch.lines >= batch_lines:
                    report.imported += _flush(log, topic, name, batch, pool)
                    batch = _Batch()
                    receipt = Receipt.of(source, keep_received_at=True, max_record_bytes=limit)
                    if on_progress is not None:
                        on_progress(raw.tell())
        except (OSError, EOFError, gzip.BadGzipFile) as error:
            raise ImportFailed(
                f"cannot read {path}: {error}; check the file is whole (a gzip file not cut "
                "short), then import it again: lines already imported are skipped"
            ) from error
        report.imported += _flush(log, topic, name, batch, pool)
    if on_progress is not None:
        on_progress(path.stat().st_size)
    report.seconds = time.monotonic() - started
    return report


def _flush(log: Log, topic: str, producer: str, batch: _Batch, pool: ThreadPoolExecutor) -> int:
    """4. Append each partition's lines with their sequence ids; the appends run concurrently
    (the sqlite log commits them together). Returns how many records the log took."""
    futures = [
        pool.submit(log.append, topic, p, records, producer=producer, sequences=batch.sequences[p])
        for p, records in batch.records.items()
    ]
    return sum(future.result().appended for future in futures)
