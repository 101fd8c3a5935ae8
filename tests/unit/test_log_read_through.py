"""``read_through``: a range read to its end whatever the reads in between answer (pure logic,
with reads faked: short, empty, past markers)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.errors import ShortRead
from exactly.log.base import LogRecord, read_through


def record(offset: int) -> LogRecord:
    return LogRecord(0, offset, None, b"%d" % offset, (), 0)


@given(
    offsets=st.lists(st.integers(0, 300), unique=True).map(sorted),
    end_extra=st.integers(0, 5),
    seed=st.integers(0, 1000),
    limit=st.integers(1, 50),
)
def test_every_record_of_the_range_once_whatever_the_reads_answer(
    offsets: list[int], end_extra: int, seed: int, limit: int
) -> None:
    """Offsets with gaps (markers), reads that stop anywhere, some empty: every record below
    the end, once, in order."""
    end = (offsets[-1] + 1 if offsets else 0) + end_extra  # markers may follow the last record
    rng = random.Random(seed)

    def read_at(offset: int, retry: bool) -> tuple[list[LogRecord], int]:
        found = [record(o) for o in offsets if o >= offset][:limit]
        if found and rng.random() < 0.3:  # cut short, as Tansu did: a prefix, maybe none
            kept = found[: rng.randrange(len(found))]
            return kept, kept[-1].offset + 1 if kept else offset
        if len(found) < limit:  # the reader stepped over markers to the partition's end
            return found, max(end, found[-1].offset + 1 if found else offset)
        return found, found[-1].offset + 1

    start = rng.randrange(end + 1)
    got = [r.offset for batch in read_through(read_at, start, end, 5.0, "t") for r in batch]
    assert got == [o for o in offsets if start <= o < end]


def test_a_read_past_the_end_is_cut_at_it() -> None:
    batches = list(read_through(lambda o, _: ([record(o), record(o + 1)], o + 2), 3, 4, 1.0, "t"))
    assert [[r.offset for r in batch] for batch in batches] == [[3]]


def test_reads_that_get_nowhere_fail_after_the_patience_and_say_where() -> None:
    retries: list[bool] = []

    def nowhere(offset: int, retry: bool) -> tuple[list[LogRecord], int]:
        retries.append(retry)
        return [], offset

    with pytest.raises(ShortRead, match=r"reading 'raw' partition 1 stopped at offset 7, short"):
        list(read_through(nowhere, 7, 9, 0.2, "'raw' partition 1"))
    assert retries[0] is False and all(retries[1:]) and len(retries) >= 3  # retried afresh
