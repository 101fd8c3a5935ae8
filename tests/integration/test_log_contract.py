"""The log contract: the same assertions on every backend (sqlite and Kafka via Tansu)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from exactly.errors import (
    Fenced,
    InvalidLogURL,
    InvalidRecord,
    InvalidTopicName,
    PartitionOutOfRange,
    RecordTooLarge,
    TopicExists,
    UnknownTopic,
)
from exactly.log import Log, Record, TopicInfo, open_log

ROOT = Path(__file__).resolve().parents[2]


def values(records: list[Record] | list) -> list[bytes]:  # type: ignore[type-arg]
    return [record.value for record in records]


def read_all(log: Log, topic: str, partition: int, offset: int = 0) -> list:  # type: ignore[type-arg]
    out = []
    while batch := log.read(topic, partition, offset, max_records=500):
        out += batch
        offset = batch[-1].offset + 1
    return out


# -- topics -------------------------------------------------------------------------------------


def test_create_and_topic_info(log: Log, topic: str) -> None:
    assert log.create_topic(topic, 3) == TopicInfo(topic, 3)
    assert log.topic_info(topic) == TopicInfo(topic, 3)
    assert topic in log.topics()
    assert log.end_offsets(topic) == {0: 0, 1: 0, 2: 0}


def test_create_existing(log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    assert log.create_topic(topic, 2, exist_ok=True) == TopicInfo(topic, 2)
    with pytest.raises(TopicExists):
        log.create_topic(topic, 2)
    with pytest.raises(TopicExists, match="2 partitions"):
        log.create_topic(topic, 5, exist_ok=True)


@pytest.mark.parametrize("name", ["", "a b", "../x", "x/y", "é", "a" * 201])
def test_bad_topic_names(log: Log, name: str) -> None:
    with pytest.raises(InvalidTopicName):
        log.create_topic(name, 1)


def test_bad_partition_count(log: Log, topic: str) -> None:
    with pytest.raises(InvalidRecord):
        log.create_topic(topic, 0)


# -- append and read ----------------------------------------------------------------------------


def test_offsets_dense_and_ordered_per_partition(log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    first = log.append(topic, 0, [Record(b"a"), Record(b"b")])
    second = log.append(topic, 0, [Record(b"c")])
    other = log.append(topic, 1, [Record(b"x")])
    assert first.offsets == [0, 1]
    assert second.offsets == [2]
    assert other.offsets == [0]
    assert values(read_all(log, topic, 0)) == [b"a", b"b", b"c"]
    assert values(read_all(log, topic, 1)) == [b"x"]
    assert log.end_offsets(topic) == {0: 3, 1: 1}
    assert log.start_offsets(topic) == {0: 0, 1: 0}  # nothing removed by retention
    with pytest.raises(UnknownTopic):
        log.start_offsets(f"{topic}-missing")
    assert [log.end_offset(topic, p) for p in (0, 1)] == [3, 1]


def test_record_fields_round_trip(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    log.append(
        topic,
        0,
        [
            Record(
                b"v1", key=b"k1", headers=(("a", b"1"), ("b", b"")), timestamp=1_700_000_000_123
            ),
            Record(b"", key=None),
        ],
    )
    first, second = read_all(log, topic, 0)
    assert (first.partition, first.offset, first.key, first.value) == (0, 0, b"k1", b"v1")
    assert first.headers == (("a", b"1"), ("b", b""))
    assert first.timestamp == 1_700_000_000_123
    assert second.key is None and second.value == b"" and second.headers == ()
    assert second.timestamp > 1_700_000_000_123  # "now"


def test_a_read_without_headers_leaves_only_them_out(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    log.append(
        topic,
        0,
        [
            Record(b"v1", key=b"k1", headers=(("a", b"1"),), timestamp=1_700_000_000_123),
            Record(b"v2", headers=(("b", b"2"), ("c", b"3"))),
        ],
    )
    full = log.read(topic, 0, 0)
    bare = log.read(topic, 0, 0, headers=False)
    assert [r.headers for r in bare] == [(), ()]
    assert [r._replace(headers=()) for r in full] == bare


def test_bounded_batches(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    log.append(topic, 0, [Record(b"%03d" % i + b"x" * 97) for i in range(250)])
    assert len(log.read(topic, 0, 0, max_records=100)) == 100
    middle = log.read(topic, 0, 120, max_records=10)
    assert [r.offset for r in middle] == list(range(120, 130))
    assert middle[0].value.startswith(b"120")
    by_bytes = log.read(topic, 0, 0, max_records=1000, max_bytes=1000)
    assert 1 <= len(by_bytes) <= 10
    assert log.read(topic, 0, 250) == []
    assert log.read(topic, 0, 10_000) == []
    assert len(read_all(log, topic, 0)) == 250


def as_columns(records: list, headers: bool) -> dict[str, list]:  # type: ignore[type-arg]
    """``records`` as ``read_range_columns`` answers them, column by column."""
    found = {
        "offset": [r.offset for r in records],
        "key": [r.key for r in records],
        "value": [r.value for r in records],
        "timestamp": [r.timestamp for r in records],
    }
    if headers:
        found["headers"] = [[{"key": n, "value": v} for n, v in r.headers] for r in records]
    return found


@pytest.mark.parametrize("headers", [True, False])
def test_a_columnar_read_answers_the_records_of_a_read(log: Log, topic: str, headers: bool) -> None:
    """``read_range_columns`` gives the same records as ``read_range`` in Arrow columns, from
    any offset to any end, cut by ``max_records`` and ``max_bytes`` alike."""
    log.create_topic(topic, 1)
    for append in range(3):  # stored batches of several sizes; keys, headers, times or none
        log.append(
            topic,
            0,
            [
                Record(
                    b"%d.%d" % (append, n) + b"x" * (n % 40),
                    key=None if n % 3 == 0 else b"k%d" % n,
                    headers=(("a", b"%d" % n),) * (n % 3),
                    timestamp=1_700_000_000_000 + n if n % 2 else None,
                )
                for n in range(50 * append + 7)
            ],
        )
    end = log.end_offset(topic, 0)
    for start, stop, max_records, max_bytes in [
        (0, end, 1000, 4 << 20),
        (3, end - 5, 17, 4 << 20),
        (60, end, 1000, 300),
        (end - 1, end, 5, 1),
    ]:
        expected = [
            r
            for batch in log.read_range(
                topic, 0, start, stop, max_records=max_records, max_bytes=max_bytes
            )
            for r in batch
        ]
        batches = list(
            log.read_range_columns(
                topic, 0, start, stop, max_records=max_records, max_bytes=max_bytes, headers=headers
            )
        )
        assert all(0 < batch.num_rows <= max_records for batch in batches)
        read = pa.Table.from_batches(batches).to_pydict()
        assert read == as_columns(expected, headers), (start, stop, max_records, max_bytes)


def test_large_record_alone_still_read(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    log.append(topic, 0, [Record(b"x" * 100_000)])
    assert len(log.read(topic, 0, 0, max_bytes=10)) == 1


def test_empty_append(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    assert log.append(topic, 0, []).offsets == []
    assert log.end_offsets(topic) == {0: 0}


# -- consumer groups ----------------------------------------------------------------------------


def test_group_offsets(log: Log, topic: str) -> None:
    log.create_topic(topic, 3)
    assert log.committed_offsets("g1", topic) == {}
    log.commit_offsets("g1", topic, {0: 5, 2: 7})
    log.commit_offsets("g1", topic, {0: 6})
    log.commit_offsets("g2", topic, {1: 1})
    assert log.committed_offsets("g1", topic) == {0: 6, 2: 7}
    assert log.committed_offsets("g2", topic) == {1: 1}


def test_group_offsets_survive_reopen(log_url: str, topic: str) -> None:
    with open_log(log_url) as log:
        log.create_topic(topic, 1)
        log.commit_offsets("g", topic, {0: 3})
    with open_log(log_url) as log:
        assert log.committed_offsets("g", topic) == {0: 3}


# -- producer idempotency -----------------------------------------------------------------------


def test_sequences_drop_duplicates(log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    assert log.last_sequence(topic, 0, "imp") is None
    first = log.append(topic, 0, [Record(b"a"), Record(b"b")], producer="imp", sequences=[10, 20])
    assert first.offsets == [0, 1]
    again = log.append(
        topic,
        0,
        [Record(b"b"), Record(b"c"), Record(b"c2")],
        producer="imp",
        sequences=[20, 30, 30],
    )
    assert again.offsets == [None, 2, None]
    assert (again.appended, again.duplicates) == (1, 2)
    assert log.last_sequence(topic, 0, "imp") == 30
    # per partition and per producer
    assert log.last_sequence(topic, 1, "imp") is None
    assert log.append(topic, 1, [Record(b"z")], producer="imp", sequences=[1]).offsets == [0]
    assert log.append(topic, 0, [Record(b"o")], producer="other", sequences=[1]).offsets == [3]
    assert values(read_all(log, topic, 0)) == [b"a", b"b", b"c", b"o"]


def test_sequences_survive_reopen(log_url: str, topic: str) -> None:
    with open_log(log_url) as log:
        log.create_topic(topic, 1)
        log.append(topic, 0, [Record(b"a"), Record(b"b")], producer="imp", sequences=[1, 2])
        log.append(topic, 0, [Record(b"plain")])
    with open_log(log_url) as log:
        assert log.last_sequence(topic, 0, "imp") == 2
        result = log.append(
            topic, 0, [Record(b"b"), Record(b"c")], producer="imp", sequences=[2, 3]
        )
        assert result.offsets == [None, 3]
        assert values(read_all(log, topic, 0)) == [b"a", b"b", b"plain", b"c"]


def test_sequence_arguments_checked(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    with pytest.raises(InvalidRecord):
        log.append(topic, 0, [Record(b"a")], producer="p")
    with pytest.raises(InvalidRecord):
        log.append(topic, 0, [Record(b"a")], producer="p", sequences=[1, 2])
    with pytest.raises(InvalidRecord):
        log.append(topic, 0, [Record(b"a")], producer="p", sequences=[-1])


# -- bad input ----------------------------------------------------------------------------------


def test_unknown_topic(log: Log, topic: str) -> None:
    with pytest.raises(UnknownTopic, match="exactly log create"):
        log.append(topic, 0, [Record(b"a")])
    with pytest.raises(UnknownTopic):
        log.read(topic, 0, 0)
    with pytest.raises(UnknownTopic):
        log.end_offsets(topic)
    with pytest.raises(UnknownTopic):
        log.topic_info(topic)


def test_partition_out_of_range(log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    for partition in (2, -1):
        with pytest.raises(PartitionOutOfRange, match="partitions 0 to 1"):
            log.append(topic, partition, [Record(b"a")])
        with pytest.raises(PartitionOutOfRange):
            log.read(topic, partition, 0)
    with pytest.raises(InvalidRecord):
        log.read(topic, 0, -5)


def test_oversize_record(log_url: str, topic: str) -> None:
    with open_log(log_url, max_record_bytes=1000) as log:
        log.create_topic(topic, 1)
        with pytest.raises(RecordTooLarge, match="max_record_bytes"):
            log.append(topic, 0, [Record(b"ok"), Record(b"x" * 1001)])
        assert log.end_offsets(topic) == {0: 0}  # nothing of the refused append was stored


@pytest.mark.parametrize("url", ["", "nonsense", "ftp://x", "sqlite://", "kafka://"])
def test_malformed_urls(url: str) -> None:
    with pytest.raises(InvalidLogURL):
        open_log(url)


# -- several processes --------------------------------------------------------------------------

_APPENDER = """
import sys
from exactly.log import Record, open_log
url, topic, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open_log(url) as log:
    for i in range(count):
        part = i % 2
        log.append(topic, part, [Record(f"{name}:{i}".encode()), Record(f"{name}:{i}b".encode())],
                   producer=name, sequences=[2 * i, 2 * i + 1])
"""


def test_several_appending_processes(log_url: str, log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    count = 60
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _APPENDER, log_url, topic, f"w{n}", str(count)], cwd=ROOT
        )
        for n in range(4)
    ]
    readers_saw = 0
    while any(proc.poll() is None for proc in procs):
        readers_saw = max(readers_saw, sum(log.end_offsets(topic).values()))
    assert [proc.wait() for proc in procs] == [0, 0, 0, 0]
    everything = read_all(log, topic, 0) + read_all(log, topic, 1)
    assert len(everything) == 4 * count * 2
    assert len({r.value for r in everything}) == len(everything)
    for partition in (0, 1):
        records = read_all(log, topic, partition)
        assert [r.offset for r in records] == list(range(len(records)))
        for n in range(4):
            mine = [r.value.decode() for r in records if r.value.startswith(f"w{n}:".encode())]
            expected = [
                f"w{n}:{i}{suffix}" for i in range(partition, count, 2) for suffix in ("", "b")
            ]
            assert mine == expected  # each writer's order kept within the partition


def test_append_many(log: Log, topic: str) -> None:
    log.create_topic(topic, 3)
    log.append(topic, 1, [Record(b"first")])
    results = log.append_many(topic, {0: [Record(b"a"), Record(b"b")], 1: [Record(b"c")], 2: []})
    assert {p: r.offsets for p, r in results.items()} == {0: [0, 1], 1: [1], 2: []}
    assert values(read_all(log, topic, 1)) == [b"first", b"c"]
    with pytest.raises(PartitionOutOfRange):
        log.append_many(topic, {0: [Record(b"x")], 3: [Record(b"y")]})
    assert log.end_offsets(topic) == {0: 2, 1: 2, 2: 0}  # a refused call stores nothing


def test_reserved_header_names(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    with pytest.raises(InvalidRecord, match="reserved"):
        log.append(topic, 0, [Record(b"a", headers=(("exactly.seq", b"1"),))])


# -- fenced writers -----------------------------------------------------------------------------


def test_writer_appends_after_what_is_there(log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    log.append(topic, 0, [Record(b"plain")])
    with log.open_writer(topic, 0, "sink-a") as writer:
        writer.append([Record(b"a", key=b"k", headers=(("h", b"1"),), timestamp=7), Record(b"b")])
        writer.append([])
        writer.append([Record(b"c")])
        writer.commit()
    records = read_all(log, topic, 0)
    assert values(records) == [b"plain", b"a", b"b", b"c"]
    assert (records[1].key, records[1].headers, records[1].timestamp) == (b"k", (("h", b"1"),), 7)
    assert read_all(log, topic, 1) == []
    log.append(topic, 0, [Record(b"after")])  # plain appends still work beside fenced writers
    assert values(read_all(log, topic, 0))[-1] == b"after"


def test_newer_writer_fences_older(log_url: str, log: Log, topic: str) -> None:
    log.create_topic(topic, 2)
    old = log.open_writer(topic, 0, "sink-a")
    old.append([Record(b"old")])
    old.commit()
    with open_log(log_url) as elsewhere:  # as another process would
        new = elsewhere.open_writer(topic, 0, "sink-a")
        with pytest.raises(Fenced, match="fenced"):
            old.append([Record(b"zombie")])
            old.commit()
        old.close()
        # other writer ids and other partitions are not fenced
        with log.open_writer(topic, 0, "sink-b") as peer:
            peer.append([Record(b"peer")])
            peer.commit()
        with log.open_writer(topic, 1, "sink-a") as neighbour:
            neighbour.append([Record(b"neighbour")])
            neighbour.commit()
        new.append([Record(b"new")])
        new.commit()
        new.close()
    assert values(read_all(log, topic, 0)) == [b"old", b"peer", b"new"]
    assert values(read_all(log, topic, 1)) == [b"neighbour"]


def test_writer_arguments_checked(log: Log, topic: str) -> None:
    log.create_topic(topic, 1)
    with pytest.raises(PartitionOutOfRange):
        log.open_writer(topic, 1, "w")
    with pytest.raises(InvalidRecord):
        log.open_writer(topic, 0, "")
    with pytest.raises(UnknownTopic):
        log.open_writer(f"{topic}-missing", 0, "w")
    with log.open_writer(topic, 0, "w") as writer, pytest.raises(InvalidRecord, match="reserved"):
        writer.append([Record(b"a", headers=(("exactly.seq", b"1"),))])


def test_reads_from_any_offset_after_writer_commits(log: Log, topic: str) -> None:
    """Kafka commits leave marker offsets; a read from any offset, a marker's too, must return."""
    log.create_topic(topic, 1)
    for batch in ([b"a", b"b"], [b"c"]):
        with log.open_writer(topic, 0, "w") as writer:
            writer.append([Record(value) for value in batch])
            writer.commit()
    end = log.end_offsets(topic)[0]
    stored = read_all(log, topic, 0)
    assert values(stored) == [b"a", b"b", b"c"]
    for offset in range(end + 2):
        assert read_all(log, topic, 0, offset) == [r for r in stored if r.offset >= offset]
