"""The route query's events/s: ``events`` into a sqlite JobDB, one job per event.

    .venv/bin/python bench/route.py [--events 300000] [--per-batch 50000] [--shape MODE]
                                    [--batch N]

``bench/aggregate.py``'s fill (the demo's events, ~300 B, 4 partitions of the embedded sqlite
log), then the route query as ``exactly route --until-caught-up`` runs it (one Spark session,
``local[2]``, micro-batches of ``--per-batch`` records) with one destination that takes every
event, into an empty sqlite JobDB. Prints the steady rate: the events of the micro-batches after
the first over the time since the first ended. ``--shape`` gives the destination a ``filter``
true for every event (``filter``: ``type is not null``) or also a Python ``transform`` that
copies three fields (``transform``), so the three runs make the same jobs; ``none``: neither.
The ``exactly`` imported is the first on ``PYTHONPATH``, so two checkouts compare in turn with
``bench/pairs.py``. ``--batch N``: the destination batches up to N events a request
(``[destinations.batch] max_events``), so the route query adds them as packs, a job per batch
(docs/delivery.md); the JobDB's count is in events either way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregate import fill  # type: ignore[import-not-found]
from exactly.config import load_settings
from exactly.delivery import route
from exactly.delivery.jobdb import open_jobdb
from exactly.spark.session import build_session

SHAPES = {
    "none": "",
    "filter": 'filter = "type is not null"\n',
    "transform": 'filter = "type is not null"\ntransform = "bench_shapes:shape"\n',
}
TRANSFORM = """
def shape(event):
    return {"id": event["messageId"], "type": event["type"], "user": event.get("userId")}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--per-batch", type=int, default=50_000)
    parser.add_argument("--shape", choices=SHAPES, default="none")
    parser.add_argument("--batch", type=int, default=1, help="events a request (max_events)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exactly-route-") as work:
        home = Path(work)
        (home / "exactly.toml").write_text(
            f'data_dir = "{home / "data"}"\n'
            '[[destinations]]\nname = "all"\nurl = "http://127.0.0.1:9/in"\n'
            + SHAPES[args.shape]
            + f"[destinations.batch]\nmax_events = {args.batch}\n"
        )
        (home / "bench_shapes.py").write_text(TRANSFORM)
        settings = load_settings(home / "exactly.toml")
        fill(settings.log_url, args.events)
        spark = build_session(settings, app_name="bench-route")
        plan = route.configured_plan(  # as `exactly route --until-caught-up` builds it
            settings, until_caught_up=True, max_records_per_trigger=args.per_batch
        )
        marks: list[tuple[float, int]] = []
        with open_jobdb(settings.jobdb_url) as jobdb:
            route.run(
                spark, plan, jobdb, on_batch=lambda _b, n, _j, _a: marks.append((time.time(), n))
            )
            jobs = sum(jobdb.states()["all"].values())
        spark.stop()
    steady = marks[1:]
    rate = sum(n for _, n in steady) / (steady[-1][0] - marks[0][0])
    assert jobs == args.events, (jobs, args.events)
    print(f"{len(marks)} micro-batches, {jobs:,} jobs", flush=True)
    print(f"route ({args.shape}, batches of {args.batch}) {rate:,.0f} events/s")


if __name__ == "__main__":
    main()
