"""What a read task of the source costs per record, with and without the headers column.

    .venv/bin/python bench/source_read.py [--records 200000] [--repeat 5]

One partition of the embedded sqlite log holding records as the ``events`` topic does (a JSON
value of ~270 bytes, the messageId as key, the two headers the dedupe job and the sink add),
read in batches of 10,000 and turned into Arrow record batches the way a read task does, on
one core, outside Spark:

* headers as before this change: a Python dict per header, ``pa.array`` of lists of dicts;
* headers as now: one ``list<struct>`` column built from flat lists;
* ``headers=false``: the log does not decode them and the batch has no headers column.

Medians of ``--repeat`` rounds, the three alternated in each round; prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.log import LogRecord, Record, open_log
from exactly.spark.datasource.source import ARROW_SCHEMA, to_arrow

VALUE = b'{"type":"track","event":"Viewed","userId":"u1","sourceId":"web"}' + b" " * 200


def per_dict(records: Sequence[LogRecord]) -> pa.RecordBatch:
    """The headers column as the source built it before: a dict per header."""
    batch = to_arrow(records, headers=False)
    column = pa.array(
        [[{"key": n, "value": v} for n, v in r.headers] for r in records],
        ARROW_SCHEMA.field("headers").type,
    )
    return pa.RecordBatch.from_arrays([*batch.columns, column], schema=ARROW_SCHEMA)


def fill(url: str, records: int) -> None:
    with open_log(url) as log:
        log.create_topic("events", 1)
        for start in range(0, records, 10_000):
            log.append(
                "events",
                0,
                [
                    Record(
                        VALUE,
                        key=uuid.uuid4().hex.encode(),
                        headers=(
                            ("exactly.source.offset", b"%d" % n),
                            ("exactly.sink", b"%s 12 0 %d" % (uuid.uuid4().hex.encode(), n)),
                        ),
                    )
                    for n in range(start, min(start + 10_000, records))
                ],
            )


def read_all(url: str, headers: bool, build: Callable[[Sequence[LogRecord]], object]) -> float:
    with open_log(url) as log:
        began = time.perf_counter()
        offset = 0
        while batch := log.read("events", 0, offset, max_records=10_000, headers=headers):
            build(batch)
            offset = batch[-1].offset + 1
        return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    ways: dict[str, tuple[bool, Callable[[Sequence[LogRecord]], object]]] = {
        "headers, a dict per header (before)": (True, per_dict),
        "headers, from flat lists (now)": (True, to_arrow),
        "headers=false": (False, lambda records: to_arrow(records, headers=False)),
    }
    micros: dict[str, list[float]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        url = f"sqlite://{Path(scratch) / 'log'}"
        fill(url, args.records)
        for headers, build in ways.values():
            read_all(url, headers, build)  # warm the page cache and the code
        for _ in range(args.repeat):
            for name, (headers, build) in ways.items():
                micros[name].append(read_all(url, headers, build) / args.records * 1e6)
    first = statistics.median(micros[next(iter(ways))])
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.2f} before")
    print(f"{args.records:,} records, medians of {args.repeat}")
    print("| read task, per record | runs (µs) | median (µs) | / before |")
    print("| --- | --- | ---: | ---: |")
    for name, found in micros.items():
        median = statistics.median(found)
        runs = ", ".join(f"{x:.2f}" for x in found)
        print(f"| {name} | {runs} | {median:.2f} | {median / first:.2f} |")


if __name__ == "__main__":
    main()
