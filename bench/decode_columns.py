"""The sqlite log's columnar decode of one stored batch, this checkout against another, in turn.

    .venv/bin/python bench/decode_columns.py --before /path/to/other/checkout/src [--rounds 30]

``sqlite_format.decode_columns`` (the sqlite log's columnar read, one stored batch at a time)
of this checkout and of ``--before``'s, both loaded into one process and called in turn, round
after round, over the same stored batch: 3,000 of the demo's events as the collector appends
them to ``raw`` (no headers) and as ``events`` holds them (two headers each). Each read three
ways: ``raw`` with the headers asked for (the dedupe job's read), ``events`` without them (the
aggregate's and the route's), ``events`` with them. One process and alternation take the
machine's drift out of the ratio; prints a markdown table of medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkouts
from exactly.demo import generate_events
from exactly.events.normalise import Receipt, normalise
from exactly.log import Record
from exactly.log import sqlite_format as after

RECORDS = 3000
CALLS = 5  # decodes a round, each way and each side


def batches() -> dict[str, bytes]:
    """The stored batch of ``raw`` and of ``events``."""
    receipt = Receipt.of("web")
    found = [normalise(e, receipt) for e in generate_events(RECORDS, random.Random(7), time.time())]
    raw = [Record(value, key=message_id.encode()) for message_id, value in found]
    events = [
        record._replace(headers=(("exactly.source.offset", b"%d" % n), ("exactly.sink", b"s 1 0")))
        for n, record in enumerate(raw)
    ]
    return {"raw": after.pack_records(raw, 5)[0], "events": after.pack_records(events, 5)[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout's src")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    load = os.getloadavg()
    before = checkouts.load_before(args.before, "exactly.log.sqlite_format")
    blobs = batches()
    ways = {
        "raw, headers asked (the dedupe job's)": ("raw", True),
        "events, no headers (the aggregate's, the route's)": ("events", False),
        "events, headers": ("events", True),
    }
    sides = {"before": before, "this checkout": after}
    micros: dict[tuple[str, str], list[float]] = {(w, s): [] for w in ways for s in sides}
    for name, (topic, headers) in ways.items():
        first = before.decode_columns(blobs[topic], 0, 0, RECORDS, headers)[0]
        assert first.equals(after.decode_columns(blobs[topic], 0, 0, RECORDS, headers)[0]), name
    for _ in range(args.rounds):
        for name, (topic, headers) in ways.items():
            for side, module in sides.items():
                began = time.process_time()
                for _ in range(CALLS):
                    module.decode_columns(blobs[topic], 0, 0, RECORDS, headers)
                spent = time.process_time() - began
                micros[name, side].append(spent / (CALLS * RECORDS) * 1e6)
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load)}")
    print(f"{RECORDS:,} records a stored batch, medians of {args.rounds} rounds, CPU per record")
    print("| decode | before (µs) | this checkout (µs) | this / before |")
    print("| --- | ---: | ---: | ---: |")
    for name in ways:
        old = statistics.median(micros[name, "before"])
        new = statistics.median(micros[name, "this checkout"])
        print(f"| {name} | {old:.2f} | {new:.2f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
