"""Several directors on one JobDB: deliveries/s of 2 director processes beside 1, same run.

    .venv/bin/python bench/directors.py [--jobs 100000] [--sources 16] [--partitions 8]
                                        [--jobdb sqlite,postgresql] [--rounds 3]

The fast receiver of ``bench/delivery.py`` (a raw asyncio protocol in its own process, on the
same cores) answers 200. Per round and JobDB, in turn for 1 and for 2 directors: ``--jobs``
single-event jobs from ``--sources`` sources (a bucket each, spread over ``--partitions``
partitions) added to an empty JobDB; then that many director processes
(:class:`exactly.delivery.director.Director`, ``partitions = --partitions``, a destination with
``max_in_flight = --in-flight`` shared among them) open it, wait for one signal and deliver until
drained; deliveries/s from the signal to the last one's end. Medians, the ratio 2 / 1, and the
machine's core count: on 2 cores with the receiver beside them, little can be gained.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import PAYLOAD, empty_jobdb, receiver  # type: ignore[import-not-found]
from exactly.delivery.director import Director
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED, NewJob
from exactly.delivery.settings import DestinationSettings

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def fill(db_url: str, jobs: int, sources: int, dataset_rows: int = 10_000_000) -> None:
    """``jobs`` jobs for the destination ``bench``, round robin over ``sources`` sources."""
    expire = time.time() + 4 * 3600
    with open_jobdb(db_url, dataset_rows=dataset_rows) as db:
        for batch, start in enumerate(range(0, jobs, 10_000)):
            db.add(
                [
                    NewJob(f"s{i % sources}", "bench", PAYLOAD, f"m{i}", expire_at=expire)
                    for i in range(start, min(jobs, start + 10_000))
                ],
                query_id="bench",
                batch_id=batch,
            )


def direct(db_url: str, url: str, partitions: int, in_flight: int, go: Any, done: Any) -> None:
    """A director process: open the JobDB, wait for ``go``, deliver until drained."""
    target = DestinationSettings(
        name="bench",
        url=url,
        secret=SECRET,
        max_in_flight=in_flight,  # type: ignore[arg-type]
    )
    with open_jobdb(db_url) as db:
        director = Director(
            db, [target], poll_seconds=0.05, report=lambda _: None, partitions=partitions
        )
        done.put("ready")
        go.wait()
        director.run(until_drained=True)
        done.put(director.tallies["bench"].succeeded)


def drain(args: argparse.Namespace, backend: str, url: str, directors: int) -> float:
    context = multiprocessing.get_context("spawn")
    with empty_jobdb(backend) as db_url:
        fill(db_url, args.jobs, args.sources)
        go, done = context.Event(), context.Queue()
        processes = [
            context.Process(
                target=direct, args=(db_url, url, args.partitions, args.in_flight, go, done)
            )
            for _ in range(directors)
        ]
        for process in processes:
            process.start()
        for _ in processes:
            assert done.get(timeout=120) == "ready"
        began = time.perf_counter()
        go.set()
        for process in processes:
            process.join(timeout=1800)
        seconds = time.perf_counter() - began
        while not done.empty():
            done.get()
        with open_jobdb(db_url) as db:
            states = db.states()
        assert states == {"bench": {SUCCEEDED: args.jobs}}, states
        return args.jobs / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--sources", type=int, default=16)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--jobdb", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rates: dict[tuple[str, int], list[float]] = {}
    with receiver() as url:
        for r in range(args.rounds):
            for backend in args.jobdb.split(","):
                for directors in (1, 2):
                    rate = drain(args, backend, url, directors)
                    rates.setdefault((backend, directors), []).append(rate)
                    print(f"round {r}: {backend}, {directors} director(s): {rate:,.0f}/s")
    print()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.2f} before")
    print(
        f"{args.jobs:,} jobs from {args.sources} sources over {args.partitions} partitions, "
        f"max_in_flight {args.in_flight}; medians of {args.rounds} rounds"
    )
    print("| JobDB | directors | runs (deliveries/s) | median | 2 / 1 |")
    print("| --- | ---: | --- | ---: | ---: |")
    for backend in args.jobdb.split(","):
        one = statistics.median(rates[(backend, 1)])
        for directors in (1, 2):
            found = rates[(backend, directors)]
            median = statistics.median(found)
            ratio = f"{median / one:.2f}" if directors == 2 else ""
            runs = ", ".join(f"{rate:,.0f}" for rate in found)
            print(f"| {backend} | {directors} | {runs} | {median:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
