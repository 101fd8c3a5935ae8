"""Shaping per core: ``shape_part`` (the pure step each task runs) over SDK events, no Spark.

    PYTHONPATH=$PWD/src:$PWD .venv/bin/python bench/segment_shape_part.py [--events 20000]

The events are ``tests/warehouse_events.sdk_events`` (every call type, real SDK payloads'
shapes) as JSON would give them. Prints the median events/s of three rounds; run two
checkouts in turn (``PYTHONPATH=OTHER/src``) for a baseline in the same minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

import orjson
from tests.warehouse_events import sdk_events

from exactly.lake.segment.limits import Limits
from exactly.lake.segment.parts import shape_part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    events = [orjson.loads(orjson.dumps(event)) for event in sdk_events(0, args.events)]
    rates = []
    for _ in range(args.rounds):
        began = time.perf_counter()
        shape_part(events, {}, loaded_at=datetime.now(UTC), limits=Limits(), can_widen=True)
        rates.append(len(events) / (time.perf_counter() - began))
    print(f"shape_part {statistics.median(rates):,.0f} events/s")


if __name__ == "__main__":
    main()
