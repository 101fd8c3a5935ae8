"""The mark the sink puts on the last record of each append, and how a task decides where to
resume: pure functions.

A mark is one header, ``exactly.sink``, whose value is ``<sink id> <batch id> <task> <sequence>``
in ASCII: which sink wrote the record, in which micro-batch, from which Spark partition, and the
record's position among that task's records for that output partition in that batch. An append
is stored whole or not at all, so the newest mark tells how many of a task's records are stored;
the records before it in its append carry none. Readers that want only keys and values never see
it; it costs about 50 bytes an append (it cost as much a record when every record had one).
"""

from __future__ import annotations

from typing import NamedTuple

from exactly.errors import StreamError
from exactly.log.base import Header

MARK = "exactly.sink"


class Mark(NamedTuple):
    sink: str
    batch: int
    task: int
    sequence: int

    def encode(self) -> bytes:
        return f"{self.sink} {self.batch} {self.task} {self.sequence}".encode()


def find_mark(headers: tuple[Header, ...]) -> Mark | None:
    """The mark among a record's headers; None if it has none (or a malformed one)."""
    for name, value in headers:
        if name == MARK:
            parts = value.split(b" ")
            if len(parts) != 4:
                return None
            try:
                return Mark(parts[0].decode(), int(parts[1]), int(parts[2]), int(parts[3]))
            except (UnicodeDecodeError, ValueError):
                return None
    return None


def without_mark(headers: tuple[Header, ...]) -> tuple[Header, ...]:
    """A record's headers less any mark: a copied record gets the mark of the sink writing it."""
    if not headers:
        return headers
    return tuple(header for header in headers if header[0] != MARK)


def resume_at(last: Mark | None, sink: str, batch: int, task: int, partition: int) -> int:
    """How many of this task's records for ``partition`` in ``batch`` are already stored.

    ``last`` is the newest record of ``sink`` in the partition (None if there is none since the
    sink claimed the topic). A record of an earlier batch means none of this batch is stored; of
    this batch, that the records up to its sequence are. Anything else breaks an assumption the
    guarantee rests on, and is refused before anything is written.
    """
    if last is None or last.batch < batch:
        return 0
    if last.batch > batch:
        raise StreamError(
            f"output partition {partition} already holds batch {last.batch} of this query, "
            f"which is now writing batch {batch}: its checkpoint is older than the topic "
            "(restored or copied?); start it with a new checkpoint and release the topic"
        )
    if last.task != task:
        raise StreamError(
            f"output partition {partition} got rows from two Spark partitions ({last.task} and "
            f"{task}) in batch {batch}: the sink needs each output partition's rows in one Spark "
            "partition; cluster the DataFrame with "
            "exactly.spark.datasource.sink.cluster_by_partition"
        )
    return last.sequence + 1
