"""What the Spark source and sink tests share: topics to fill, topics to compare."""

from __future__ import annotations

import re
from typing import Any

from exactly.log import Log, LogRecord, Record
from exactly.spark.datasource.marks import find_mark, without_mark


def fill(log: Log, topic: str, partitions: int, count: int, *, start: int = 0) -> None:
    """Append records ``start .. start + count - 1`` to each partition: keys, some headers."""
    for partition in range(partitions):
        log.append(
            topic,
            partition,
            [
                Record(
                    f"{partition}:{n}".encode(),
                    key=f"k{n}".encode() if n % 3 else None,
                    headers=(("n", str(n).encode()),) if n % 2 else (),
                    timestamp=1_700_000_000_000 + n,
                )
                for n in range(start, start + count)
            ],
        )


def read_partition(log: Log, topic: str, partition: int, offset: int = 0) -> list[LogRecord]:
    return [record for batch in log.read_range(topic, partition, offset) for record in batch]


def content(records: list[LogRecord]) -> list[tuple[Any, ...]]:
    """What a reader of keys, values, headers and timestamps sees, without the sink's marks."""
    return [(r.key, r.value, without_mark(r.headers), r.timestamp) for r in records]


def assert_copied(log: Log, source: str, destination: str) -> None:
    """``destination`` holds ``source`` exactly: per partition, in order, each record once."""
    partitions = log.topic_info(source).partitions
    assert log.topic_info(destination).partitions == partitions
    for partition in range(partitions):
        copied = read_partition(log, destination, partition)
        original = content(read_partition(log, source, partition))
        got = content(copied)
        if got != original:
            values = [r[1] for r in got]
            doubled = len(values) - len(set(values))
            missing = len({r[1] for r in original} - set(values))
            raise AssertionError(
                f"partition {partition}: {len(got)} records copied of {len(original)}, "
                f"{doubled} doubled, {missing} missing"
            )
        assert not copied or find_mark(copied[-1].headers) is not None  # the last append's last


JVM_BANNER = (
    "Using incubator modules",
    "Setting default log level",
    "To adjust logging level use sc.setLogLevel",
    "Picked up JDK_JAVA_OPTIONS",
    "Picked up JAVA_TOOL_OPTIONS",
    "Using Spark's default log4j profile",
    "NativeCodeLoader",
    "SLF4J:",
    "log4j:",
    "Exception in thread",
)
_JVM_LINE = re.compile(
    r"^(?:\d\d:\d\d:\d\d(?:\.\d+)? )?(?:\d{2,4}[-/]\d\d[-/]\d\d \S+ )?"
    r"(?:TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL)\b"  # a log4j level first
    r"|^\s*(?:at )?(?:org|com|java|javax|jdk|scala|py4j|io|sun)\.[a-z]\w*\.\w+"  # a class name
)


def jvm_lines(output: str) -> list[str]:
    """The lines of ``output`` that come from Spark's JVM: its banner, log4j or the JDK."""
    return [
        line
        for line in output.splitlines()
        if _JVM_LINE.match(line) or any(banner in line for banner in JVM_BANNER)
    ]
