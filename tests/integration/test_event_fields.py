"""Event fields read in Arrow (``exactly.events.fields``) against Spark's ``from_json``.

The aggregate job counts what the source read in Arrow where it could, and what ``from_json`` read
for the rest; a count must not depend on which. So over valid events, odd events, times in every
form and thousands of randomly broken values, every value ``parse`` reads must give exactly what
``from_json`` gives, and a batch of valid events must be read whole by ``parse``.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from exactly.events.fields import Field, Fields, parse, spark_text
from exactly.log import Record, open_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

FIELDS = Fields(
    (
        Field("type", "string"),
        Field("event", "string"),
        Field("sourceId", "string"),
        Field("timestamp", "timestamp"),
        Field("receivedAt", "timestamp"),
        Field("properties", "map", ("revenue", "a b")),
    )
)
TIMES = [
    "2026-11-26T06:00:00Z",
    "2026-11-26T06:00:00.1Z",
    "2026-11-26T06:00:00.12Z",
    "2026-11-26T06:00:00.123Z",
    "2026-11-26T06:00:00.1234Z",
    "2026-11-26T06:00:00.12345Z",
    "2026-11-26T06:00:00.123456Z",
    "2026-11-26T06:00:00.1234567Z",
    "2026-11-26T06:00:00.123456789Z",
    "2026-11-26T06:00:00+02:00",
    "2026-11-26T06:00:00.5-07:30",
    "2026-11-26T06:00:00+17:59",
    "2026-11-26T06:00:00+18:00",
    "2026-11-26T06:00:00+19:00",
    "2026-11-26T06:00:00+0200",
    "2026-11-26T06:00:00+02",
    "2026-11-26T06:00:00 +02:00",
    "2026-11-26T06:00:00z",
    "2026-11-26t06:00:00Z",
    "2026-11-26T06:00:00",
    "2026-11-26T06:00:00.123",
    "2026-11-26 06:00:00Z",
    "2026-11-26 06:00:00",
    "2026-11-26T06:00Z",
    "2026-11-26T06Z",
    "2026-11-26",
    "2026-11",
    "2026",
    "2026-02-29T00:00:00Z",
    "2024-02-29T00:00:00Z",
    "2026-02-30T00:00:00Z",
    "2026-04-31T00:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-11-26T24:00:00Z",
    "2026-11-26T23:60:00Z",
    "2026-11-26T23:59:60Z",
    "1900-01-01T00:00:00Z",
    "1899-12-31T23:59:59Z",
    "1582-10-10T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "2999-12-31T23:59:59.999999Z",
    "9999-12-31T23:59:59Z",
    "+2026-11-26T06:00:00Z",
    "-2026-11-26T06:00:00Z",
    "2026-11-26T06:00:00UTC",
    "2026-11-26T06:00:00[UTC]",
    "2026-11-26T06:00:00.Z",
    " 2026-11-26T06:00:00Z",
    "2026-11-26T06:00:00Z ",
    "２０２６-11-26T06:00:00Z",
    "1764136800",
    "",
    "now",
]
READ_TIMES = TIMES[:7] + TIMES[9:12]  # the forms ``parse`` reads itself
TEXTS: list[Any] = ["track", "", " ", "é", "😀", "a\u0000b", "line\nbreak", "\ufeff", "x" * 300]
ODD_VALUES = [
    b"",
    b" ",
    b"null",
    b"[]",
    b"[{}]",
    b"{}",
    b"{} ",
    b" {}",
    b"\xef\xbb\xbf{}",
    b'\xef\xbb\xbf{"type":"a"}',
    b'{"type":"a"}x',
    b'{"type":"a"} {"type":"b"}',
    b'{"type":"a"}\n{"type":"b"}',
    b'{"type":"a"}\n',
    b'{"type":"a"}\n\n',
    b'{\n"type": "a"\n}',
    b'{"type":"a",}',
    b"{'type':'a'}",
    b'{type:"a"}',
    b'{"type":"a"/*c*/}',
    b'{"type":"a\tb"}',
    b'{"type":"a\xffb"}',
    b'{"type":"\xc3\xa9"}',
    b'{"type":"\\u00e9"}',
    b'{"type":"\\ud800"}',
    b'{"type":"\\udc00x"}',
    b'{"type":"\\ud83d\\ude00"}',
    b'{"type":"\\u0000"}',
    b'{"type":"\\/"}',
    b'{"type":"a","type":"b"}',
    b'{"Type":"a"}',
    b'{"t\\u0079pe":"a"}',
    b'{"type":5}',
    b'{"type":5.0}',
    b'{"type":true}',
    b'{"type":{"a":1}}',
    b'{"type":["a"]}',
    b'{"type":null}',
    b'{"timestamp":1764136800}',
    b'{"timestamp":1764136800.5}',
    b'{"timestamp":true}',
    b'{"timestamp":null,"type":"a"}',
    b'{"x":NaN,"type":"a"}',
    b'{"x":Infinity,"type":"a"}',
    b'{"x":-Infinity,"type":"a"}',
    b'{"x":01,"type":"a"}',
    b'{"x":1.,"type":"a"}',
    b'{"x":.5,"type":"a"}',
    b'{"x":+1,"type":"a"}',
    b'{"x":-0,"type":"a"}',
    b'{"x":1e400,"type":"a"}',
    b'{"x":1e-400,"type":"a"}',
    b'{"x":' + b"1" * 999 + b',"type":"a"}',
    b'{"x":' + b"1" * 1001 + b',"type":"a"}',
    b'{"x":' + b"1" * 995 + b"." + b"1" * 10 + b',"type":"a"}',
    b'{"x":-' + b"1" * 995 + b"e+123" + b',"type":"a"}',
    b'{"x":"' + b"1" * 1200 + b'","type":"a"}',
    b'{"' + b"n" * 60_000 + b'":1,"type":"a"}',
    b'{"x":"' + b"[" * 1200 + b'","type":"a"}',
    b'{"x":"' + b"s" * 5000 + b'","type":"a"}',
    b'{"x":' + b"[" * 990 + b"]" * 990 + b',"type":"a"}',
    b'{"x":' + b"[" * 1100 + b"]" * 1100 + b',"type":"a"}',
    b'{"x":' + b'{"y":' * 1100 + b"1" + b"}" * 1100 + b',"type":"a"}',
    b'{"x":tru,"type":"a"}',
    b'{"x":"\\x","type":"a"}',
    b'{"x":"\\u12","type":"a"}',
    b'{"x":[1,,2],"type":"a"}',
    b'{"x":{"type":"inner"},"type":"outer"}',
    b'{"properties":{"revenue":12.5}}',
    b'{"properties":{"revenue":1e10}}',
    b'{"properties":{"revenue":2.82879384806159E17}}',
    b'{"properties":{"revenue":true}}',
    b'{"properties":{"revenue":{"amount":"5"}}}',
    b'{"properties":{"revenue":null}}',
    b'{"properties":{"revenue":"5","revenue":"6"}}',
    b'{"properties":{"Revenue":"5"}}',
    b'{"properties":{"rev\\u0065nue":"5"}}',
    b'{"properties":"revenue"}',
    b'{"properties":{"n":1,"n":2,"revenue":"5"}}',
    b'{"x":1,"x":2,"type":"a"}',
    b'{"properties":{"revenue":"5"},"properties":{"revenue":"6"}}',
    b'{"properties":["revenue"]}',
    b'{"properties":5}',
    b'{"properties":null,"type":"a"}',
    b'{"properties":{}}',
    b'{"properties":{"a b":"c","revenue":"1"}}',
    b'{"properties":{"revenue":12.50}}',
    b'{"properties":{"revenue":-0}}',
    b'{"properties":{"revenue":-0.0}}',
    b'{"properties":{"revenue":1E+2}}',
    b'{"properties":{"revenue":0.001}}',
    b'{"properties":{"revenue":9999999.99}}',
    b'{"properties":{"revenue":10000000.5}}',
    b'{"properties":{"revenue":12.499999999999999999}}',
    b'{"properties":{"revenue":123456789012345678901234567890}}',
    b'{"properties":{"revenue":012}}',
    b'{"properties":{"revenue":1.}}',
    b'{"properties":{"revenue":+1}}',
    b'{"properties":{"revenue":NaN}}',
    b'{"properties":{"revenue":5,"revenue":"6"}}',
    b'{"properties":{"revenue":5 }}',
    b'{"properties":{"revenue" : 5.25\n}}',
    b'{"properties":{"revenue":5},"type":true}',
    b'{"properties":{"revenue":5},"type":7.5}',
    b'{"properties":{"rev\\u0065nue":5}}',
    b'{"properties":{"x":{"revenue":5},"revenue":7}}',
    b'{"x":"\\"revenue\\":5","properties":{"revenue":"1"}}',
    b'{"\\"revenue":5,"properties":{"revenue":"1"}}',
    b'{"type":5,"event":-12.5,"properties":{"a b":3}}',
    b'{"timestamp":5,"properties":{"revenue":5}}',
    b'{"type":"a"',
    b'{"type":"a"}}',
    b'{"type"}',
    b'{"type":}',
    b'{"":1,"type":"a"}',
]


def event(rng: random.Random) -> dict[str, Any]:
    """A Segment-like event with fields of the wanted kinds, some missing or null."""
    found: dict[str, Any] = {
        "messageId": f"m-{rng.getrandbits(64):x}",
        "type": rng.choice(["track", "page", "identify", "screen", "group", "alias"]),
        "event": rng.choice(["Viewed", "Clicked", "Bought", "Ünïcode ✓", ""]),
        "sourceId": rng.choice(["web", "ios", "android"]),
        "timestamp": rng.choice(READ_TIMES),
        "receivedAt": f"2026-11-26T06:00:0{rng.randrange(10)}Z",
        "properties": properties(rng),
        "context": {"library": {"name": "analytics.js", "version": "5.0"}, "ip": "127.0.0.1"},
    }
    for name in ("event", "timestamp", "sourceId"):
        if rng.random() < 0.1:
            del found[name]
        elif rng.random() < 0.05:
            found[name] = None
    return found


def properties(rng: random.Random) -> Any:
    """Free-form properties; ``revenue`` and ``a b`` (the keys read) as text when there."""
    found: dict[str, Any] = {"n": rng.randrange(1000), "price": rng.random(), "tags": ["a", "b"]}
    if rng.random() < 0.5:
        found["revenue"] = rng.choice(["19.99", "0", "-3.5", "1e3", "abc", "", " 7 ", "１"])
    elif rng.random() < 0.3:  # a number, as the demo's events have it: read as Spark's text
        found["revenue"] = rng.choice([round(rng.uniform(-200, 5000), 2), rng.randrange(100)])
    if rng.random() < 0.2:
        found["a b"] = rng.choice(["x", None])
    if rng.random() < 0.1:
        found["nested"] = {"revenue": 5, "deeper": [{"revenue": "6"}]}
    return rng.choice([found] * 8 + [{}, None])


def broken(rng: random.Random, value: bytes) -> bytes:
    """``value`` with a few bytes changed, dropped or added."""
    data = bytearray(value)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data) + 1)
        choice = rng.random()
        byte = rng.choice(b'{}[]",:\\ 0123456789aeflnrstuxEZT-+.\n\t\x00\xff\xc3')
        if choice < 0.4 and at < len(data):
            data[at] = byte
        elif choice < 0.7 and at < len(data):
            del data[at]
        else:
            data.insert(at, byte)
    return bytes(data)


def corpus() -> tuple[list[bytes], int]:
    """The values to compare, and how many at the start are valid events ``parse`` must read."""
    rng = random.Random(16)
    valid = [orjson.dumps(event(rng)) for _ in range(2000)]
    valid += [orjson.dumps({"type": "track", "timestamp": t}) for t in READ_TIMES]
    agent = {"userAgent": "Mozilla/5.0 (X11; Linux x86_64) " * 60}  # over 1,000 bytes
    valid += [orjson.dumps({**event(rng), "context": agent}) for _ in range(20)]
    values = list(valid)
    values += [json.dumps({"type": t, "event": t}).encode() for t in TEXTS]
    values += [json.dumps({"type": "a", "timestamp": t}).encode() for t in TIMES]
    values += [json.dumps({"receivedAt": t}, ensure_ascii=False).encode() for t in TIMES]
    values += ODD_VALUES
    values += [broken(rng, rng.choice(valid)) for _ in range(6000)]
    return values, len(valid)


def as_compared(row: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """A parsed row with times as microseconds since the epoch, maps as their keys' values."""
    if row is None:
        return None
    out: list[Any] = []
    for field in FIELDS.fields:
        value = row[field.name]
        if field.kind == "timestamp" and value is not None:
            value = (value - EPOCH) // timedelta(microseconds=1)
        if field.kind == "map" and value is not None:
            value = tuple(dict(value).get(key) for key in field.keys)
        out.append(value)
    return tuple(out)


def spark_rows(spark: SparkSession, values: list[bytes]) -> list[tuple[Any, ...] | None]:
    """``from_json`` of each value, as :func:`as_compared` gives it."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(n, v) for n, v in enumerate(values)], "n int, value binary")
    return compared(frame.select("n", F.from_json(F.col("value").cast("string"), FIELDS.ddl)))


def compared(parsed: DataFrame) -> list[tuple[Any, ...] | None]:
    """Rows of (n, a struct of :data:`FIELDS`) in order of n, as :func:`as_compared` gives them."""
    from pyspark.sql import Row
    from pyspark.sql import functions as F

    parsed.sparkSession.conf.set("spark.sql.session.timeZone", "UTC")
    parsed = parsed.toDF("n", "e")
    columns = []
    for field in FIELDS.fields:
        column = F.col("e").getField(field.name)
        if field.kind == "timestamp":
            column = F.unix_micros(column)
        if field.kind == "map":
            keys = [column.getItem(key) for key in field.keys]
            column = F.when(column.isNotNull(), F.struct(*keys))
        columns.append(column)
    rows = parsed.select("n", F.col("e").isNull(), *columns).orderBy("n").collect()
    return [
        None if row[1] else tuple(tuple(v) if isinstance(v, Row) else v for v in row[2:])
        for row in rows
    ]


def test_what_arrow_reads_is_what_from_json_reads(spark: SparkSession) -> None:
    values, valid = corpus()
    ours = [as_compared(row) for row in parse(values, FIELDS).to_pylist()]
    theirs = spark_rows(spark, values)
    differ = [
        (values[n][:120], ours[n], theirs[n])
        for n in range(len(values))
        if ours[n] is not None and ours[n] != theirs[n]
    ]
    assert not differ, f"{len(differ)} values read differently, the first: {differ[:5]}"
    # a batch of valid events is read whole, numeric revenues among them: such a value is read
    # with each number where text is read, or under a nested key of the same name, as its text
    alone = parse(values[:valid], FIELDS).to_pylist()
    unread = [v for v, row in zip(values[:valid], alone, strict=True) if row is None]
    assert not unread, f"{len(unread)} valid events left for from_json: {unread[:3]}"
    # the odd and broken values were not all left for from_json: the comparison saw both paths
    assert sum(row is not None for row in ours[valid:]) > 1000
    assert sum(row is None for row in ours[valid:]) > 1000


def numbers(rng: random.Random) -> list[bytes]:
    """JSON numbers of every shape: the domain ``spark_text`` knows (up to seven digits before
    the point, two after it) written plainly, with trailing zeros, with exponents and with more
    digits than a double holds, and numbers around and outside it."""
    found = []
    for _ in range(6000):
        whole = rng.choice([0, rng.randrange(10), rng.randrange(10**4), rng.randrange(10**7)])
        fraction = rng.choice(["", "0", "00", "5", "50", "05", "99", f"{rng.randrange(100):02d}"])
        sign = rng.choice(["", "-"])
        plain = f"{sign}{whole}{'.' + fraction if fraction else ''}"
        found.append(plain)
        digits = f"{whole}{fraction}".lstrip("0") or "0"
        found.append(f"{sign}{digits}e-{len(fraction)}")  # the same number with an exponent
        found.append(f"{plain}{'' if fraction else '.0'}000000000000000001")  # past a double
    for _ in range(2000):
        found.append(repr(rng.uniform(-1e9, 1e9)))
        found.append(f"{rng.uniform(0, 1):.{rng.randrange(1, 8)}f}")
        found.append(f"{rng.randrange(10 ** rng.randrange(1, 40))}")
        found.append(f"{rng.uniform(1, 10):.3f}E{rng.randrange(-12, 25)}")
    return [n.encode() for n in found]


def test_the_text_of_a_number_is_sparks(spark: SparkSession) -> None:
    """``spark_text`` of a number is what ``from_json`` gives where it reads text (a map's
    value, a string field), for every number it claims to know."""
    from pyspark.sql import functions as F

    found = numbers(random.Random(45))
    values = [b'{"properties":{"revenue":%s},"type":%s}' % (n, n) for n in found]
    frame = spark.createDataFrame([(v,) for v in values], "value binary")
    parsed = frame.select(F.from_json(F.col("value").cast("string"), FIELDS.ddl).alias("e"))
    rows = parsed.select("e.properties.revenue", "e.type").collect()
    theirs = [(row[0], row[1]) for row in rows]
    ours = [spark_text(n) for n in found]
    known = [
        (n, text.decode(), their)
        for n, text, their in zip(found, ours, theirs, strict=True)
        if text is not None
    ]
    differ = [(n, text, their) for n, text, their in known if (text, text) != their]
    assert not differ, f"{len(differ)} numbers differ, the first: {differ[:5]}"
    assert len(known) > len(found) // 2, len(known)  # most were known
    assert len(known) < len(found) - 1000  # and others were left to from_json


def test_the_source_reads_them_and_leaves_the_rest_to_from_json(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Option ``fields``: a record has either its fields or its value, and ``coalesce(fields,
    from_json(value))`` is what ``from_json`` gives for every record."""
    from pyspark.sql import functions as F

    values, valid = corpus()
    log_url = f"sqlite://{tmp_path / 'log'}"
    with open_log(log_url) as log:
        log.create_topic("events", 1)
        for at in range(0, len(values), 1000):
            log.append("events", 0, [Record(v) for v in values[at : at + 1000]])
    records = (
        spark.read.format("exactly")
        .option("log", log_url)
        .option("topic", "events")
        .option("headers", "false")
        .option("fields", FIELDS.option)
        .load()
    )
    read = F.from_json(F.col("value").cast("string"), FIELDS.ddl)
    both = records.select(
        "offset", (F.col("fields").isNull() == F.col("value").isNull()).alias("both_or_neither")
    )
    assert both.where("both_or_neither").count() == 0
    assert compared(records.select("offset", F.coalesce("fields", read))) == spark_rows(
        spark, values
    )
    assert records.where(F.col("fields").isNotNull()).count() >= valid


def test_merged_rows_add_up_to_what_every_record_alone_does(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Option ``merge``: the aggregate job's tables over alike records merged into weighted rows
    are the tables over every record alone, parsed by ``from_json``: counts, counts of an
    expression, integer and decimal sums, by minute, hour and day, over the corpus's odd
    events and broken values, records without an event time among them."""
    from exactly.aggregate.frame import aggregate, check, events_frame, mergeable
    from exactly.aggregate.job import source_reading
    from exactly.aggregate.spec import EVENT_COUNTS, GroupKey, Measure, TableSpec

    values, _ = corpus()
    rng = random.Random(45)
    log_url = f"sqlite://{tmp_path / 'log'}"
    with open_log(log_url) as log:
        log.create_topic("events", 2)
        for at in range(0, len(values), 500):  # record times over three days, some before 1970
            stamp = rng.choice([1_795_000_000_000, 1_795_086_400_000, -86_400_000, 0])
            log.append(
                "events",
                at // 500 % 2,
                [Record(v, None, (), stamp + at) for v in values[at : at + 500]],
            )
    tables = [
        EVENT_COUNTS,
        TableSpec(
            "by_hour",
            (
                GroupKey("hour", "hour", "time"),
                GroupKey("day", "day", "time"),
                GroupKey("type", "type"),
            ),
            (
                Measure("events", "count", "*"),
                Measure("with_event", "count", "event"),
                Measure("letters", "sum", "length(event)"),
                Measure("bought", "sum", "properties['a b']"),
            ),
        ),
    ]
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        specs = check(spark, tables)
        assert mergeable(specs)
        columns, options = source_reading(specs)
        assert options.get("merge") == "timestamp,receivedAt"

        def read(columns: list[str], options: dict[str, str]) -> DataFrame:
            reader = spark.read.format("exactly").option("log", log_url).option("topic", "events")
            return reader.option("headers", "false").options(**options).load().select(*columns)

        merged = read(columns, options)
        alone = read(["partition", "offset", "value", "timestamp"], {})
        assert merged.count() < alone.count() - 1000  # the valid events without revenue merged
        assert merged.agg({"weight": "sum"}).first()[0] == len(values)
        for spec in specs:
            ours = sorted(
                tuple(row) for row in aggregate(events_frame(merged, specs), spec).collect()
            )
            theirs = sorted(
                tuple(row) for row in aggregate(events_frame(alone, specs), spec).collect()
            )
            assert ours == theirs, spec.name
            assert len(theirs) > 10
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
