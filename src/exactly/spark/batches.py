"""Streaming queries that hand each micro-batch to Python (``foreachBatch``): aggregate, route.

What they share, kept once:

* :class:`BatchFunction`: the function Spark calls per micro-batch. It keeps the exception it
  raised, because Spark hands the driver only its text, and reads its query's id from the
  checkpoint once (the id the batch's marker is stored under);
* :func:`run_batches`: the query from the ``exactly`` source over a log topic into the function,
  run by :func:`~exactly.spark.streaming.run_query`; a failed batch raises the error it raised:
  itself when it is an :class:`~exactly.errors.ExactlyError`, else one line naming it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from exactly.errors import ExactlyError, StreamError
from exactly.spark import checkpoint as spark_checkpoint
from exactly.spark.session import read_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class BatchFunction(ABC):
    """A ``foreachBatch`` function over the query whose checkpoint is ``checkpoint``."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.failure: BaseException | None = None
        self._query_id: str | None = None

    @property
    def query_id(self) -> str:
        """Spark's id of the query, stable across restarts from the same checkpoint."""
        if self._query_id is None:
            found = spark_checkpoint.query_id(self.checkpoint)
            if found is None:
                raise StreamError(
                    f"checkpoint {self.checkpoint} has no query id: Spark did not start it"
                )
            self._query_id = found
        return self._query_id

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        try:
            self.process(records, batch_id)
        except BaseException as error:
            self.failure = error  # Spark reports it as text; run_batches raises the error itself
            raise

    @abstractmethod
    def process(self, records: DataFrame, batch_id: int) -> None:
        """Handle micro-batch ``batch_id``; a replayed batch must change nothing."""


class StreamPlan(Protocol):
    """What a ``foreachBatch`` query's plan says (``AggregatePlan``, ``RoutePlan``)."""

    @property
    def log_url(self) -> str: ...
    @property
    def checkpoint(self) -> Path: ...
    @property
    def topic(self) -> str: ...
    @property
    def until_caught_up(self) -> bool: ...
    @property
    def max_records_per_trigger(self) -> int | None: ...
    @property
    def trigger_seconds(self) -> float: ...
    @property
    def read_records(self) -> int: ...


def run_batches(
    spark: SparkSession,
    name: str,
    plan: StreamPlan,
    function: BatchFunction,
    columns: Sequence[str],
    *,
    start: str,
    failed: type[ExactlyError],
    options: Mapping[str, str] | None = None,
) -> None:
    """Run query ``name`` over ``plan.topic`` (``columns`` of each record) into ``function``.

    ``options``: more options of the source (``fields``).

    ``start``: the starting offsets, which Spark uses only while the checkpoint is new. A failed
    micro-batch raises what ``function`` raised; ``failed`` with its text when that is not an
    :class:`~exactly.errors.ExactlyError`.
    """
    from exactly.spark.streaming import run_query

    reader = (
        spark.readStream.format("exactly")
        .option("log", plan.log_url)
        .option("topic", plan.topic)
        .option("readRecords", str(plan.read_records))
        .options(**read_options(spark))
        .option("startingOffsets", start)
        .option("headers", str("headers" in columns).lower())  # not decoded unless read
    )
    if plan.max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(plan.max_records_per_trigger))
    reader = reader.options(**(options or {}))
    writer = (
        reader.load()
        .select(*columns)
        .writeStream.foreachBatch(function)
        .option("checkpointLocation", str(plan.checkpoint))
        .queryName(f"{name} {plan.topic}")
    )
    try:
        run_query(
            writer, until_caught_up=plan.until_caught_up, trigger_seconds=plan.trigger_seconds
        )
    except ExactlyError:
        failure = function.failure
        if isinstance(failure, ExactlyError):
            raise failure from None
        if failure is not None:
            raise failed(
                f"a micro-batch of the {name} query failed: {type(failure).__name__}: {failure}"
            ) from failure
        raise
