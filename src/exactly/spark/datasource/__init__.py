"""The ``exactly`` Spark data source: the log as a batch source, a streaming source and sink.

Register it once per session (:func:`register`; ``build_session`` does it), then::

    spark.read.format("exactly").option("log", URL).option("topic", T).load()
    spark.readStream.format("exactly").option("log", URL).option("topic", T).load()
    df.writeStream.format("exactly").option("log", URL).option("topic", T)
      .option("checkpointLocation", DIR).start()

Options are checked on the driver when the query is defined or starts, so a typo fails there with
one clear line. Readers and writers are in ``source.py`` and ``sink.py``.

:func:`register_staged` registers the same sink under another name with a step run first in the
sink's own Python worker: a query whose last step is Python on Arrow batches (the dedupe job's
claims) then costs one trip from the JVM to Python instead of two. With the source's option
``ranges`` it costs none: the step reads the records itself (``source.read_ranges``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from exactly.events.fields import Fields
from exactly.spark import checkpoint
from exactly.spark.datasource import lease
from exactly.spark.datasource.options import EXACTLY_ONCE, SinkOptions, SourceOptions, shared_log
from exactly.spark.datasource.sink import Columns, LogStreamWriter, Stage
from exactly.spark.datasource.source import RANGES_SCHEMA, LogBatchReader, LogStreamReader
from exactly.spark.datasource.source import schema as source_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NAME = "exactly"


class LogDataSource(DataSource):
    """``format("exactly")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        if self.options.get("ranges", "false").lower() == "true":
            return RANGES_SCHEMA
        fields = self.options.get("fields")
        return source_schema(
            self.options.get("headers", "true").lower() != "false",
            None if fields is None else Fields.parse(fields),
            merge="merge" in self.options,
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogStreamReader(SourceOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LogStreamWriter:
        return self._stream_writer(Columns.of(schema))

    def _stream_writer(self, columns: Columns, stage: Stage | None = None) -> LogStreamWriter:
        options = SinkOptions.parse(self.options)
        log = shared_log(options.log, options.max_record_bytes)
        log.topic_info(options.topic)  # an unknown topic fails here, before any task
        if options.guarantee == EXACTLY_ONCE:
            # Refuse a second query now rather than in its first task, when the owner is known.
            sink = options.sink_id or checkpoint.query_id(options.checkpoint)
            lease.check_once(log, options.topic, sink)  # called again for every batch's commit
        return LogStreamWriter(options, columns, stage)


class StagedSink(LogDataSource):
    """The ``exactly`` sink with a stage first; :func:`register_staged` subclasses it per query."""

    staged: ClassVar[tuple[Stage, Columns]]  # the stage and the columns it yields

    def streamWriter(self, schema: StructType, overwrite: bool) -> LogStreamWriter:
        stage, columns = self.staged
        return self._stream_writer(columns, stage)


def register_staged(spark: SparkSession, name: str, stage: Stage, columns: Columns) -> None:
    """Make ``format(name)`` the ``exactly`` sink writing what ``stage`` yields.

    ``stage`` gets each task's Arrow batches (the query's rows) and yields the rows to write, with
    ``columns`` (what :class:`~exactly.spark.datasource.sink.Columns` would find in their
    schema); it runs in the sink's Python worker and is pickled with the class. Give each query
    its own ``name``: registering a name again replaces it.
    """
    source = type(
        f"StagedSink[{name}]",
        (StagedSink,),
        {"name": classmethod(lambda cls: name), "staged": (stage, columns)},
    )
    _register(spark, source)


def register(spark: SparkSession) -> None:
    """Make ``format("exactly")`` available in ``spark``."""
    _register(spark, LogDataSource)


def read_until(
    spark: SparkSession, log_url: str, topic: str, end_offsets: dict[int, int]
) -> DataFrame:
    """A batch read of ``topic`` from its start up to ``end_offsets`` (what a recount reads:
    the position a database or a table recorded with its newest batch)."""
    import json

    from exactly.spark.datasource import offsets

    return (
        spark.read.format(NAME)
        .option("log", log_url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps(offsets.to_json(end_offsets)))
        .load()
    )


# SPARK 4.3 RACE: a registered Python data source keeps one Java HashMap of environment
# variables (``envVars``), shared by every query of the session that uses it, and each streaming
# query's start puts these keys into it from its own thread (PythonStreamingSourceRunner.init).
# Queries starting together (``exactly up`` starts three) can race on the map's size: it then
# counts an entry it does not hold, every task binary that carries it is written torn, and every
# task of the session fails with java.io.OptionalDataException (3 starts in about 49). With the
# keys there from the start, those puts replace values and never change the map's structure.
# The runners set their real values before starting a Python process.
_RUNNER_KEYS = (
    "SPARK_LOCAL_DIRS",
    "SPARK_AUTH_SOCKET_TIMEOUT",
    "SPARK_BUFFER_SIZE",
    "SPARK_PYTHON_RUNTIME",
)


def _register(spark: SparkSession, source: type[DataSource]) -> None:
    """Register ``source`` with the keys its streaming runners put already in its environment
    (the Spark 4.3 race above); the session's environment itself is left as it was."""
    environment = spark.sparkContext.environment
    added = [key for key in _RUNNER_KEYS if key not in environment]
    environment.update(dict.fromkeys(added, ""))
    try:
        spark.dataSource.register(source)
    finally:
        for key in added:
            del environment[key]
