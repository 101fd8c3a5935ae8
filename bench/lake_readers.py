"""What reading the segment layout costs with 300 event tables: ``exactly lake sql`` registering
the tables a query names against registering all of them, and ``exactly status``'s reading.

    .venv/bin/python bench/lake_readers.py [--names 300] [--events 3000] [--batches 2]
                                           [--backends delta,iceberg,postgresql]

Per backend a fresh lake (bench/warehouse.py's), ``--batches`` micro-batches of ``--events``
track events over ``--names`` names committed to it (no Spark), then, each the median of three
runs: a query over two tables with only the named ones registered (:func:`exactly.lake.sql.query`,
as built), the same query with every table registered up front, and
:func:`exactly.lake.status.table_statuses` (every table's version, rows, end offsets and
``_rejected``). Prints JSON lines with seconds and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from exactly.lake import Marker
from exactly.lake.sql import NAME, query, run
from exactly.lake.status import table_statuses
from exactly.lake.warehouse import Warehouse
from warehouse import events, lake  # bench/warehouse.py

TEXT = "select count(*) from event_number_1 a join event_number_2 b on a.user_id = b.user_id"


def timed(call: Callable[[], Any]) -> float:
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        call()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def measure(backend: str, options: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as directory,
        lake(backend, Path(directory)) as url,
        Warehouse.open(url) as warehouse,
    ):
        for batch in range(options.batches):
            found = events(batch, options.events, options.names)
            warehouse.write(
                found,
                Marker("bench", batch, {0: (batch + 1) * options.events}),
                loaded_at=datetime.now(UTC),
            )
        table = warehouse.events
        names = warehouse.tables()

        def every() -> Any:
            sources = {NAME: table, **{name: warehouse.table(name) for name in names}}
            return run(sources, TEXT)

        named = timed(lambda: query(table, TEXT, siblings=True))
        everything = timed(every)
        status = timed(lambda: table_statuses(warehouse, {0: options.batches * options.events}))
    return {
        "backend": backend,
        "tables": len(names),
        "rows": options.batches * options.events,
        "sql_named_s": round(named, 3),
        "sql_every_table_s": round(everything, 3),
        "status_s": round(status, 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", type=int, default=300)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--backends", default="delta,iceberg,postgresql")
    options = parser.parse_args()
    for backend in options.backends.split(","):
        print(json.dumps(measure(backend, options)), flush=True)


if __name__ == "__main__":
    main()
