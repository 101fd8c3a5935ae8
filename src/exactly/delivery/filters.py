"""A destination's ``filter``: a Spark SQL condition over the event's fields, checked at start.

``filter = "type = 'identify' or properties.plan = 'pro'"`` is parsed by Spark's own parser,
and the fields it names decide the schema the route query reads each event with (one
``from_json`` for every destination, so an event is parsed once):

- a name's first part must be a top-level field the collector stores (:data:`FIELDS`), written
  as Segment writes it (``userId``, not ``userid``);
- ``properties``, ``traits``, ``context`` and ``integrations`` named whole
  (``properties['plan']``) are read as ``map<string,string>``; named with a path
  (``context.page.url``) as nested structs;
- a leaf is read as text, then cast (``try_cast``) to ``double`` when the condition compares
  it with a number, or to ``boolean`` when it uses it as one: ``properties.revenue > 12``
  compares 12.5 (or the string ``"12.5"``) with 12, not 12 with 12, and a value that is not a
  number is null there, without touching the event's other fields.

The condition then runs with ANSI mode off on the route's own session: a value that does not
fit (``"free" > 12``) makes it null, which sends nothing, instead of failing the micro-batch
(whose replay would fail again). :func:`compile_filters` refuses, in one line naming
``destinations[i] (name).filter``, a condition that does not parse, names no field or a field
events do not have, or is not a boolean.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exactly.delivery.integrations import ALL
from exactly.errors import ConfigError
from exactly.events.fields import Field, Fields

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from exactly.delivery.settings import DestinationSettings

# The top-level fields of a stored event a filter may name (events/normalise.py keeps them).
FIELDS = (
    "type",
    "event",
    "name",
    "category",
    "userId",
    "anonymousId",
    "messageId",
    "groupId",
    "previousId",
    "properties",
    "traits",
    "context",
    "integrations",
    "timestamp",
    "originalTimestamp",
    "sentAt",
    "receivedAt",
    "sourceId",
    "version",
    "channel",
)
OBJECTS = frozenset({"properties", "traits", "context", "integrations"})
# What routing always reads: its own fields, and integrations for every destination's rule.
ROUTED = ("sourceId", "event", "messageId", "userId", "anonymousId", "integrations")
NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double", "decimal")


@dataclass
class _Node:
    """A field of the schema: a leaf (``kind``) or an object with named children."""

    kind: str = "string"
    children: dict[str, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class Filters:
    """The compiled filters of a plan's destinations: the fields to read each event with, and
    each destination's condition (None: no filter)."""

    fields: _Node
    conditions: tuple[str | None, ...]
    looked_up: frozenset[str] = frozenset()  # the integrations keys the rules read

    @property
    def source_fields(self) -> Fields | None:
        """The fields as the ``exactly`` source can read them in its Python worker (its option
        ``fields``), when it can: every field a top-level text field, and ``integrations``
        looked up only by the rules' keys (no filter names it). None otherwise: ``from_json``
        reads every event, as it always may."""
        found = []
        for name, node in sorted(self.fields.children.items()):
            if name == "integrations" and not node.children and self.looked_up:
                found.append(Field(name, "map", tuple(sorted(self.looked_up))))
            elif name in OBJECTS or node.children:
                return None
            else:
                found.append(Field(name, "string"))
        return Fields(tuple(found))

    @property
    def schema(self) -> str:
        """What ``from_json`` reads: every leaf as text (a number's text too), so a value of
        another kind than its column's never nulls its neighbours."""
        return _schema(self.fields, typed=False)

    def columns(self, parsed: str) -> list[Column]:
        """The top-level fields of the struct column ``parsed``, each leaf cast to its kind
        (``try_cast``: a value that is not a number is null)."""
        from pyspark.sql import functions as F

        return [
            _typed(F.col(f"{parsed}.`{name}`"), node).alias(name)
            for name, node in sorted(self.fields.children.items())
        ]


def _typed(column: Column, node: _Node) -> Column:
    from pyspark.sql import functions as F

    if not node.children:
        return column if node.kind == "string" else column.try_cast(node.kind)
    if not _retyped(node):
        return column
    return F.struct(
        *(
            _typed(column.getField(key), child).alias(key)
            for key, child in sorted(node.children.items())
        )
    )


def _retyped(node: _Node) -> bool:
    return node.kind != "string" or any(_retyped(child) for child in node.children.values())


def _where(index: int, destination: DestinationSettings) -> str:
    return f"destinations[{index}] ({destination.name}).filter"


def _first_line(error: BaseException) -> str:
    """Spark's message on one line, without its SQLSTATE."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    return re.sub(r"\s*SQLSTATE: \w+", "", " ".join(text.splitlines()[0].split()))


def references(spark: SparkSession, text: str) -> list[list[str]]:
    """The column names ``text`` uses, each as its parts (``context.page.url``: three).

    Raises the parser's error when ``text`` is not an expression.
    """
    parser = spark._jsparkSession.sessionState().sqlParser()  # no public parser
    expression = parser.parseExpression(text)
    found: list[list[str]] = []
    leaves = expression.collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if leaf.nodeName() == "UnresolvedAttribute":
            parts = leaf.nameParts()
            found.append([parts.apply(i) for i in range(parts.size())])
    return found


def _add(root: _Node, parts: Sequence[str]) -> None:
    node = root
    for part in parts:
        if node.children.get(part) is None:
            node.children[part] = _Node()
        node = node.children[part]


def _schema(root: _Node, *, typed: bool) -> str:
    """The DDL of ``root``'s fields: leaves as their kinds (``typed``) or all as text."""
    columns = [
        f"`{name}` {_field_ddl(name, node, typed)}" for name, node in sorted(root.children.items())
    ]
    return ", ".join(columns)


def _field_ddl(name: str, node: _Node, typed: bool) -> str:
    if name in OBJECTS and (name == "integrations" or not node.children):
        return "map<string,string>"
    if name not in OBJECTS:  # a path into text fails the check
        return node.kind if typed and not node.children else "string"
    return _struct(node, typed)


def _struct(node: _Node, typed: bool) -> str:
    inner = ", ".join(
        f"`{key}`: {_struct(child, typed) if child.children else _kind(child, typed)}"
        for key, child in sorted(node.children.items())
    )
    return f"struct<{inner}>"


def _kind(node: _Node, typed: bool) -> str:
    return node.kind if typed else "string"


def _leaf_kinds(spark: SparkSession, root: _Node, conditions: Sequence[str]) -> None:
    """Types each leaf by how the conditions use it: compared with a number, ``double``; used
    as a condition, ``boolean``; else text."""
    from pyspark.sql import functions as F

    frame = _empty(spark, _schema(root, typed=False))

    for condition in conditions:
        analysed = frame.select(F.expr(condition))._jdf.queryExecution().analyzed()
        _walk(analysed.projectList().apply(0), root)


def _empty(spark: SparkSession, ddl: str) -> DataFrame:
    """No rows, with the columns of ``ddl``, made in the JVM alone: ``createDataFrame`` would
    wrap a Python function, which races with ``exactly up``'s other queries starting in threads
    of the same driver (PySpark iterates the context's environment unlocked)."""
    from pyspark.sql import functions as F

    parsed = F.from_json(F.lit("{}"), f"struct<{_struct_fields(ddl)}>").alias("e")
    return spark.range(0).select(parsed).select("e.*")


def _struct_fields(ddl: str) -> str:
    """``a string, b double`` as the fields of a struct type: ``a: string, b: double``."""
    return re.sub(r"`([^`]*)` ", r"`\1`: ", ddl)


def _walk(node: Any, root: _Node) -> None:
    if node.nodeName() == "Cast":
        path = _path(node.child())
        target = node.dataType().simpleString()
        leaf = _find(root, path) if path else None
        if leaf is not None and not leaf.children:
            if target.startswith(NUMERIC):
                leaf.kind = "double"
            elif target == "boolean" and leaf.kind == "string":
                leaf.kind = "boolean"
    children = node.children()
    for i in range(children.size()):
        _walk(children.apply(i), root)


def _path(node: Any) -> list[str] | None:
    """The field path of a column reference (``properties.revenue``), None for anything else."""
    name = node.nodeName()
    if name == "AttributeReference":
        return [node.name()]
    if name == "GetStructField":
        parent = _path(node.child())
        return None if parent is None else [*parent, node.extractFieldName()]
    return None


def _find(root: _Node, path: Sequence[str]) -> _Node | None:
    node: _Node | None = root
    for part in path:
        node = None if node is None else node.children.get(part)
    return node


def compile_filters(spark: SparkSession, destinations: Sequence[DestinationSettings]) -> Filters:
    """The schema and conditions of ``destinations``' filters, or ConfigError naming the first
    that is refused. Runs on a new session of ``spark`` with ANSI mode off, as the route does."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    session = spark.newSession()
    session.conf.set("spark.sql.ansi.enabled", "false")
    root = _Node()
    for name in ROUTED:
        _add(root, [name])
    named: set[str] = set()  # the top-level fields the filters name
    for index, destination in enumerate(destinations):
        if destination.filter is None:
            continue
        try:
            names = references(session, destination.filter)
        except PySparkException as error:
            raise ConfigError(f"{_where(index, destination)}: {_first_line(error)}") from None
        if not names:
            raise ConfigError(
                f"{_where(index, destination)}: {destination.filter!r} names no field of the "
                "event; name one, such as type, event or properties.plan"
            )
        for parts in names:
            named.add(parts[0])
            if parts[0] not in FIELDS:
                raise ConfigError(
                    f"{_where(index, destination)}: events have no field {parts[0]!r}; "
                    f"the fields are {', '.join(FIELDS)} (properties.NAME for a property)"
                )
            _add(root, parts)
    conditions = tuple(destination.filter for destination in destinations)
    written = [condition for condition in conditions if condition is not None]
    with contextlib.suppress(PySparkException):  # the check below names the one that fails
        _leaf_kinds(session, root, written)
    frame = _empty(session, _schema(root, typed=True))
    for index, destination in enumerate(destinations):
        if destination.filter is None:
            continue
        try:
            kind = frame.select(F.expr(destination.filter)).schema.fields[0].dataType
        except PySparkException as error:
            raise ConfigError(f"{_where(index, destination)}: {_first_line(error)}") from None
        if kind.simpleString() != "boolean":
            raise ConfigError(
                f"{_where(index, destination)}: {destination.filter!r} is a "
                f"{kind.simpleString()}, not a condition (true or false)"
            )
    keys = {ALL} | {d.name for d in destinations if not d.ignore_integrations}
    return Filters(root, conditions, frozenset() if "integrations" in named else frozenset(keys))
