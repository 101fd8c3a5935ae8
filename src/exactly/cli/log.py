"""``exactly log``: create, append to, read and inspect topics of the configured log."""

from __future__ import annotations

import base64
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

import typer
from rich.table import Column

from exactly.cli.context import context
from exactly.cli.output import console, fit, table
from exactly.errors import ExactlyError, InvalidRecord
from exactly.events import partition_for
from exactly.log import Log, LogRecord, Record
from exactly.urls import redact

app = typer.Typer(help="Create, append to, read and inspect log topics.", no_args_is_help=True)
CHUNK = 1000


@app.command()
def create(
    ctx: typer.Context,
    topic: str,
    partitions: Annotated[int, typer.Option(help="Number of partitions.")] = 1,
    exist_ok: Annotated[bool, typer.Option(help="Succeed if it exists with that count.")] = False,
) -> None:
    """Create TOPIC with N partitions."""
    with context(ctx).open_log() as log:
        info = log.create_topic(topic, partitions, exist_ok=exist_ok)
    print(fit(f"topic {info.name}: {info.partitions:,} partitions in", redact(log.url)))


@app.command()
def append(ctx: typer.Context, topic: str) -> None:
    """Append JSON lines from stdin: {"value": ..., "key": ..., "partition": P, "headers": {...}}.

    A string value or key is stored as its UTF-8; any other JSON value as its JSON text. Without a
    partition, records with a key go to the key's partition and others round-robin. Prints one
    line {"partition", "offset"} per record, in input order.
    """
    with context(ctx).open_log() as log:
        partitions = log.topic_info(topic).partitions
        lines = enumerate(sys.stdin, start=1)
        total = 0
        spread = itertools.cycle(range(partitions))
        while chunk := list(itertools.islice(lines, CHUNK)):
            parsed: list[tuple[int, Record]] = []
            failure: ExactlyError | None = None
            for number, line in chunk:
                if not line.strip():
                    continue
                try:
                    parsed.append(parse_line(line, partitions, spread))
                except ExactlyError as error:
                    failure = InvalidRecord(
                        f"line {number}: {error}; the {total + len(parsed)} records before it "
                        "were appended, fix the line and append from there"
                    )
                    break
            for partition, offset in append_in_order(log, topic, parsed):
                print(json.dumps({"partition": partition, "offset": offset}))
            total += len(parsed)
            if failure is not None:
                raise failure
    print(f"appended {total:,} records to {topic}", file=sys.stderr)


def parse_line(line: str, partitions: int, spread: Iterator[int]) -> tuple[int, Record]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise InvalidRecord(f"not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(data, dict) or "value" not in data:
        raise InvalidRecord('each line is a JSON object with at least a "value"')
    unknown = set(data) - {"value", "key", "partition", "headers", "timestamp"}
    if unknown:
        raise InvalidRecord(f"unknown field(s) {sorted(unknown)}")
    key = None if data.get("key") is None else as_bytes(data["key"])
    headers = data.get("headers") or {}
    if not isinstance(headers, dict):
        raise InvalidRecord('"headers" is an object of names to strings')
    timestamp = data.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, int) or timestamp < 0):
        raise InvalidRecord('"timestamp" is milliseconds since the epoch')
    partition = data.get("partition")
    if partition is None:
        partition = partition_for(key, partitions) if key is not None else next(spread)
    elif not isinstance(partition, int) or not 0 <= partition < partitions:
        raise InvalidRecord(f'"partition" must be 0 to {partitions - 1}, not {partition!r}')
    record = Record(
        as_bytes(data["value"]),
        key,
        tuple((str(name), as_bytes(value)) for name, value in headers.items()),
        timestamp,
    )
    return partition, record


def as_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


def append_in_order(
    log: Log, topic: str, parsed: list[tuple[int, Record]]
) -> Iterable[tuple[int, int | None]]:
    """Append per partition (one durable append each); yield (partition, offset) in input order."""
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for partition, record in parsed:
        by_partition[partition].append(record)
    offsets = {
        partition: iter(log.append(topic, partition, records).offsets)
        for partition, records in by_partition.items()
    }
    for partition, _ in parsed:
        yield partition, next(offsets[partition])


@app.command()
def read(
    ctx: typer.Context,
    topic: str,
    partition: Annotated[int | None, typer.Option(help="Only this partition.")] = None,
    from_: Annotated[int, typer.Option("--from", help="First offset (per partition).")] = 0,
    limit: Annotated[int | None, typer.Option(help="Stop after N records.")] = None,
) -> None:
    """Print records as JSON lines (text fields as UTF-8, else *_base64)."""
    with context(ctx).open_log() as log:
        wanted = [partition] if partition is not None else range(log.topic_info(topic).partitions)
        left = limit
        for part in wanted:
            end = log.end_offset(topic, part)  # the end as the read starts
            for batch in log.read_range(topic, part, min(from_, end), end, max_records=CHUNK):
                for record in batch[:left]:
                    sys.stdout.write(json.dumps(record_json(record)) + "\n")
                if left is not None:
                    left -= min(len(batch), left)
                    if left == 0:
                        return


def record_json(record: LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
    }
    for name, raw in (("key", record.key), ("value", record.value)):
        if raw is None:
            out[name] = None
        else:
            _put_text(out, name, raw)
    if record.headers:
        headers: dict[str, Any] = {}
        for name, raw in record.headers:
            _put_text(headers, name, raw)
        out["headers"] = headers
    return out


def _put_text(target: dict[str, Any], name: str, raw: bytes) -> None:
    try:
        target[name] = raw.decode()
    except UnicodeDecodeError:
        target[f"{name}_base64"] = base64.b64encode(raw).decode()


@app.command()
def stat(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Argument(help="A topic; all topics if omitted.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Partitions and end offsets of TOPIC (or of every topic)."""
    with context(ctx).open_log() as log:
        names = [topic] if topic is not None else log.topics()
        stats = [(name, log.topic_info(name).partitions, log.end_offsets(name)) for name in names]
    if as_json:
        rows = [
            {"topic": name, "partitions": count, "end_offsets": ends} for name, count, ends in stats
        ]
        print(json.dumps(rows[0] if topic is not None else rows))
        return
    found = table(
        "topic",
        Column("partitions", justify="right"),
        Column("records", justify="right"),
        "end offsets",
    )
    for name, partitions, ends in stats:
        found.add_row(
            name,
            f"{partitions:,}",
            f"{sum(ends.values()):,}",
            " ".join(f"{p}:{o:,}" for p, o in ends.items()),
        )
    console().print(found)
