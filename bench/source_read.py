"""What a read task of the source costs per record: records then Arrow, or columns cut from the
stored batches.

    .venv/bin/python bench/source_read.py [--records 200000] [--repeat 5]

One partition of the embedded sqlite log holding records as the ``events`` topic does (the
demo's events as the collector stores them, about 400 bytes, a numeric revenue in one in eight;
the messageId as key; the two headers the dedupe job and the sink add), read in reads of 10,000
and turned into the source's Arrow record batches the way a read task does
(``source.read_range``), on one core, outside Spark. Two paths:

* records: the log decodes each record into a Python tuple (``Log.read_range``), and the batch
  is built from them (``column_reads.of_records``): how every read went before, and how a backend
  without a columnar read (Kafka) still goes;
* columns: the sqlite log cuts keys and values out of its stored batches with Arrow
  (``Log.read_range_columns``, ``sqlite_format.decode_columns``).

Each path four ways: ``events`` without headers (the aggregate's and the route's reads), with
them, without them but with the aggregate's fields parsed from the values (``fields``), and
``raw`` (records without headers, as the collector appends them) with the headers asked for, as
the dedupe job reads it. Medians of
``--repeat`` rounds, the paths alternated in each round; prints a markdown table with each
path's ratio to records.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.demo import generate_events
from exactly.events.fields import Field, Fields
from exactly.events.normalise import Receipt, normalise
from exactly.log import Log, Record, open_log
from exactly.log.base import read_through
from exactly.log.column_reads import of_records
from exactly.spark.datasource.source import from_columns

FIELDS = Fields(  # what the aggregate's counts read
    (
        Field("type", "string"),
        Field("event", "string"),
        Field("sourceId", "string"),
        Field("timestamp", "timestamp"),
        Field("receivedAt", "timestamp"),
        Field("properties", "map", ("revenue",)),
    )
)
READ = 10_000


def fill(url: str, records: int) -> None:
    """``records`` of the demo's events (what ``bench/e2e.py`` sends), normalised as the
    collector stores them: in ``raw`` as the collector appends them, in ``events`` with the two
    headers the dedupe job and the sink add."""
    rng = random.Random(7)
    receipt = Receipt.of("web")
    events = generate_events(records, rng, time.time())
    with open_log(url) as log:
        log.create_topic("raw", 1)
        log.create_topic("events", 1)
        for start in range(0, records, 10_000):
            found = [normalise(event, receipt) for event in itertools.islice(events, 10_000)]
            log.append("raw", 0, [Record(value, key=id.encode()) for id, value in found])
            log.append(
                "events",
                0,
                [
                    Record(
                        value,
                        key=message_id.encode(),
                        headers=(
                            ("exactly.source.offset", b"%d" % n),
                            ("exactly.sink", b"%s 12 0 %d" % (uuid.uuid4().hex.encode(), n)),
                        ),
                    )
                    for n, (message_id, value) in enumerate(found, start)
                ],
            )


def by_records(log: Log, topic: str, headers: bool) -> Iterator[pa.RecordBatch]:
    """The read as every backend's records, then columns (``Log._read_columns_at``)."""

    def read_at(offset: int, retry: bool) -> tuple[pa.RecordBatch | None, int]:
        records, reached = log._read_at(topic, 0, offset, READ, 4 << 20, headers)
        return (of_records(records, headers) if records else None), reached

    end = log.end_offset(topic, 0)
    yield from read_through(read_at, 0, end, 1.0, topic)


def by_columns(log: Log, topic: str, headers: bool) -> Iterator[pa.RecordBatch]:
    return log.read_range_columns(topic, 0, 0, max_records=READ, headers=headers)


# each way: the topic read, whether the headers are asked for, and the fields parsed
WAYS: dict[str, tuple[str, bool, Fields | None]] = {
    "no headers": ("events", False, None),
    "headers": ("events", True, None),
    "fields": ("events", False, FIELDS),
    "raw, headers asked (the dedupe job's)": ("raw", True, None),
}


def read_all(
    url: str, path: Callable[[Log, str, bool], Iterator[pa.RecordBatch]], way: str
) -> tuple[float, int]:
    """Seconds to read the partition into the source's batches, and the rows read."""
    topic, headers, fields = WAYS[way]
    with open_log(url) as log:
        began, rows = time.perf_counter(), 0
        for read in path(log, topic, headers):
            rows += from_columns(read, 0, fields).num_rows
        return time.perf_counter() - began, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    paths = {"records": by_records, "columns": by_columns}
    ways = tuple(WAYS)
    micros: dict[tuple[str, str], list[float]] = {(p, w): [] for w in ways for p in paths}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        url = f"sqlite://{Path(scratch) / 'log'}"
        fill(url, args.records)
        for path, way in micros:
            read_all(url, paths[path], way)  # warm the page cache and the code
        for _ in range(args.repeat):
            for path, way in micros:
                seconds, rows = read_all(url, paths[path], way)
                assert rows == args.records, (path, way, rows)
                micros[path, way].append(seconds / rows * 1e6)
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load)}")
    print(f"{args.records:,} records, reads of {READ:,}, medians of {args.repeat}")
    print("| read task, per record | path | runs (µs) | median (µs) | / records |")
    print("| --- | --- | --- | ---: | ---: |")
    for path, way in micros:
        median = statistics.median(micros[path, way])
        base = statistics.median(micros["records", way])
        runs = ", ".join(f"{x:.2f}" for x in micros[path, way])
        print(f"| {way} | {path} | {runs} | {median:.2f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
