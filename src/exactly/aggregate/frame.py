"""The events as Spark columns, and each table's aggregate of a micro-batch.

``events_frame`` parses a record value once, into the event fields the tables read and no others:
Spark does not prune a ``from_json`` whose struct several columns read, and parsing every field
(the context's dozens) cost 5-7% more time. When those fields are all text, times and keys
looked up in ``properties`` or ``traits`` (:func:`source_fields`; the event counts' are), the
source reads them in Arrow (its ``fields`` column) and ``from_json`` in the JVM reads only the
values Arrow left to it (``exactly.events.fields``; docs/aggregate.md, "Parsing in Arrow").
Spark parses with partial results, so a field of the wrong type is null by itself and leaving
fields out changes no other field's value. ``aggregate`` turns a frame into one row per group of
a table, with every key as text or a UTC time string and every measure added up, ready for the
database's upsert.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from exactly.aggregate.spec import EVENT_SCHEMA, GroupKey, Measure, TableSpec
from exactly.errors import ConfigError
from exactly.events.fields import Field, Fields
from exactly.spark.datasource.merging import WEIGHT
from exactly.spark.datasource.source import SCHEMA as RECORD_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

TIME_FORMAT = "yyyy-MM-dd HH:mm:ss"
TIME_FIELDS = ("timestamp", "receivedAt")  # what the time buckets are computed from
EPOCH = "TIMESTAMP '1970-01-01 00:00:00'"
DECIMAL = "DECIMAL(38,6)"
MAPS = ("properties", "traits")  # the event's maps, of JSON text
PLACE_COLUMNS = ("partition", "offset")  # a record's place in the log, beside its fields


def events_frame(records: DataFrame, specs: Sequence[TableSpec] = ()) -> DataFrame:
    """Records of the ``events`` topic as event columns, time buckets, partition and offset.

    With checked ``specs`` (``check``), only the event fields they read are parsed.
    """
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), event_schema(specs))
    if "fields" in records.columns:  # read by the source where it could (``source_fields``)
        event = F.coalesce(F.col("fields"), event)
    parsed = records.select(
        event.alias("e"),
        "partition",
        "offset",
        F.col("timestamp").alias("logged_at"),
        *([WEIGHT] if WEIGHT in records.columns else []),
    )
    when = F.coalesce(*[F.col(f"e.{name}") for name in TIME_FIELDS], F.col("logged_at"))
    return parsed.select(
        "e.*",
        "partition",
        "offset",
        F.date_trunc("minute", when).alias("minute"),
        F.date_trunc("hour", when).alias("hour"),
        F.date_trunc("day", when).alias("day"),
        *([WEIGHT] if WEIGHT in records.columns else []),
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


def source_fields(specs: Sequence[TableSpec]) -> Fields | None:
    """The fields the source can read for checked ``specs`` (its option ``fields``): all of
    :func:`event_schema`'s, when each is text, a time, or a map the tables only look keys up in
    (only those keys are read); None otherwise."""
    from pyspark.sql.types import MapType, StringType, TimestampType

    found: list[Field] = []
    for field in event_schema(specs).fields:
        if isinstance(field.dataType, StringType):
            found.append(Field(field.name, "string"))
        elif isinstance(field.dataType, TimestampType):
            found.append(Field(field.name, "timestamp"))
        elif isinstance(field.dataType, MapType) and field.name in MAPS:
            readers = [spec for spec in specs if spec.fields and field.name in spec.fields]
            if any(spec.lookups is None for spec in readers):
                return None
            keys = {
                key for spec in readers for name, key in spec.lookups or () if name == field.name
            }
            found.append(Field(field.name, "map", tuple(sorted(keys))))
        else:
            return None
    return Fields(tuple(found)) if specs else None


def lookups(query: DataFrame) -> frozenset[tuple[str, str]] | None:
    """The keys ``query``, an aggregate over a full :func:`events_frame`, looks up in the
    :data:`MAPS` (``properties.revenue``: ("properties", "revenue")); None when it reads one of
    them in any other way (whole, or by a key that is not a constant)."""
    found: set[tuple[str, str]] = set()
    pending = list(_sequence(query._jdf.queryExecution().analyzed().expressions()))
    while pending:
        node = pending.pop()
        kind = node.nodeName()
        if kind == "GetMapValue":
            child, key = node.child(), node.key()
            if (
                child.nodeName() == "AttributeReference"
                and child.name() in MAPS
                and key.nodeName() == "Literal"
                and key.dataType().typeName() == "string"
                and key.value() is not None
            ):
                found.add((child.name(), key.value().toString()))
                continue
        elif kind == "AttributeReference" and node.name() in MAPS:
            return None
        pending.extend(_sequence(node.children()))
    return frozenset(found)


def _sequence(seq: Any) -> list[Any]:
    """A Scala ``Seq`` from py4j as a list."""
    return [seq.apply(i) for i in range(seq.size())]


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
    return frozenset(names & {*event_schema().fieldNames(), *PLACE_COLUMNS})


def key_column(key: GroupKey) -> Column:
    from pyspark.sql import functions as F

    if key.kind == "time":
        value = F.expr(f"date_format(coalesce(({key.expression}), {EPOCH}), '{TIME_FORMAT}')")
    else:
        value = F.expr(f"coalesce(CAST(({key.expression}) AS STRING), '')")
    return value.alias(key.name)


def measure_column(measure: Measure, weighted: bool = False) -> Column:
    """``measure`` over a frame's rows; ``weighted``: rows with a ``weight`` column, each the
    events it stands for (``mergeable``): a count adds the weights, a sum each value times its
    weight, in the measure's own type."""
    from pyspark.sql import functions as F

    argument = measure.argument
    if measure.function == "count":
        if not weighted:
            return F.expr(f"count({'1' if argument == '*' else f'({argument})'})").alias(
                measure.name
            )
        weight = WEIGHT if argument == "*" else f"if(({argument}) IS NULL, 0, {WEIGHT})"
        return F.expr(f"coalesce(sum({weight}), 0)").alias(measure.name)
    times = f" * {WEIGHT}" if weighted else ""
    if measure.kind == "integer":
        return F.expr(f"coalesce(sum(CAST(({argument}) AS BIGINT){times}), 0)").alias(measure.name)
    value = f"try_cast(({argument}) AS {DECIMAL})"
    if weighted:
        value = f"CAST({value}{times} AS {DECIMAL})"
    return F.expr(f"coalesce(sum({value}), CAST(0 AS {DECIMAL}))").alias(measure.name)


def aggregate(frame: DataFrame, spec: TableSpec) -> DataFrame:
    """One row per group of ``spec`` in ``frame``: the keys, then the measures (weighted when
    the frame has a ``weight`` column)."""
    weighted = WEIGHT in frame.columns
    return frame.groupBy(*[key_column(k) for k in spec.keys]).agg(
        *[measure_column(m, weighted) for m in spec.measures]
    )


def mergeable(specs: Sequence[TableSpec]) -> bool:
    """Whether the source may merge alike events into weighted rows for ``specs`` (option
    ``merge``, ``exactly.spark.datasource.merging``): every table checked, reading only the
    fields the source reads (``source_fields``), its time only through the time buckets, and
    neither a record's partition nor its offset. Counts and sums are all a table has, and
    they weigh."""
    if source_fields(specs) is None:
        return False
    read = set().union(*(spec.fields or () for spec in specs))
    return not read & {*TIME_FIELDS, *PLACE_COLUMNS}


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
            typed.append(replace(resolved, fields=fields_read(query), lookups=lookups(query)))
    return typed
