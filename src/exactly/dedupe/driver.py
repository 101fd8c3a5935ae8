"""Running the dedupe job from the command line: topics, lock, Spark, status after each batch."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.config import Settings
from exactly.dedupe import status as status_file
from exactly.dedupe.job import (
    DedupePlan,
    default_checkpoint,
    describe,
    late_rows,
    prepare,
    run,
    store_kind,
)
from exactly.dedupe.window import Bounds
from exactly.errors import ConfigError, ExactlyError
from exactly.log import Log, open_log
from exactly.spark.streaming import checkpoint_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Summary:
    records: int
    batches: int
    status: status_file.DedupeStatus


def configured_plan(
    settings: Settings,
    *,
    source: str = "raw",
    output: str = "events",
    checkpoint: Path | None = None,
    until_caught_up: bool = False,
    max_records_per_trigger: int | None = None,
    trigger_seconds: float = 1.0,
) -> DedupePlan:
    """The job's plan from ``settings``: what ``exactly dedupe`` and ``exactly up`` both run (the
    flags that name a setting, ``--store``, ``--window`` ..., are in ``settings`` already)."""
    from exactly.units import parse_duration, parse_size

    config = settings.dedupe
    bounds = Bounds(
        max_keys=config.max_keys,
        max_bytes=None if config.max_bytes is None else parse_size(config.max_bytes),
        window=parse_duration(config.window),
    )
    kind = store_kind(config.store)
    refuse_local_store(kind, settings.spark.master)
    return DedupePlan(
        log_url=settings.log_url,
        store=config.store,
        data_dir=settings.data_dir,
        checkpoint=(
            checkpoint or default_checkpoint(settings.data_dir, kind, source, output)
        ).resolve(),
        source=source,
        output=output,
        bounds=bounds,
        min_window=parse_duration(config.min_window),
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        max_record_bytes=settings.log.max_record_bytes,
        scope=config.scope,
    )


def refuse_local_store(kind: str, master: str) -> None:
    """Refuse the rocksdb store on a master that is not local: its files live on the executor
    that ran a partition's task, and a rerun on another host would find none (docs/cluster.md)."""
    if kind == "rocksdb" and not master.startswith("local"):
        raise ConfigError(
            f"the rocksdb dedupe store keeps its files on the executor's own disk, which the "
            f'workers of {master} do not share: use store = "redis://HOST:PORT,..." on a '
            "cluster (docs/cluster.md)"
        )


def previous_late(plan: DedupePlan) -> int:
    path = status_file.status_path(plan.data_dir, plan.source)
    try:
        _, saved = status_file.load(path, plan.log_url, plan.data_dir, plan.store)
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return 0
    return saved.late if saved.checkpoint == str(plan.checkpoint) else 0


def drive(
    settings: Settings,
    plan: DedupePlan,
    *,
    quiet: bool = False,
    spark: SparkSession | None = None,
) -> Summary:
    """Run the job as ``exactly dedupe`` does; returns what it did and the final status.

    ``spark``: a running session to use (``exactly up`` runs every query in one
    application), left running; without one the job starts Spark and stops it at the end.
    """
    with open_log(plan.log_url, max_record_bytes=plan.max_record_bytes) as log:
        partitions = prepare(log, plan)
        with checkpoint_lock(plan.checkpoint, "dedupe job"):
            own = spark is None
            if spark is None:
                from exactly.spark.session import build_session

                spark = build_session(settings, app_name=f"exactly-dedupe-{plan.source}")
            # A new checkpoint's state store gets one partition per raw partition.
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            say = (lambda _: None) if quiet else _say
            say(describe(plan))
            late = previous_late(plan)
            warned: set[str] = set()

            def on_batch(report: dict[str, Any]) -> None:
                nonlocal late
                late += late_rows(report)
                rows = int(report.get("numInputRows", 0))
                if rows:
                    say(f"batch {report['batchId']}: {rows} records")
                try:
                    current = _save(log, plan, late, report)
                except (ExactlyError, OSError) as error:  # a report: never a reason to stop
                    print(f"warning: status not saved: {error}", file=sys.stderr, flush=True)
                    return
                for line in current.warnings():
                    if line not in warned:
                        warned.add(line)
                        print(f"warning: {line}", file=sys.stderr, flush=True)

            progress = run(spark, plan, partitions, on_batch)
            if own:
                spark.stop()
        final = _save(log, plan, late, progress.batches.get(max(progress.batches, default=-1), {}))
    batches = sum(1 for b in progress.batches.values() if int(b.get("numInputRows", 0)))
    return Summary(progress.records, batches, final)


def _save(
    log: Log, plan: DedupePlan, late: int, report: dict[str, Any]
) -> status_file.DedupeStatus:
    last: dict[str, Any] = {
        key: report[key]
        for key in ("batchId", "timestamp", "numInputRows", "processedRowsPerSecond")
        if key in report
    }
    current = status_file.collect(log, plan, late, last)
    status_file.save(plan, current)
    return current


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
