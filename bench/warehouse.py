"""What a micro-batch costs the segment layout when it holds 300 event names, per backend.

    .venv/bin/python bench/warehouse.py [--names 300] [--properties 3] [--events 3000]
                                        [--batches 4] [--workers 4] [--backends delta,...]

Per backend (Delta and Iceberg on a local directory, Iceberg with its catalog in PostgreSQL,
PostgreSQL; the server at 127.0.0.1:5432, a fresh schema each), a fresh lake, then ``--batches``
micro-batches of ``--events`` track events spread over ``--names`` event names, so each batch
commits to ``names + 1`` tables (the per-event tables and ``tracks``). Each event has three
properties; with ``--properties N`` over 3, three more drawn from N distinct names, so that the
tables' columns keep growing from batch to batch (``[lake] max_columns`` holds them back):
:meth:`exactly.lake.warehouse.Warehouse.write`, shape and commits, no Spark. The first batch
creates the tables; the others append. Prints seconds per batch (shape and commit apart), the
commit's milliseconds per table, the columns of the widest table, the values held back in
``_rejected`` and the load average, as JSON lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exactly.lake import Marker
from exactly.lake.warehouse import Warehouse

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


@contextlib.contextmanager
def lake(backend: str, root: Path) -> Iterator[str]:
    if backend == "delta":
        yield f"delta://{root / 'lake' / 'events'}"
        return
    if backend == "iceberg":
        yield f"iceberg://{root / 'lake'}"
        return
    import psycopg

    schema = f"bench_wh_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    url = f"{POSTGRES}?options=-csearch_path%3D{schema}"
    try:
        if backend == "postgresql":
            yield f"{url}&table=events"
        else:
            base = url.removeprefix("postgresql://")
            yield f"iceberg+postgresql://{base}&warehouse={root / 'warehouse'}"
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")


def events(batch: int, count: int, names: int, properties: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(batch)
    found = []
    for n in range(count):
        extra = {}
        if properties > 3:
            extra = {f"attribute{rng.randrange(properties - 3)}": n for _ in range(3)}
        found.append(
            {
                "type": "track",
                "messageId": f"b{batch}-{n}",
                "userId": f"user-{n % 97}",
                "event": f"Event Number {n % names}",
                "timestamp": "2026-03-01T10:00:00.000Z",
                "receivedAt": "2026-03-01T10:00:00.400Z",
                "properties": {"price": n + 0.5, "quantity": n, "sku": f"sku-{n}", **extra},
                "context": {"library": {"name": "analytics.js", "version": "next-1.70.0"}},
            }
        )
    return found


def run(backend: str, options: argparse.Namespace) -> dict[str, Any]:
    shaping, committing, tables, workers, held = [], [], 0, 0, 0
    with (
        tempfile.TemporaryDirectory() as directory,
        lake(backend, Path(directory)) as url,
        Warehouse.open(url, workers=options.workers) as warehouse,
    ):
        workers = warehouse.workers  # one where the tables share a connection
        for batch in range(options.batches):
            found = events(batch, options.events, options.names, options.properties)
            started = time.perf_counter()
            shaped = warehouse.shape(found, loaded_at=datetime.now(UTC))
            shaped_at = time.perf_counter()
            held += sum(shaped.shaped.rejects.values())
            outcomes = warehouse.commit(shaped, Marker("bench", batch))
            done = time.perf_counter()
            assert all(outcome.committed for outcome in outcomes.values())
            tables = len(outcomes)
            shaping.append(shaped_at - started)
            committing.append(done - shaped_at)
        widest = max(len(kinds) for kinds in warehouse.schemas().values())
    steady = committing[1:] or committing
    return {
        "backend": backend,
        "tables": tables,
        "events": options.events,
        "properties": options.properties,
        "widest_table_columns": widest,
        "values_in_rejected": held,
        "workers": workers,
        "first_batch_commit_s": round(committing[0], 2),
        "steady_commit_s": round(statistics.median(steady), 2),
        "steady_ms_per_table": round(1000 * statistics.median(steady) / tables, 1),
        "shape_s": round(statistics.median(shaping), 2),
        "commit_s_per_batch": [round(seconds, 2) for seconds in committing],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", type=int, default=300)
    parser.add_argument("--properties", type=int, default=3)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--backends", default="delta,iceberg,iceberg+postgresql,postgresql")
    options = parser.parse_args()
    for backend in options.backends.split(","):
        print(json.dumps(run(backend, options)), flush=True)


if __name__ == "__main__":
    main()
