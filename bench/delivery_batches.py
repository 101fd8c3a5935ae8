"""Batches: events/s a batching destination delivers, beside a bare client posting the same.

    .venv/bin/python bench/delivery_batches.py [--events 200000] [--batch 500] [--concurrency 8]
                                               [--rounds 3] [--jobs packs|events]

The fast receiver of ``bench/delivery.py`` (a raw asyncio protocol in its own process, on the
same cores) answers 200. Per round, interleaved:

* **director**: ``--events`` events of 300 bytes added to an empty sqlite JobDB as the route
  query adds them (``--jobs packs``: a job per batch, docs/delivery.md "Packs"; ``events``: a
  job per event, which the director forms into batches), then delivered by
  :class:`exactly.delivery.director.Director` to a destination with ``batch.max_events =
  --batch`` (``json-array``, ``max_in_flight = --concurrency``), every batch recorded before it
  leaves and its outcome after; events/s from start to drained;
* **bare client**: aiohttp posting the same number of ``json-array`` bodies of ``--batch``
  events, ``--concurrency`` at a time, with the same headers; events/s.

Medians, and the ratio director / bare client of each round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import PAYLOAD, empty_jobdb, receiver, timed
from exactly.delivery import route
from exactly.delivery.batches import body
from exactly.delivery.director import Director
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import NewJob
from exactly.delivery.settings import DestinationSettings

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def director_rate(url: str, events: int, size: int, concurrency: int, *, packed: bool) -> float:
    target = DestinationSettings.model_validate(
        {
            "name": "bench",
            "url": url,
            "secret": SECRET,
            "max_in_flight": concurrency,
            "batch": {"max_events": size, "max_wait": "100ms", "max_bytes": 10_000_000},
        }
    )
    with empty_jobdb("sqlite") as jobdb_url, open_jobdb(jobdb_url, dataset_rows=1_000_000) as db:
        for number, start in enumerate(range(0, events, 10_000)):
            jobs = [
                NewJob("web", "bench", PAYLOAD, f"m{i}", expire_at=time.time() + 3600)
                for i in range(start, min(events, start + 10_000))
            ]
            if packed:  # as the route query adds them: a job per batch
                jobs = route.packed(jobs, target)
            db.add(jobs, query_id="bench", batch_id=number)
        director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)
        seconds = timed(lambda: director.run(until_drained=True))
        assert director.tallies["bench"].succeeded == events, director.tallies
        return events / seconds


def client_rate(url: str, events: int, size: int, concurrency: int) -> float:
    import aiohttp

    from exactly.delivery.signing import request_headers

    data = body("json-array", [PAYLOAD] * size, time.time())
    requests = events // size

    async def run() -> None:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            queue = iter(range(requests))

            async def worker() -> None:
                for n in queue:
                    headers = request_headers(
                        message_id=f"batch_{n:032d}",
                        body=data,
                        timestamp=int(time.time()),
                        keys=(b"k" * 24,),
                        extra={},
                    )
                    async with session.post(url, data=data, headers=headers) as answer:
                        await answer.read()
                        assert answer.status == 200

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    return requests * size / timed(lambda: asyncio.run(run()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--jobs",
        choices=("packs", "events"),
        default="packs",
        help="packs: the route query's batches, a job each (today's route); events: a job "
        "per event, batched by the director (an ordered destination, or the route before packs)",
    )
    options = parser.parse_args()
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()}", flush=True)
    directors: list[float] = []
    clients: list[float] = []
    with receiver() as url:
        for round_ in range(options.rounds):
            client = client_rate(url, options.events, options.batch, options.concurrency)
            director = director_rate(
                url,
                options.events,
                options.batch,
                options.concurrency,
                packed=options.jobs == "packs",
            )
            clients.append(client)
            directors.append(director)
            print(
                f"round {round_ + 1}: director ({options.jobs}) {director:,.0f} events/s, "
                f"bare aiohttp {client:,.0f} events/s, ratio {director / client:.2f}",
                flush=True,
            )
    ratios = [d / c for d, c in zip(directors, clients, strict=True)]
    print(
        f"median: director {statistics.median(directors):,.0f} events/s, bare aiohttp "
        f"{statistics.median(clients):,.0f} events/s, ratio {statistics.median(ratios):.2f}; "
        f"load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
