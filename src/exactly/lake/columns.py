"""The lake table's columns: the event's fields, its ``date``, and the promoted columns.

Every backend stores the same Arrow schema (:func:`lake_schema`): the identifying fields as text,
the four times as UTC timestamps, ``properties``, ``traits`` and ``context`` as JSON text, and a
``date`` (the event's UTC day: its ``timestamp``, else ``receivedAt``) the lake formats partition
by. ``[lake] columns`` promotes a value from inside one of the JSON columns to a typed column of
its own (``revenue = "properties.revenue double"``); adding one later adds a column, and the rows
written before it read null there.

:func:`event_rows` builds a batch from event JSON in Python, the same rows the Spark query builds
(``exactly.lake.query``): tests and small tools use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from exactly.errors import ConfigError

UTC_TIME = pa.timestamp("us", tz="UTC")
TEXT_COLUMNS = ("messageId", "type", "event", "userId", "anonymousId", "sourceId")
TIME_COLUMNS = ("timestamp", "originalTimestamp", "sentAt", "receivedAt")
JSON_COLUMNS = ("properties", "traits", "context")
PARTITION = "date"
BASE_SCHEMA = pa.schema(
    [pa.field(name, pa.string()) for name in TEXT_COLUMNS]
    + [pa.field(name, UTC_TIME) for name in TIME_COLUMNS]
    + [pa.field(name, pa.string()) for name in JSON_COLUMNS]
    + [pa.field(PARTITION, pa.date32())]
)
KINDS = {  # a promoted column's kind: its Arrow type
    "string": pa.string(),
    "double": pa.float64(),
    "bigint": pa.int64(),
    "boolean": pa.bool_(),
    "timestamp": UTC_TIME,
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_KEY = re.compile(r"^[A-Za-z0-9_$-]+$")


@dataclass(frozen=True)
class Promoted:
    """A column promoted out of a JSON column: ``name`` is ``source.path...`` as ``kind``."""

    name: str
    source: str  # one of JSON_COLUMNS
    path: tuple[str, ...]
    kind: str

    @property
    def arrow_type(self) -> pa.DataType:
        return KINDS[self.kind]

    @property
    def json_path(self) -> str:
        """The path as Spark's ``get_json_object`` takes it: ``$.revenue``."""
        return "$." + ".".join(self.path)


def promoted_column(name: str, spec: str) -> Promoted:
    """``revenue``, ``"properties.revenue double"`` as a :class:`Promoted`; a bad one raises a
    :class:`ConfigError` that says how to write it."""
    how = (
        f'[lake] columns: {name} = "{spec}": write "COLUMN.KEY[.KEY...] KIND", COLUMN one of '
        f"{', '.join(JSON_COLUMNS)}, KIND one of {', '.join(KINDS)}"
    )
    if not _NAME.match(name) or name.lower() in {f.name.lower() for f in BASE_SCHEMA}:
        raise ConfigError(f"{how}; the name must be a new identifier (letters, digits, _)")
    parts = spec.split()
    if len(parts) != 2 or parts[1].lower() not in KINDS:
        raise ConfigError(how)
    source, *path = parts[0].split(".")
    if source not in JSON_COLUMNS or not path or not all(_KEY.match(key) for key in path):
        raise ConfigError(how)
    return Promoted(name, source, tuple(path), parts[1].lower())


def promoted_columns(columns: Mapping[str, str]) -> tuple[Promoted, ...]:
    """``[lake] columns`` checked, in the order written."""
    return tuple(promoted_column(name, spec) for name, spec in columns.items())


def lake_schema(promoted: Sequence[Promoted] = ()) -> pa.Schema:
    """The table's schema: :data:`BASE_SCHEMA`, then the promoted columns."""
    return pa.schema([*BASE_SCHEMA, *(pa.field(p.name, p.arrow_type) for p in promoted)])


def event_rows(values: Iterable[bytes | str], promoted: Sequence[Promoted] = ()) -> pa.Table:
    """The lake rows of events given as JSON (as the ``events`` topic holds them)."""
    rows = [_row(orjson.loads(value), promoted) for value in values]
    return pa.Table.from_pylist(rows, schema=lake_schema(promoted))


def _row(event: dict[str, Any], promoted: Sequence[Promoted]) -> dict[str, Any]:
    row: dict[str, Any] = {name: _text(event.get(name)) for name in TEXT_COLUMNS}
    row.update({name: _time(event.get(name)) for name in TIME_COLUMNS})
    row.update(
        {
            name: None if event.get(name) is None else orjson.dumps(event[name]).decode()
            for name in JSON_COLUMNS
        }
    )
    when = row["timestamp"] or row["receivedAt"]
    row[PARTITION] = None if when is None else when.date()
    for column in promoted:
        value: Any = event.get(column.source)
        for key in column.path:
            value = value.get(key) if isinstance(value, dict) else None
        row[column.name] = _typed(value, column.kind)
    return row


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        return None
    return found.replace(tzinfo=UTC) if found.tzinfo is None else found.astimezone(UTC)


def _typed(value: Any, kind: str) -> Any:
    """``value`` as ``kind``, or None where it is not one (as Spark's ``try_cast``)."""
    if value is None:
        return None
    if kind == "string":
        return _text(value)
    if kind == "timestamp":
        return _time(value)
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    try:
        number = float(value) if kind == "double" else int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if isinstance(value, bool) else number


def conform(data: pa.Table, table_schema: pa.Schema | None) -> pa.Table:
    """``data`` ready to append to a table of ``table_schema`` (None: a table not yet created).

    The table's columns first, in its order and types (null where ``data`` lacks one: a promoted
    column no longer configured), then ``data``'s new columns (the schema evolves by them). A
    column whose type differs from the table's raises: a promoted column's kind cannot change.
    """
    from exactly.errors import LakeError

    missing = [f.name for f in BASE_SCHEMA if f.name not in data.column_names]
    if missing:
        raise LakeError(f"a lake batch lacks the columns {', '.join(missing)}")
    if table_schema is None:
        return data
    columns, fields = [], []
    for field in table_schema:
        if field.name in data.column_names:
            column = data.column(field.name)
            if not _same_kind(column.type, field.type):
                raise LakeError(
                    f"lake column {field.name} is {field.type} in the table and {column.type} in "
                    "the batch: a promoted column's kind cannot change; give it a new name"
                )
            columns.append(column.cast(field.type))
        else:
            columns.append(pa.nulls(len(data), field.type))
        fields.append(pa.field(field.name, field.type))
    for field in data.schema:
        if field.name not in table_schema.names:
            columns.append(data.column(field.name))
            fields.append(pa.field(field.name, field.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def target_schema(batch: pa.Schema, table_schema: pa.Schema | None) -> pa.Schema:
    """The schema a batch of ``batch``'s columns is written in to a table of ``table_schema``
    (:func:`conform`'s): raises before anything is written when a column changed its kind."""
    return conform(batch.empty_table(), table_schema).schema


def _same_kind(found: pa.DataType, table: pa.DataType) -> bool:
    """Whether ``found`` is ``table``'s type up to representation (string or large string or
    string view, a timestamp's unit)."""
    texts = (pa.string(), pa.large_string(), pa.string_view())
    if found in texts or table in texts:
        return found in texts and table in texts
    if pa.types.is_timestamp(found) and pa.types.is_timestamp(table):
        return True
    if pa.types.is_integer(found) and pa.types.is_integer(table):
        return True
    return bool(found == table)
