"""The Spark part of ``exactly up``: each stage of :data:`exactly.stages.STAGES` the settings
enable (route with ``[[destinations]]``, the lake with ``[lake] url``) as a query of one
application, planned, opened and driven as its own command does.

One JVM and one SparkSession instead of one per stage: each query runs in a thread of its own
with a FAIR scheduler pool named after it, so a long aggregate micro-batch does not hold the
dedupe query's tasks back. The session's SQL settings are shared (a query copies them when it
starts): the shuffle partitions are raw's partition count, as the dedupe job sets them, and time
is UTC, as the aggregate job sets it; both are set before any query starts. (A session per query
would keep them apart, but Spark 4 finds a Python data source only in the session it was
registered in.) Every query keeps its guarantee as when it runs alone:
its own checkpoint, lock and marker (the stages' modules say how).

Each half second the process records, in ``DATA_DIR/up/queries.json``, which queries Spark has
run a first micro-batch of (:func:`exactly.up.watch.save_progress`): until then ``exactly up``,
``exactly status`` and the console show a query as *starting*, not as running with a rate of 0,
with what it waits on: the log, Spark to start, its target to open, the micro-batch a kill left
unfinished (``batch 48, run again``: a query starts with it), or the step Spark reports.

Each stage prepares before Spark starts, in the registry's order: dedupe creates ``events``
(the others read it). A query that
fails stops the others and the process exits with its one-line error, for ``exactly up`` to
restart the part; SIGTERM ends every query between two micro-batches
(:data:`exactly.spark.streaming.STOPPING`) and the process exits 0.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exactly.config import Settings
from exactly.errors import ExactlyError, StreamError
from exactly.spark.checkpoint import uncommitted
from exactly.spark.streaming import STOPPING
from exactly.stages import RAW, Stage, enabled

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

    from exactly.up.watch import Progress

APP_NAME = (
    "exactly-up"  # the Spark application: its driver logs to DATA_DIR/logs/spark-exactly-up.log
)


@dataclass(frozen=True)
class Query:
    """One stage of the pipeline as a streaming query: the stage and the plan it runs."""

    stage: Stage[Any, Any, Any]
    plan: Any

    @property
    def name(self) -> str:
        return self.stage.name

    def run(self, spark: SparkSession, note: Callable[[str], None] = lambda _: None) -> object:
        """Open the stage's target and drive its query in ``spark``, as its command does;
        ``note`` is told what the query waits on until it runs."""
        say = _say(self.name)
        note(f"{self.stage.target_is} to open")
        with self.stage.open(self.plan, say) as target:
            again = uncommitted(self.plan.checkpoint)
            note("Spark to plan the query" if again is None else f"batch {again}, run again")
            return self.stage.drive(spark, self.plan, target, say=say)


def queries(settings: Settings, trigger_seconds: float = 1.0) -> list[Query]:
    """The pipeline's queries: each stage the settings enable, with the plan its own command
    builds (with its defaults), so ``exactly up`` runs a stage as ``exactly dedupe``,
    ``aggregate``, ``route`` or ``lake`` would."""
    return [
        Query(stage, stage.plan(settings, trigger_seconds=trigger_seconds))
        for stage in enabled(settings)
    ]


def run(settings: Settings, trigger_seconds: float = 1.0) -> None:
    """Run every query until SIGTERM or SIGINT (then return) or a failure (then raise it)."""
    from exactly.log import open_log
    from exactly.spark.session import build_session, spark_log
    from exactly.up.watch import Progress, progress_path, save_progress

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: STOPPING.set())
    planned = queries(settings, trigger_seconds)
    progress = Progress(os.getpid(), time.time(), {}, {query.name: "the log" for query in planned})
    where = progress_path(settings.data_dir)
    save_progress(where, progress)
    with open_log(settings.log_url, max_record_bytes=settings.log.max_record_bytes) as log:
        for query in planned:
            query.stage.prepare(log, query.plan)  # dedupe: events, for the others
        partitions = log.topic_info(RAW).partitions
    progress.waiting.update(dict.fromkeys(progress.waiting, "Spark to start"))
    save_progress(where, progress)
    spark = build_session(
        settings,
        APP_NAME,
        conf={
            "spark.scheduler.mode": "FAIR",
            "spark.sql.shuffle.partitions": str(partitions),
            "spark.sql.session.timeZone": "UTC",
        },
    )
    failures: list[tuple[str, BaseException]] = []
    threads = [
        threading.Thread(
            target=_in_pool,
            args=(
                spark,
                query,
                failures,
                functools.partial(progress.waiting.__setitem__, query.name),
            ),
            name=query.name,
            daemon=True,
        )
        for query in planned
    ]
    for thread in threads:
        thread.start()
    try:
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(0.5 / len(threads))
            if len(progress.first_batch) < len(threads):
                _note_starts(spark, progress, where, planned)
            if failures or (not STOPPING.is_set() and not all(t.is_alive() for t in threads)):
                STOPPING.set()  # one query ended or failed: end the others too
    finally:
        spark.stop()
    if failures:
        name, error = failures[0]
        if isinstance(error, ExactlyError):
            raise type(error)(f"{name}: {error}") from None
        first = next((line for line in str(error).splitlines() if line.strip()), "")
        traces = spark_log(settings, APP_NAME)
        raise StreamError(
            f"{name}: {type(error).__name__}: {first.strip()} (stack traces in {traces})"
        ) from error


def _note_starts(
    spark: SparkSession, progress: Progress, where: Path, planned: list[Query]
) -> None:
    """Record the queries whose first micro-batch Spark reported (``lastProgress`` is set), and
    what each other query waits on: the micro-batch it runs again, else the step Spark reports
    (its status message). A query's Spark name begins with its stage's name."""
    from exactly.up.watch import save_progress

    before = (dict(progress.first_batch), dict(progress.waiting))
    starting = {query.name for query in planned} - progress.first_batch.keys()
    try:
        for running in spark.streams.active:
            name = (running.name or "").split(" ")[0]
            if name not in starting:
                continue
            if running.lastProgress is not None:
                progress.first_batch[name] = time.time()
                progress.waiting.pop(name, None)
            elif not progress.waiting.get(name, "").startswith("batch"):
                message = str(running.status.get("message") or "").rstrip(".")
                progress.waiting[name] = f"Spark: {message[:1].lower()}{message[1:]}"
    except Exception:  # noqa: BLE001 - a stopping session: the queries report their own failure
        return
    if (progress.first_batch, progress.waiting) != before:
        save_progress(where, progress)


def _in_pool(
    spark: SparkSession,
    query: Query,
    failures: list[tuple[str, BaseException]],
    note: Callable[[str], None],
) -> None:
    try:
        # The JVM's active session is per thread; without it a new thread's query does not find
        # the ``exactly`` data source, which is registered in this session.
        jvm_session = type(spark)._get_j_spark_session_class(spark._jvm)
        jvm_session.setActiveSession(spark._jsparkSession)
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", query.name)
        query.run(spark, note)
        if not STOPPING.is_set():
            raise StreamError("the query stopped by itself")
    except BaseException as error:  # noqa: BLE001 - reported by run() in the main thread
        failures.append((query.name, error))
        STOPPING.set()


def _say(name: str) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"{name}: {line}", file=sys.stderr, flush=True)

    return say
