"""``exactly backfill``'s records/s: the history of ``events`` routed to a late destination.

    .venv/bin/python bench/backfill.py [--events 300000] [--chunk 50000] [--shape MODE]

``bench/aggregate.py``'s fill (the demo's events, ~300 B, 4 partitions of the embedded sqlite
log), then a sqlite JobDB in which the live route has routed all of it to ``old`` and has just
started with ``late`` (its route span opens at the log's end, as ``exactly route`` opens it),
then ``exactly backfill late`` as the command runs it (one Spark session, ``local[2]``, chunks
of ``--chunk`` records). Prints the steady rate: the records of the chunks after the first over
the time since the first was committed. ``--shape`` as in ``bench/route.py``: ``late`` takes
every event with no filter (``none``), a filter true for every event (``filter``), or that and a
Python transform that copies three fields (``transform``). The ``exactly`` imported is the
first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregate import fill  # type: ignore[import-not-found]
from exactly.config import load_settings
from exactly.delivery import backfill
from exactly.delivery.jobdb import open_jobdb
from exactly.log import open_log
from exactly.spark.session import build_session
from route import SHAPES, TRANSFORM  # type: ignore[import-not-found]

COMMITTED = re.compile(r"chunk (\d+) committed, ([\d,]+) of")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--chunk", type=int, default=50_000)
    parser.add_argument("--shape", choices=SHAPES, default="none")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exactly-backfill-") as work:
        home = Path(work)
        (home / "exactly.toml").write_text(
            f'data_dir = "{home / "data"}"\n'
            '[[destinations]]\nname = "late"\nurl = "http://127.0.0.1:9/in"\n' + SHAPES[args.shape]
        )
        (home / "bench_shapes.py").write_text(TRANSFORM)
        settings = load_settings(home / "exactly.toml")
        fill(settings.log_url, args.events)
        stream = f"events@{home / 'checkpoint'}"
        with open_log(settings.log_url) as log, open_jobdb(settings.jobdb_url) as jobdb:
            # the live route: everything routed to old, then late joins at the log's end
            jobdb.open_routes(stream, "events", ["old"])
            ends = log.end_offsets("events")
            jobdb.add([], query_id="live", batch_id=0, stream=stream, end_offsets=ends)
            jobdb.open_routes(stream, "events", ["old", "late"])
            spark = build_session(settings, app_name="bench-backfill")
            plan = backfill.configured_plan(settings, "late", chunk_records=args.chunk)
            marks: list[tuple[float, int]] = []

            def say(line: str) -> None:
                found = COMMITTED.search(line)
                if found:
                    marks.append((time.monotonic(), int(found.group(2).replace(",", ""))))

            done = backfill.drive(spark, plan, jobdb, log, say=say)
            jobs = sum(jobdb.states()["late"].values())
            spark.stop()
    if len(marks) < 2:
        raise SystemExit("one chunk only: give more --events than --chunk")
    first, last = marks[0], marks[-1]
    rate = (last[1] - first[1]) / (last[0] - first[0])
    assert jobs == done.jobs == args.events, (jobs, done.jobs, args.events)
    print(f"{done.chunks} chunks, {jobs:,} jobs in {done.seconds:.1f} s", flush=True)
    print(f"backfill ({args.shape}) {rate:,.0f} records/s")


if __name__ == "__main__":
    main()
