"""Running the dedupe job from the command line: topics, lock, Spark, status after each batch."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from exactly.config import Settings
from exactly.dedupe import status as status_file
from exactly.dedupe.job import DedupePlan, describe, late_rows, prepare, run
from exactly.log import Log, open_log
from exactly.spark.streaming import checkpoint_lock


@dataclass(frozen=True)
class Summary:
    records: int
    batches: int
    status: status_file.DedupeStatus


def previous_late(plan: DedupePlan) -> int:
    path = status_file.status_path(plan.data_dir, plan.source)
    try:
        _, saved = status_file.load(path, {"log_url": plan.log_url, "data_dir": plan.data_dir})
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return saved.late if saved.checkpoint == str(plan.checkpoint) else 0


def drive(settings: Settings, plan: DedupePlan, *, quiet: bool = False) -> Summary:
    """Run the job as ``exactly dedupe`` does; returns what it did and the final status."""
    with open_log(plan.log_url, max_record_bytes=plan.max_record_bytes) as log:
        partitions = prepare(log, plan)
        with checkpoint_lock(plan.checkpoint, "dedupe job"):
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
                current = _save(log, plan, late, report)
                rows = int(report.get("numInputRows", 0))
                if rows:
                    say(f"batch {report['batchId']}: {rows} records")
                for line in current.warnings():
                    if line not in warned:
                        warned.add(line)
                        print(f"warning: {line}", file=sys.stderr, flush=True)

            progress = run(spark, plan, partitions, on_batch)
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
