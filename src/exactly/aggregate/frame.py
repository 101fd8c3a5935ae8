"""The events as Spark columns, and each table's aggregate of a micro-batch.

``events_frame`` parses a record value once (``from_json`` in the JVM), into the event fields the
tables read and no others: Spark does not prune a ``from_json`` whose struct several columns
read, and parsing every field (the context's dozens) cost 5-7% more time. Spark parses with
partial results, so a field of the wrong type is null by itself and leaving fields out changes no
other field's value. ``aggregate`` turns a frame into one row per group of a table, with every key
as text or a UTC time string and every measure added up, ready for the database's upsert.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from exactly.aggregate.spec import EVENT_SCHEMA, GroupKey, Measure, TableSpec
from exactly.errors import ConfigError
from exactly.spark.source import SCHEMA as RECORD_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

TIME_FORMAT = "yyyy-MM-dd HH:mm:ss"
TIME_FIELDS = ("timestamp", "receivedAt")  # what the time buckets are computed from
EPOCH = "TIMESTAMP '1970-01-01 00:00:00'"
DECIMAL = "DECIMAL(38,6)"


def events_frame(records: DataFrame, specs: Sequence[TableSpec] = ()) -> DataFrame:
    """Records of the ``events`` topic as event columns, time buckets, partition and offset.

    With checked ``specs`` (``check``), only the event fields they read are parsed.
    """
    from pyspark.sql import functions as F

    parsed = records.select(
        F.from_json(F.col("value").cast("string"), event_schema(specs)).alias("e"),
        "partition",
        "offset",
        F.col("timestamp").alias("logged_at"),
    )
    when = F.coalesce(*[F.col(f"e.{name}") for name in TIME_FIELDS], F.col("logged_at"))
    return parsed.select(
        "e.*",
        "partition",
        "offset",
        F.date_trunc("minute", when).alias("minute"),
        F.date_trunc("hour", when).alias("hour"),
        F.date_trunc("day", when).alias("day"),
    )


def event_schema(specs: Sequence[TableSpec] = ()) -> StructType:
    """:data:`EVENT_SCHEMA` cut to the fields ``specs`` read (all of it if one is unchecked).

    The time buckets read ``timestamp`` and ``receivedAt``, so those are always kept.
    """
    from pyspark.sql.types import StructType

    fields = _full_event_schema().fields
    if not specs or any(spec.fields is None for spec in specs):
        return StructType(list(fields))  # a copy: the parsed schema is shared
    read = set(TIME_FIELDS).union(*(spec.fields or () for spec in specs))
    return StructType([field for field in fields if field.name in read])


@functools.cache
def _full_event_schema() -> StructType:
    """:data:`EVENT_SCHEMA` parsed once (by the JVM: a few ms, on every micro-batch before)."""
    from pyspark.sql.types import DataType, StructType

    full = DataType.fromDDL(EVENT_SCHEMA)
    assert isinstance(full, StructType)
    return full


def fields_read(query: DataFrame) -> frozenset[str]:
    """The event fields ``query``, an aggregate over a full :func:`events_frame`, reads: the
    references of its plan's top (the aggregate)."""
    found = query._jdf.queryExecution().analyzed().references().toSeq()
    names = {found.apply(i).name() for i in range(found.size())}
    return frozenset(names & set(event_schema().fieldNames()))


def key_column(key: GroupKey) -> Column:
    from pyspark.sql import functions as F

    if key.kind == "time":
        value = F.expr(f"date_format(coalesce(({key.expression}), {EPOCH}), '{TIME_FORMAT}')")
    else:
        value = F.expr(f"coalesce(CAST(({key.expression}) AS STRING), '')")
    return value.alias(key.name)


def measure_column(measure: Measure) -> Column:
    from pyspark.sql import functions as F

    if measure.function == "count":
        argument = "1" if measure.argument == "*" else f"({measure.argument})"
        return F.expr(f"count({argument})").alias(measure.name)
    if measure.kind == "integer":
        return F.expr(f"coalesce(sum(CAST(({measure.argument}) AS BIGINT)), 0)").alias(measure.name)
    return F.expr(
        f"coalesce(sum(try_cast(({measure.argument}) AS {DECIMAL})), CAST(0 AS {DECIMAL}))"
    ).alias(measure.name)


def aggregate(frame: DataFrame, spec: TableSpec) -> DataFrame:
    """One row per group of ``spec`` in ``frame``: the keys, then the measures."""
    return frame.groupBy(*[key_column(k) for k in spec.keys]).agg(
        *[measure_column(m) for m in spec.measures]
    )


def empty_frame(spark: SparkSession) -> DataFrame:
    return events_frame(spark.createDataFrame([], RECORD_SCHEMA))


@contextmanager
def _quiet_spark_errors() -> Iterator[None]:
    """PySpark logs each analysis error with a Java stack; the ConfigError says it in one line."""
    logger = logging.getLogger("DataFrameQueryContextLogger")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    text = re.sub(r"\s*SQLSTATE: \w+;?$", "", text)
    return re.sub(r"^\[[A-Z_.]+\]\s*", "", text).rstrip(";. ")


def check(spark: SparkSession, specs: Sequence[TableSpec]) -> list[TableSpec]:
    """Each table analysed by Spark on an empty frame, with its column kinds resolved.

    An expression that does not resolve (an unknown column, a bad function) or a table Spark
    cannot aggregate raises a one-line :class:`ConfigError` naming the table and column.
    """
    from pyspark.errors import PySparkException
    from pyspark.sql import types as T

    frame = empty_frame(spark)
    typed: list[TableSpec] = []
    with _quiet_spark_errors():
        for spec in specs:
            kinds: dict[str, str] = {}
            for name, expression in [(k.name, k.expression) for k in spec.keys] + [
                (m.name, m.argument) for m in spec.measures if m.argument != "*"
            ]:
                try:
                    field = frame.selectExpr(f"({expression}) AS value").schema["value"]
                except PySparkException as error:
                    raise ConfigError(
                        f"aggregate table {spec.name!r}, column {name!r} = {expression!r}: "
                        f"{_first_line(error)}"
                    ) from None
                data_type = field.dataType
                if isinstance(data_type, T.TimestampType | T.TimestampNTZType | T.DateType):
                    kinds[name] = "time"
                elif isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
                    kinds[name] = "integer"
                else:
                    kinds[name] = "other"
            for measure in spec.measures:
                kinds.setdefault(measure.name, "other")
            resolved = spec.typed(kinds)
            try:
                query = aggregate(frame, resolved)
                query.schema  # noqa: B018 (analysis only)
            except PySparkException as error:
                raise ConfigError(f"aggregate table {spec.name!r}: {_first_line(error)}") from None
            typed.append(replace(resolved, fields=fields_read(query)))
    return typed
