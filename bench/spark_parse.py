"""How fast Spark turns event JSON into columns, each way it offers, in one run.

    .venv/bin/python bench/spark_parse.py [--events 400000] [--repeat 3]

The aggregate job's limit is its parse (docs/benchmarks.md): ``from_json`` over the record values.
This script times the ways Spark has to read the fields the event counts table needs (``type``,
``event``, ``sourceId``, ``timestamp``, ``receivedAt``) from the same events
(``spark_plain.make_events``), each a batch job into the ``noop`` sink on ``local[2]``:

* **values alone**: the values read from a Parquet file of one binary column, not parsed (the
  floor of the others);
* **from_json**: the aggregate job's way, ``from_json(CAST(value AS STRING), schema)``;
* **parse_json + variant_get**: Spark 4's ``VARIANT``, parsed once, each field read from it;
* **json_tuple**: each field's text (no types: the timestamps stay strings);
* **JSON file reader**: ``spark.read.schema(...).json(file)`` over the same events as JSON lines,
  what the plain Spark baseline of ``bench/spark_plain.py`` does.

Medians of ``--repeat`` rounds after one warm-up round, the ways alternating in each round.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_plain import make_events  # type: ignore[import-not-found]

FIELDS = [
    ("type", "string"),
    ("event", "string"),
    ("sourceId", "string"),
    ("timestamp", "timestamp"),
    ("receivedAt", "timestamp"),
]
SCHEMA = ", ".join(f"{name} {kind}" for name, kind in FIELDS)


def ways(spark: object, work: Path) -> dict[str, Callable[[], None]]:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    assert isinstance(spark, SparkSession)

    def values() -> DataFrame:
        return spark.read.parquet(str(work / "values.parquet"))

    def text() -> object:
        return F.col("value").cast("string")

    def noop(frame: DataFrame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def variant() -> None:
        parsed = values().select(F.parse_json(text()).alias("v"))
        noop(parsed.select(*[F.variant_get("v", f"$.{n}", k).alias(n) for n, k in FIELDS]))

    return {
        "values alone": lambda: noop(values()),
        "from_json (the aggregate job)": lambda: noop(
            values().select(F.from_json(text(), SCHEMA).alias("e")).select("e.*")
        ),
        "parse_json + variant_get": variant,
        "json_tuple (text only)": lambda: noop(
            values().select(F.json_tuple(text(), *[name for name, _ in FIELDS]))
        ),
        "JSON file reader (plain Spark)": lambda: noop(
            spark.read.schema(SCHEMA).json(str(work / "events.json"))
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from exactly.config import Settings
    from exactly.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="exactly-bench-parse-"))
    try:
        events = make_events(args.events)
        (work / "events.json").write_bytes(b"\n".join(events) + b"\n")
        table = pa.table({"value": pa.array(events, pa.binary())})
        pq.write_table(table, work / "values.parquet", row_group_size=50_000)
        load = os.getloadavg()[0]
        print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.1f}")
        spark = build_session(Settings(data_dir=work / "spark"), "bench-parse", master="local[2]")
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        found = ways(spark, work)
        for run in found.values():  # warm-up
            run()
        seconds: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(args.repeat):
            for name, run in found.items():
                began = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - began)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = args.events / statistics.median(seconds["from_json (the aggregate job)"])
    print(f"\n{args.events:,} events, medians of {args.repeat}, after one warm-up round\n")
    print("| way | runs (events/s) | median | / from_json |")
    print("| --- | --- | ---: | ---: |")
    for name, runs in seconds.items():
        rates = [args.events / s for s in runs]
        median = statistics.median(rates)
        listed = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"| {name} | {listed} | {median:,.0f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
