"""The options of the ``exactly`` data source, checked once on the driver, and the logs tasks share.

Spark hands options over as a case-insensitive mapping of strings; these frozen dataclasses are
what the readers and writers keep (they are pickled to the executors).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from exactly.errors import ConfigError
from exactly.events.fields import Fields
from exactly.log import Log, open_log
from exactly.log.base import DEFAULT_MAX_RECORD_BYTES, check_topic_name
from exactly.spark.datasource import offsets
from exactly.spark.datasource.offsets import Spec

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
AS_GIVEN, SORTED = "input", "sorted"


@dataclass(frozen=True)
class SourceOptions:
    log: str = field(repr=False)  # may hold secrets: never in a repr
    topic: str
    starting: Spec = "earliest"
    ending: Spec = "latest"  # batch reads only
    max_records_per_trigger: int | None = None
    arrow: bool = True
    read_records: int = 5000  # records per log read, and per Arrow batch
    read_tasks: int | None = None  # at most this many read tasks (None: one per partition)
    read_task_records: int = 1  # with read_tasks: a task more per this many records, up to it
    headers: bool = True  # False: no headers column (its decoding costs as much as the rest)
    fields: Fields | None = None  # JSON fields read from each value in Arrow (``source.py``)
    ranges: bool = False  # each task's offset ranges, not their records (``source.py``)
    keep_values: bool = False  # with fields: every record's value, its fields read or not
    merge: tuple[str, ...] = ()  # with fields: records alike merged, weighted (``merging.py``)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        log, topic = _required(options, "log"), _required(options, "topic")
        starting = offsets.parse_spec("startingOffsets", options.get("startingOffsets", "earliest"))
        ending = offsets.parse_spec(
            "endingOffsets", options.get("endingOffsets", "latest"), allow_earliest=False
        )
        limit = options.get("maxRecordsPerTrigger")
        per_trigger = None if limit is None else _positive(limit, "maxRecordsPerTrigger")
        tasks = options.get("readTasks")
        arrow = _flag(options.get("arrow", "true"), "arrow")
        fields = options.get("fields")
        if fields is not None and not arrow:
            raise ConfigError("option fields needs option arrow=true: the fields are read in Arrow")
        ranges = _flag(options.get("ranges", "false"), "ranges")
        keep_values = _flag(options.get("keepValues", "false"), "keepValues")
        if ranges and fields is not None:
            raise ConfigError("option ranges reads no records: it takes no option fields")
        parsed = None if fields is None else Fields.parse(fields)
        merge = _merge(options.get("merge"), parsed, keep_values)
        return cls(
            log=log,
            topic=topic,
            starting=starting,
            ending=ending,
            max_records_per_trigger=per_trigger,
            arrow=arrow,
            read_records=_positive(options.get("readRecords", "5000"), "readRecords"),
            read_tasks=None if tasks is None else _positive(tasks, "readTasks"),
            read_task_records=_positive(options.get("readTaskRecords", "1"), "readTaskRecords"),
            headers=_flag(options.get("headers", "true"), "headers"),
            fields=parsed,
            ranges=ranges,
            keep_values=keep_values,
            merge=merge,
        )


@dataclass(frozen=True)
class SinkOptions:
    log: str = field(repr=False)  # may hold secrets: never in a repr
    topic: str
    guarantee: str = EXACTLY_ONCE
    sink_id: str | None = None  # default: the streaming query's id, stable across restarts
    checkpoint: str | None = None  # the query's checkpointLocation option, named in errors
    append_records: int = 5000  # records per append
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    order: str = AS_GIVEN  # or SORTED: the sink sorts each task's rows (after a shuffle)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        guarantee = options.get("guarantee", EXACTLY_ONCE).lower()
        if guarantee not in {EXACTLY_ONCE, AT_LEAST_ONCE}:
            raise ConfigError(
                f"option guarantee is {guarantee!r}: use {EXACTLY_ONCE} (the default) "
                f"or {AT_LEAST_ONCE}"
            )
        order = options.get("order", AS_GIVEN).lower()
        if order not in {AS_GIVEN, SORTED}:
            raise ConfigError(
                f"option order is {order!r}: use {AS_GIVEN} (the default: rows are written in the "
                f"order the task sees them) or {SORTED} (after a shuffle)"
            )
        sink_id = options.get("sinkId")
        if sink_id is not None and not 1 <= len(sink_id) <= 100:
            raise ConfigError("option sinkId is 1 to 100 characters")
        return cls(
            log=_required(options, "log"),
            topic=_required(options, "topic"),
            guarantee=guarantee,
            sink_id=sink_id,
            checkpoint=options.get("checkpointLocation"),
            append_records=_positive(options.get("appendRecords", "5000"), "appendRecords"),
            max_record_bytes=_positive(
                options.get("maxRecordBytes", str(DEFAULT_MAX_RECORD_BYTES)), "maxRecordBytes"
            ),
            order=order,
        )


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name)
    if not value:
        example = "kafka://HOST:PORT or sqlite:///DIR" if name == "log" else "NAME"
        raise ConfigError(
            f'the exactly data source needs option {name}: .option("{name}", "{example}")'
        )
    if name == "topic":
        check_topic_name(value)
    return value


def _positive(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"option {name} must be a positive integer, not {text!r}")
    return value


def _flag(text: str, name: str) -> bool:
    if text.lower() not in {"true", "false"}:
        raise ConfigError(f"option {name} is true or false, not {text!r}")
    return text.lower() == "true"


_logs: dict[tuple[str, int], Log] = {}
_logs_pid = os.getpid()
_logs_lock = threading.Lock()


def shared_log(url: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Log:
    """One open log per URL in this process, kept for the process's life.

    Spark reuses its Python workers across tasks and micro-batches, so a task does not pay for
    connecting (a Kafka client starts threads and finds brokers). A forked child starts afresh.
    """
    global _logs_pid
    with _logs_lock:
        if _logs_pid != os.getpid():
            _logs.clear()  # the parent's clients have no threads here; never close them
            _logs_pid = os.getpid()
        log = _logs.get((url, max_record_bytes))
        if log is None:
            log = _logs[(url, max_record_bytes)] = open_log(url, max_record_bytes=max_record_bytes)
        return log


def _merge(text: str | None, fields: Fields | None, keep_values: bool) -> tuple[str, ...]:
    """Option ``merge``: the time fields read through their minute, as the source's rows merge
    them (``merging.py``); a merged row keeps no value, so it needs ``fields`` and refuses
    ``keepValues``."""
    if text is None:
        return ()
    if fields is None or keep_values:
        raise ConfigError("option merge needs option fields, and takes no keepValues")
    names = tuple(name.strip() for name in text.split(","))
    kinds = {field.name: field.kind for field in fields.fields}
    wrong = [name for name in names if kinds.get(name) != "timestamp"]
    if wrong:
        raise ConfigError(f"option merge names {wrong[0]!r}, which is not a timestamp field")
    return names
