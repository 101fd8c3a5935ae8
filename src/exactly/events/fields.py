"""Event fields read from JSON values in Arrow, for the values Spark's ``from_json`` would read
the same way, and only those.

The aggregate job counts by a few top-level fields of each event (``type``, ``event``,
``sourceId``, ``timestamp``, ``receivedAt`` and ``properties.revenue`` for the event counts).
Spark's ``from_json`` reads them in the JVM, the job's largest cost; Arrow's JSON reader
(RapidJSON) reads them in 1 to 2 µs an event in the source's Python worker, which already holds
the values, and a value read there need not cross to the JVM (docs/aggregate.md has the figures).
But the two parsers do not agree on everything (JSON Spark accepts and RapidJSON refuses, a
number where a string belongs, time formats, limits), and a count must not depend on which one
read an event. So :func:`parse` is strict, and a value it is not sure of is left for
``from_json``:

1. **Shape.** A value must start with ``{`` (no byte-order mark, no blank) and stay within the
   limits of Spark's parser (Jackson's): under :data:`MAX_VALUE_BYTES`, and when over
   :data:`LIMIT` bytes, fewer than :data:`LIMIT` opening brackets and no run of :data:`LIMIT`
   characters a number could be made of.
2. **RapidJSON parses it** to exactly one object, in valid UTF-8, with every wanted field
   absent, null or of its kind: a string for a ``string`` or a ``timestamp`` field (where Spark
   would give an object's JSON text, RapidJSON refuses it), an object for a ``map`` with each key
   read absent, null or a string. A batch that fails is split in halves until the values at
   fault are found alone.
   **A number where text is read** (a numeric ``revenue``: one event in eight in the demo's
   traffic) Spark writes as Jackson does: an integer as it is (``-0`` as ``0``), a fraction
   through a double and Java's ``Double.toString`` (``12.50`` as ``12.5``, ``1e10`` as
   ``1.0E10``). Such a value is read with each number there replaced by that text as a JSON
   string (:func:`spark_text`), when every one has a text known for sure: an integer, or a
   double whose shortest form has at most seven digits before the point and two after it, a
   set over which ``Double.toString`` of Java 17 and 21 was checked to give that form, every
   one of its 2 billion members (``bench/number_text.py``). Any other number leaves the value
   to ``from_json``.
3. **Times in one form.** A ``timestamp`` is read only from RFC 3339 text with its zone
   (``2026-11-26T06:00:00.123Z``, ``+02:00``), a year from 1900 to 2999 and at most six digits of
   fraction (:data:`TIMESTAMP`), and only when Arrow's cast to UTC microseconds takes it (a 30
   February does not pass): a naive time would depend on Spark's session time zone.

Every value left over is null in the result, and the caller hands it to ``from_json``:
``tests/integration/test_event_fields.py`` runs both parsers through Spark over valid, odd and
broken events and holds them to the same fields.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.json as pa_json  # type: ignore[import-untyped]

from exactly.errors import ConfigError

KINDS = {"string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC")}
MAX_VALUE_BYTES = 50_000  # Spark's parser refuses a field name of more than 50,000 characters
LIMIT = 1000  # nor a number of 1,000 characters or 1,000 levels of nesting
_NUMBER = np.zeros(256, np.bool_)
_NUMBER[list(b"-+.0123456789eE")] = True
_OPENER = np.zeros(256, np.bool_)
_OPENER[list(b"[{")] = True
TIMESTAMP = (
    r"^(19|2[0-9])[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"(Z|[+-](0[0-9]|1[0-7]):[0-5][0-9])$"
)


@dataclass(frozen=True)
class Field:
    """A top-level field: ``string``, ``timestamp``, or ``map`` (Spark's ``map<string, string>``,
    of which only ``keys`` are read, each only where its value is a JSON string)."""

    name: str
    kind: str
    keys: tuple[str, ...] = ()

    @property
    def ddl(self) -> str:
        return f"`{self.name}` {'map<string, string>' if self.kind == 'map' else self.kind}"

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.map_(pa.string(), pa.string()) if self.kind == "map" else KINDS[self.kind]

    @property
    def as_read(self) -> pa.DataType:
        """What RapidJSON reads: a map's keys as a struct, a time as its text (step 3)."""
        if self.kind == "map":
            return pa.struct([(key, pa.string()) for key in self.keys])
        return pa.string()


@dataclass(frozen=True)
class Fields:
    """The fields read from each value, in order."""

    fields: tuple[Field, ...]

    @classmethod
    def parse(cls, text: str) -> Fields:
        """Fields from their option text (:attr:`option`)."""
        problem = "write a JSON list of [name, kind] or [name, 'map', [key, ...]]"
        try:
            fields = tuple(
                Field(str(name), str(kind), tuple(map(str, keys[0])) if keys else ())
                for name, kind, *keys in json.loads(text)
            )
        except (ValueError, TypeError):
            raise ConfigError(f"option fields is {text!r}: {problem}") from None
        names = [f.name for f in fields]
        for field in fields:
            if field.kind not in (*KINDS, "map") or (field.kind == "map") != bool(field.keys):
                raise ConfigError(f"option fields: {field.name} is {field.kind}; {problem}")
        if not fields or len(set(names)) < len(names):
            raise ConfigError(f"option fields is {text!r}: name each field once")
        return cls(fields)

    @property
    def option(self) -> str:
        return json.dumps(
            [[f.name, f.kind, *([list(f.keys)] if f.keys else [])] for f in self.fields]
        )

    @property
    def ddl(self) -> str:
        """The fields as Spark's DDL (the source's column, ``from_json``'s schema)."""
        return ", ".join(field.ddl for field in self.fields)

    @property
    def arrow_type(self) -> pa.StructType:
        return pa.struct([(f.name, f.arrow_type) for f in self.fields])

    @property
    def as_read(self) -> pa.Schema:
        return pa.schema([(f.name, f.as_read) for f in self.fields])

    @functools.cached_property
    def numbers_read(self) -> re.Pattern[bytes]:
        """A JSON number after a name whose value is read as text (a ``string`` field's, a map
        key's), as JSON writes one (no leading zero, no ``+``, no bare point): group 1 the name
        and colon, group 2 the number. The name may be a nested key of the same name, where the
        number's text is not read and changes nothing."""
        quoted = b"|".join(re.escape(name.encode()) for name in self._named(times=False))
        number = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
        return re.compile(
            rb'("(?:%s)"[ \t\n\r]*:[ \t\n\r]*)(%s)(?=[ \t\n\r,}\]])' % (quoted, number)
        )

    @property
    def not_text(self) -> str:
        """A pattern (RE2) found in a value where a text or time field, or a key read, holds
        neither a string nor null: such a value fails RapidJSON's read (the pattern may also find
        a nested key of that name, which only leaves its value to ``from_json``)."""
        escaped = (re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", n) for n in self._named(times=True))
        return rf'"(?:{"|".join(escaped)})"\s*:\s*[^"n\s]'

    def _named(self, *, times: bool) -> list[str]:
        """The names whose values are read as text, in order: the ``string`` fields' (with
        ``times``, the ``timestamp`` fields' too) and the keys read from maps."""
        kinds = ("string", "timestamp") if times else ("string",)
        names = {f.name for f in self.fields if f.kind in kinds}
        return sorted(names | {key for f in self.fields for key in f.keys})


def parse(values: Sequence[bytes] | pa.BinaryArray, fields: Fields) -> pa.StructArray:
    """Each value's ``fields``, or null where ``from_json`` has to read it (module docstring).

    ``values``: bytes, or an Arrow binary array of them (no null), read as they are.
    """
    array = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    # 1. the shape
    lengths = pc.binary_length(array)
    shaped = pc.and_kleene(pc.starts_with(array, pattern="{"), pc.less(lengths, MAX_VALUE_BYTES))
    taken = pc.fill_null(shaped, False).to_numpy(zero_copy_only=False)
    long = np.flatnonzero(taken & (pc.fill_null(lengths, 0).to_numpy() >= LIMIT))
    if len(long):
        taken[long] = _within_limits(array.take(pa.array(long)).to_pylist())
    chosen = array.filter(pa.array(taken))
    # 2. RapidJSON: all at once, else without the values where a field is not text (a number
    # for revenue, say), split in halves where it still fails
    read = _read_block(chosen, fields.as_read)
    if read is not None:
        good = np.ones(len(chosen), np.bool_)
    else:
        found = pc.match_substring_regex(array, pattern=fields.not_text)
        at = np.flatnonzero(taken & pc.fill_null(found, False).to_numpy(zero_copy_only=False))
        array, rewritten = _numbers_as_text(array, at, fields.numbers_read)
        taken[at[~rewritten]] = False
        chosen = array.filter(pa.array(taken))
        read, good = _read_all(chosen, fields.as_read)
    columns = []
    for field in fields.fields:
        column = read.column(field.name).combine_chunks()
        if field.kind == "timestamp":
            # 3. times in one form
            column, formed = _timestamps(column)
            good &= formed
        elif field.kind == "map":
            column = _map(column, field.keys)
        columns.append(column)
    # each row's place among the chosen values, or -1: null (left for from_json)
    places = np.full(len(values), -1, np.int64)
    at = np.flatnonzero(taken)
    places[at] = np.where(good, np.arange(len(chosen)), -1)
    missing = places < 0
    indices = pa.array(places, pa.int64(), mask=missing)
    return pa.StructArray.from_arrays(
        [pc.take(column, indices) for column in columns],
        fields=list(fields.arrow_type),
        mask=pa.array(missing, pa.bool_()),
    )


def _numbers_as_text(
    array: pa.BinaryArray, at: np.ndarray, numbers: re.Pattern[bytes]
) -> tuple[pa.BinaryArray, np.ndarray]:
    """``array`` with each value at ``at`` rewritten, its numbers where text is read (found by
    ``numbers``: a name, the colon, the number) as strings of Spark's text for them; and which
    of those values were (one number or more rewritten, none that :func:`spark_text` is not sure
    of)."""
    rewritten = np.zeros(len(at), np.bool_)
    texts = []
    for n, value in enumerate(array.take(pa.array(at, pa.int64())).to_pylist()):
        try:
            text, count = numbers.subn(_as_text, value)
        except _Unsure:
            continue
        if count:
            rewritten[n] = True
            texts.append(text)
    if not texts:
        return array, rewritten
    mask = np.zeros(len(array), np.bool_)
    mask[at[rewritten]] = True
    return pc.replace_with_mask(array, pa.array(mask), pa.array(texts, pa.binary())), rewritten


class _Unsure(Exception):
    """A number whose text :func:`spark_text` does not know: its value is left to Spark."""


def _as_text(number: re.Match[bytes]) -> bytes:
    text = spark_text(number[2])
    if text is None:
        raise _Unsure
    return b'%s"%s"' % (number[1], text)


_INTEGER = re.compile(rb"-?(?:0|[1-9][0-9]*)")
# the doubles whose Java text is their shortest form, checked one by one (module docstring)
_PLAIN = re.compile(rb"-?(?:0|[1-9][0-9]{0,6})\.[0-9]{1,2}")


def spark_text(number: bytes) -> bytes | None:
    """The text Spark's ``from_json`` gives the JSON number ``number`` where it reads a string,
    or None where it is not known here for sure (module docstring, step 2)."""
    if _INTEGER.fullmatch(number):
        return b"%d" % int(number)  # Jackson's int, long or BigInteger: "-0" is "0"
    shortest = repr(float(number)).encode()  # Python's shortest form round-trips the double
    return shortest if _PLAIN.fullmatch(shortest) else None


def _within_limits(values: Sequence[bytes]) -> np.ndarray:
    """Whether each value has fewer than :data:`LIMIT` opening brackets and no run of
    :data:`LIMIT` number characters, counted over all the values' bytes at once (each value
    starts with ``{``, so no run goes on from one value into the next)."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    data = np.frombuffer(b"".join(values), np.uint8)
    ok = np.add.reduceat(_OPENER[data].astype(np.int64), starts) < LIMIT
    edges = np.flatnonzero(np.diff(np.concatenate([[0], _NUMBER[data], [0]]).astype(np.int8)))
    run_starts, run_ends = edges[::2], edges[1::2]
    long_runs = run_starts[run_ends - run_starts >= LIMIT]
    ok[np.searchsorted(starts, long_runs, side="right") - 1] = False
    return ok


def _read_all(values: pa.BinaryArray, schema: pa.Schema) -> tuple[pa.Table, np.ndarray]:
    """``values`` read by RapidJSON, one row each (null where it failed), and which rows are
    good (step 2)."""
    tables, good = [schema.empty_table()], [np.zeros(0, np.bool_)]
    for table, size in _read(values, 0, len(values), schema):
        good.append(np.full(size, table is not None, np.bool_))
        if table is None:
            table = pa.Table.from_arrays([pa.nulls(size, f.type) for f in schema], schema=schema)
        tables.append(table)
    return pa.concat_tables(tables), np.concatenate(good)


def _read(
    values: pa.BinaryArray, start: int, end: int, schema: pa.Schema
) -> Iterator[tuple[pa.Table | None, int]]:
    """The rows of ``values[start:end]`` in order, as tables of the rows RapidJSON read and
    ``None`` for a value it could not read alone; a range that fails is split in halves."""
    if start == end:
        return
    table = _read_block(values.slice(start, end - start), schema)
    if table is not None:
        yield table, end - start
    elif end - start == 1:
        yield None, 1
    else:
        middle = (start + end) // 2
        yield from _read(values, start, middle, schema)
        yield from _read(values, middle, end, schema)


def _map(read: pa.StructArray, keys: tuple[str, ...]) -> pa.MapArray:
    """The keys of ``read`` that have a value, as a map (null where the object was absent)."""
    count = len(read)
    present = np.stack(
        [pc.is_valid(read.field(n)).to_numpy(zero_copy_only=False) for n in range(len(keys))],
        axis=1,
    ).reshape(count, len(keys))
    rows, slots = np.nonzero(present)  # row-major: each row's keys in order
    values = pa.concat_arrays([read.field(n) for n in range(len(keys))])
    offsets = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(np.array(keys, dtype=object)[slots], pa.string()),
        pc.take(values, pa.array(slots * count + rows, pa.int64())),
        mask=pc.is_null(read),
    )


def _read_block(values: pa.BinaryArray, schema: pa.Schema) -> pa.Table | None:
    """``values`` read by RapidJSON in one call, one row each; None if any fails."""
    if not len(values):
        return schema.empty_table()
    lines = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
    block = pc.binary_join(lines, b"\n")[0].as_buffer()
    try:
        values.cast(pa.string())  # RapidJSON leaves invalid UTF-8 in strings; Spark replaces it
        table = pa_json.read_json(
            block,
            read_options=pa_json.ReadOptions(use_threads=False, block_size=block.size + 1),
            parse_options=pa_json.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    return table if table.num_rows == len(values) else None


def _timestamps(text: pa.StringArray) -> tuple[pa.TimestampArray, np.ndarray]:
    """The RFC 3339 times of ``text`` in UTC microseconds, and which rows are good (step 3):
    null text, or text of :data:`TIMESTAMP` that Arrow's cast takes."""
    utc = KINDS["timestamp"]
    formed = pc.match_substring_regex(text, pattern=TIMESTAMP)
    kept = pc.if_else(formed, text, pa.scalar(None, pa.string()))
    try:
        times = pc.cast(kept, utc)
    except pa.ArrowInvalid:  # a date that is not in the calendar: each alone
        times = pa.array([_one_time(value) for value in kept.to_pylist()], utc)
    ok = pc.fill_null(pc.or_kleene(pc.is_null(text), pc.is_valid(times)), False)
    return times, ok.to_numpy(zero_copy_only=False)


def _one_time(value: str | None) -> object:
    if value is None:
        return None
    try:
        return pc.cast(pa.array([value]), KINDS["timestamp"])[0].as_py()
    except pa.ArrowInvalid:
        return None
