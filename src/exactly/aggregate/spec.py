"""What an aggregate table is: group-by columns and additive measures, checked without Spark.

A table is counted exactly once per event only if a micro-batch's partial result can be *added*
to what the table holds: counts and sums can, averages, minima, maxima and distinct counts cannot
(a replay or a late event would need the rows themselves). So a measure is ``count(*)``,
``count(EXPR)`` (rows where EXPR is not null) or ``sum(EXPR)``; anything else is refused at start
with the measure's name. Expressions are Spark SQL over the event columns (:data:`EVENT_SCHEMA`);
whether they resolve is checked with Spark (``frame.check``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from exactly.errors import ConfigError

# The event as the collector stores it, parsed from the record value. ``properties`` and
# ``traits`` are free-form (every value as its JSON text: numbers as digits, objects as JSON);
# ``context`` has the fields of Segment's spec. Unparsable values give nulls, counted as ''.
CONTEXT_SCHEMA = (
    "struct<ip: string, locale: string, timezone: string, userAgent: string, "
    "library: struct<name: string, version: string>, "
    "page: struct<path: string, referrer: string, search: string, title: string, url: string>, "
    "campaign: struct<name: string, source: string, medium: string, term: string, "
    "content: string>, "
    "app: struct<name: string, version: string, build: string, namespace: string>, "
    "device: struct<id: string, manufacturer: string, model: string, name: string, "
    "type: string>, "
    "os: struct<name: string, version: string>, "
    "screen: struct<width: bigint, height: bigint, density: double>, "
    "network: struct<carrier: string, wifi: boolean, cellular: boolean>>"
)
EVENT_SCHEMA = (
    "type string, event string, name string, messageId string, userId string, "
    "anonymousId string, groupId string, previousId string, sourceId string, "
    "timestamp timestamp, receivedAt timestamp, originalTimestamp timestamp, sentAt timestamp, "
    "properties map<string, string>, traits map<string, string>, "
    f"context {CONTEXT_SCHEMA}"
)
# Besides the event's fields, every frame has its time buckets (from ``timestamp``, else
# ``receivedAt``, else the log's time) and its place in the log.
TIME_COLUMNS = ("minute", "hour", "day")

BATCHES_TABLE = "exactly_batches"
TABLES_TABLE = "exactly_tables"
RESERVED = frozenset({BATCHES_TABLE, TABLES_TABLE})
MAX_NAME = 63  # bytes in a PostgreSQL identifier; names are ASCII
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MEASURE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*", re.DOTALL)
_DISTINCT = re.compile(r"\s*distinct\b", re.IGNORECASE)
NOT_ADDITIVE = (
    "is not additive: a table takes count(*), count(EXPR) or sum(EXPR), which a micro-batch can "
    "add to what the table holds; compute averages and ratios from sums and counts when reading"
)

Key = Literal["text", "time"]
Sum = Literal["count", "integer", "decimal"]


@dataclass(frozen=True)
class GroupKey:
    """A group-by column: text ('' for null) or a time (UTC, to the second)."""

    name: str
    expression: str
    kind: Key = "text"


@dataclass(frozen=True)
class Measure:
    """An additive measure. ``kind``: a count, a sum of integers, or a decimal sum (6 places).

    A decimal sum adds the values that parse as numbers and skips the rest (not an error).
    """

    name: str
    function: Literal["count", "sum"]
    argument: str
    kind: Sum = "count"


@dataclass(frozen=True)
class TableSpec:
    """A table: its group-by keys and measures; once checked (``frame.check``), also the event
    fields its expressions read (``fields``; None before: every field is parsed) and the keys
    they look up in ``properties`` and ``traits`` (``lookups``: (field, key) pairs; None before,
    or when an expression reads one of those maps in another way)."""

    name: str
    keys: tuple[GroupKey, ...]
    measures: tuple[Measure, ...]
    fields: frozenset[str] | None = None
    lookups: frozenset[tuple[str, str]] | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys) + tuple(m.name for m in self.measures)

    def definition(self) -> str:
        """What the database records about the table, to refuse a changed definition."""
        return json.dumps(
            {
                "keys": [[k.name, k.kind, k.expression] for k in self.keys],
                "measures": [[m.name, m.kind, m.function, m.argument] for m in self.measures],
            },
            separators=(",", ":"),
        )

    def typed(self, kinds: Mapping[str, str]) -> TableSpec:
        """This table with each column's kind as Spark resolved it (``frame.check``)."""
        keys = tuple(
            GroupKey(k.name, k.expression, "time" if kinds[k.name] == "time" else "text")
            for k in self.keys
        )
        measures = tuple(
            Measure(m.name, m.function, m.argument, _sum_kind(m, kinds[m.name]))
            for m in self.measures
        )
        return TableSpec(self.name, keys, measures, self.fields, self.lookups)


def _sum_kind(measure: Measure, kind: str) -> Sum:
    if measure.function == "count":
        return "count"
    return "integer" if kind == "integer" else "decimal"


EVENT_COUNTS = TableSpec(
    "event_counts",
    (
        GroupKey("source", "sourceId"),
        GroupKey("type", "type"),
        GroupKey("event", "event"),
        GroupKey("minute", "minute", "time"),
    ),
    (
        Measure("count", "count", "*"),
        Measure("revenue", "sum", "properties.revenue", "decimal"),
    ),
)


def check_name(name: str, what: str) -> str:
    """``name`` if SQL can take it as is: PostgreSQL cuts longer identifiers at 63 bytes, so two
    long names could name one table; such names are refused rather than cut."""
    if len(name) > MAX_NAME and _NAME.fullmatch(name[:MAX_NAME]):
        raise ConfigError(
            f"{what} {name[:20]!r}...: {len(name)} characters; PostgreSQL keeps only "
            f"{MAX_NAME}, so give it a name of at most {MAX_NAME}"
        )
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{what} {name!r}: use lower-case letters, digits and _ (at most 63, not starting "
            "with a digit)"
        )
    return name


def parse_measure(table: str, name: str, text: str) -> Measure:
    """``count(*)``, ``count(EXPR)`` or ``sum(EXPR)``; any other function is refused."""
    where = f"aggregate table {table!r}, measure {name!r} = {text!r}"
    found = _MEASURE.fullmatch(text)
    if found is None:
        raise ConfigError(f"{where}: write count(*), count(EXPR) or sum(EXPR)")
    function, argument = found.group(1).lower(), found.group(2).strip()
    if function not in ("count", "sum") or _DISTINCT.match(argument):
        raise ConfigError(f"{where} {NOT_ADDITIVE}")
    if not argument:
        raise ConfigError(f"{where}: {function}() needs an argument")
    if function == "sum" and argument == "*":
        raise ConfigError(f"{where}: sum(*) sums nothing; use count(*) or sum(EXPR)")
    return Measure(name, "count" if function == "count" else "sum", argument)


def parse_table(name: str, group_by: Mapping[str, str], measures: Mapping[str, str]) -> TableSpec:
    """A user-defined table from its config; one-line :class:`ConfigError` for what is wrong."""
    check_name(name, "aggregate table")
    if name in RESERVED:
        raise ConfigError(f"aggregate table {name!r}: the name is reserved for the job's markers")
    if name == EVENT_COUNTS.name:
        raise ConfigError(f"aggregate table {name!r} is built in; give yours another name")
    if not group_by:
        raise ConfigError(f"aggregate table {name!r} needs at least one group_by column")
    if not measures:
        raise ConfigError(f"aggregate table {name!r} needs at least one measure")
    keys = tuple(
        GroupKey(check_name(column, f"aggregate table {name!r}, column"), expression.strip())
        for column, expression in group_by.items()
    )
    parsed = tuple(
        parse_measure(name, check_name(column, f"aggregate table {name!r}, column"), text)
        for column, text in measures.items()
    )
    columns = [k.name for k in keys] + [m.name for m in parsed]
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ConfigError(f"aggregate table {name!r}: column {repeated[0]!r} is named twice")
    return TableSpec(name, keys, parsed)


def table_specs(
    configured: Iterable[tuple[str, Mapping[str, str], Mapping[str, str]]],
) -> list[TableSpec]:
    """The built-in ``event_counts`` and the configured tables, names unique."""
    specs = [EVENT_COUNTS]
    for name, group_by, measures in configured:
        spec = parse_table(name, group_by, measures)
        if any(s.name == spec.name for s in specs):
            raise ConfigError(f"aggregate table {name!r} is declared twice")
        specs.append(spec)
    return specs
