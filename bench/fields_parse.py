"""The aggregate's fields read in Arrow (``exactly.events.fields.parse``), this checkout against
another, in turn.

    .venv/bin/python bench/fields_parse.py --before /path/to/other/checkout/src [--rounds 20]

``parse`` of this checkout and of ``--before``'s, both loaded into one process and called in
turn, round after round, over the same reads: 10,000 of the demo's events as ``events`` holds
them (one in eight a purchase with a numeric ``revenue``), with the fields the aggregate job
reads for ``event_counts``. Prints a markdown table: CPU per value (medians of the rounds), the
ratio, and how many values each left to Spark's ``from_json``, which costs the JVM about a
hundred microseconds a value (docs/pace.md). One process and alternation take the machine's
drift out of the ratio.
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
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa  # type: ignore[import-untyped]

import checkouts
from exactly.demo import generate_events
from exactly.events import fields as after
from exactly.events.normalise import Receipt, normalise

VALUES = 10_000
READ = 10_000  # values a call: a read of the source
CALLS = 3  # calls a round, each side


def values() -> pa.BinaryArray:
    receipt = Receipt.of("web")
    events = generate_events(VALUES, random.Random(7), time.time())
    return pa.array([normalise(e, receipt)[1] for e in events], pa.binary())


def event_counts_fields(module: ModuleType) -> object:
    """The fields the aggregate's source reads for ``event_counts`` (aggregate/frame.py)."""
    field = module.Field
    return module.Fields(
        (
            field("type", "string"),
            field("event", "string"),
            field("sourceId", "string"),
            field("timestamp", "timestamp"),
            field("receivedAt", "timestamp"),
            field("properties", "map", ("revenue",)),
        )
    )


def timed(module: ModuleType, fields: object, array: pa.BinaryArray) -> float:
    """CPU seconds per value of :data:`CALLS` parses of ``array``."""
    started = time.process_time()
    for _ in range(CALLS):
        module.parse(array, fields)
    return (time.process_time() - started) / CALLS / len(array)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout's src")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    before = checkouts.load_before(args.before, "exactly.events.fields")
    array = values()
    sides = {"before": before, "after": after}
    read_by = {name: event_counts_fields(module) for name, module in sides.items()}
    left = {
        name: sum(row is None for row in module.parse(array, read_by[name]).to_pylist())
        for name, module in sides.items()
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, module in sides.items():
            times[name].append(timed(module, read_by[name], array))
    median = {name: statistics.median(found) for name, found in times.items()}
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, ", end="")
    print(f"{args.rounds} rounds of {CALLS} parses of {len(array):,} values each side")
    print("| parse, CPU per value | before | after | after / before |")
    print("| --- | ---: | ---: | ---: |")
    print(
        f"| the demo's events, event_counts' fields | {median['before'] * 1e6:.2f} µs "
        f"| {median['after'] * 1e6:.2f} µs | **{median['after'] / median['before']:.2f}** |"
    )
    print(
        f"| values left to from_json | {left['before']:,} | {left['after']:,} "
        f"| {left['after'] / max(left['before'], 1):.2f} |"
    )


if __name__ == "__main__":
    main()
