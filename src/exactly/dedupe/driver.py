"""Running the dedupe job (``exactly dedupe``, ``exactly up``): plan, topics, lock, status after
each batch."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    records_read,
    run,
    store_kind,
)
from exactly.dedupe.settings import RECORDS_PER_TRIGGER
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
    max_records_per_trigger: int | None = RECORDS_PER_TRIGGER,
    trigger_seconds: float = 1.0,
) -> DedupePlan:
    """The job's plan from ``settings``: what ``exactly dedupe`` and ``exactly up`` both run (the
    flags that name a setting, ``--store``, ``--window`` ..., are in ``settings`` already)."""
    from exactly.forget.regulations import load_key
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
        forget_key=load_key(settings.data_dir),
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


def say_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Output:
    """The job's target, open: the log, its output topics made like the source."""

    log: Log
    partitions: int  # the source's, and so the output's


@contextmanager
def opened(plan: DedupePlan) -> Iterator[Output]:
    """The log with the plan's topics checked and made (:func:`exactly.dedupe.job.prepare`) and
    the checkpoint's lock held, before Spark starts: a missing source, a refused scope or a
    second job on the checkpoint stops the job in one line."""
    with open_log(plan.log_url, max_record_bytes=plan.max_record_bytes) as log:
        partitions = prepare(log, plan)
        with checkpoint_lock(plan.checkpoint, "dedupe job"):
            yield Output(log, partitions)


def drive(
    spark: SparkSession,
    plan: DedupePlan,
    output: Output,
    *,
    say: Callable[[str], None] = say_line,
    on_batch: Callable[[int, int], None] | None = None,
) -> Summary:
    """Run the query in ``spark`` (its checkpoint's lock held by :func:`opened`), saving the
    status after each batch; returns what it did and the final status. ``on_batch``: each
    batch's id and records read."""
    log, partitions = output.log, output.partitions
    # A new checkpoint's state store gets one partition per raw partition.
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    say(describe(plan))
    late = previous_late(plan)
    warned: set[str] = set()

    def note(report: dict[str, Any]) -> None:
        nonlocal late
        late += late_rows(report)
        if on_batch is not None:
            on_batch(int(report["batchId"]), records_read(report, plan.mode == "claim"))
        try:
            current = _save(log, plan, late, report)
        except (ExactlyError, OSError) as error:  # a report: never a reason to stop
            print(f"warning: status not saved: {error}", file=sys.stderr, flush=True)
            return
        for line in current.warnings():
            if line not in warned:
                warned.add(line)
                print(f"warning: {line}", file=sys.stderr, flush=True)

    progress = run(spark, plan, partitions, note)
    final = _save(log, plan, late, progress.batches.get(max(progress.batches, default=-1), {}))
    batches = sum(1 for b in progress.batches.values() if records_read(b, progress.ranges))
    return Summary(progress.records, batches, final)


def _save(
    log: Log, plan: DedupePlan, late: int, report: dict[str, Any]
) -> status_file.DedupeStatus:
    last: dict[str, Any] = {key: report[key] for key in ("batchId", "timestamp") if key in report}
    rows = int(report.get("numInputRows", 0))
    if "numInputRows" in report:  # Spark's rows are offset ranges where a store claims
        last["numInputRows"] = records = records_read(report, plan.mode == "claim")
        if "processedRowsPerSecond" in report:
            rate = float(report["processedRowsPerSecond"])
            last["processedRowsPerSecond"] = rate * records / rows if rows else rate
    current = status_file.collect(log, plan, late, last)
    status_file.save(plan, current)
    return current
