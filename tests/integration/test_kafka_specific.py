"""What only the Kafka log does: header sequences and tail scans, Tansu's watermark, timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from exactly.errors import InvalidLogURL, InvalidRecord, LogUnavailable
from exactly.log import Record, open_log
from exactly.log.kafka import HINT_GROUP_PREFIX, PRODUCER_HEADER, SEQUENCE_HEADER, KafkaLog
from exactly.log.kafka.client import READER
from tests.servers import free_port

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]


def raw_records(kafka_url: str, topic: str, partition: int) -> list[tuple[int, list]]:  # type: ignore[type-arg]
    """(offset, headers) of every record, as a plain Kafka consumer sees them."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_url.removeprefix("kafka://"),
            "group.id": "raw",
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    seen = []
    try:
        while (message := consumer.poll(10)) is not None and message.error() is None:
            seen.append((message.offset(), message.headers() or []))
    finally:
        consumer.close()
    return seen


def watermark(kafka_url: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": kafka_url.removeprefix("kafka://"), "group.id": "w"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])
    finally:
        consumer.close()


# -- an unreachable broker ----------------------------------------------------------------------


def test_unreachable_broker_fails_fast() -> None:
    url = f"kafka://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with open_log(url, timeout=2) as log:
        assert time.monotonic() - started < 2  # opening never waits for the broker
        for call in (log.topics, lambda: log.topic_info("t"), lambda: log.create_topic("t", 1)):
            started = time.monotonic()
            with pytest.raises(LogUnavailable, match="exactly doctor") as caught:
                call()
            assert time.monotonic() - started < 6
            assert url in str(caught.value)


def test_default_timeout_is_ten_seconds() -> None:
    with open_log(f"kafka://127.0.0.1:{free_port()}") as log:
        assert isinstance(log, KafkaLog) and log.timeout == 10


def test_client_defaults_give_way_to_url_options() -> None:
    url = f"kafka://127.0.0.1:{free_port()}"
    with open_log(url) as log:
        assert isinstance(log, KafkaLog)
        assert log._common["reconnect.backoff.ms"] == 10  # a coordinator in 15 ms, not 53
        assert log._consumer_config(READER)["fetch.wait.max.ms"] == 3
    with open_log(f"{url}?reconnect.backoff.ms=100&fetch.wait.max.ms=10") as log:
        assert isinstance(log, KafkaLog)
        assert log._common["reconnect.backoff.ms"] == "100"
        assert log._consumer_config(READER)["fetch.wait.max.ms"] == "10"


_QUIET = """
import sys
from exactly.errors import LogUnavailable
from exactly.log import open_log
with open_log(sys.argv[1], timeout=1.5) as log:
    try:
        log.topics()
    except LogUnavailable:
        print("unavailable")
"""


def test_unreachable_broker_is_quiet_on_stderr() -> None:
    url = f"kafka://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", _QUIET, url], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "unavailable"
    assert done.stderr == ""


# -- URLs ---------------------------------------------------------------------------------------


def test_url_options_reach_librdkafka(kafka_url: str, topic: str) -> None:
    with open_log(f"{kafka_url}?linger.ms=0&client.id=probe") as log:
        log.create_topic(topic, 1)
        assert log.append(topic, 0, [Record(b"a")]).offsets == [0]
    with pytest.raises(InvalidLogURL, match=r"no\.such\.option"):
        open_log(f"{kafka_url}?no.such.option=1")
    with pytest.raises(InvalidLogURL, match=r"enable\.idempotence"):
        open_log(f"{kafka_url}?enable.idempotence=false")
    with pytest.raises(InvalidLogURL):
        open_log("kafka://hostwithoutport")


# -- sequences in headers -----------------------------------------------------------------------


def test_sequence_headers_stored_but_not_read_back(kafka_url: str, topic: str) -> None:
    with open_log(kafka_url) as log:
        log.create_topic(topic, 1)
        log.append(topic, 0, [Record(b"a", headers=(("h", b"1"),))], producer="imp", sequences=[7])
        log.append(topic, 0, [Record(b"b")])
        assert [r.headers for r in log.read(topic, 0, 0)] == [(("h", b"1"),), ()]
        with pytest.raises(InvalidRecord, match="reserved"):
            log.append(topic, 0, [Record(b"c", headers=((SEQUENCE_HEADER, b"9"),))])
    assert raw_records(kafka_url, topic, 0) == [
        (0, [("h", b"1"), (PRODUCER_HEADER, b"imp"), (SEQUENCE_HEADER, b"7")]),
        (1, []),
    ]


def test_last_sequence_found_by_tail_scan_after_reopen(kafka_url: str, topic: str) -> None:
    with open_log(kafka_url) as log:
        log.create_topic(topic, 2)
        for n in range(5):
            batch = [Record(b"imp%d" % n), Record(b"x")]
            log.append(topic, 0, batch, producer="imp", sequences=[10 * n, 10 * n + 1])
            log.append(topic, 0, [Record(b"other")], producer="other", sequences=[n])
        log.append(topic, 1, [Record(b"p1")], producer="imp", sequences=[3])
        time.sleep(0.5)  # the hint is committed asynchronously
        hints = log.committed_offsets(HINT_GROUP_PREFIX + "imp", topic)
        assert hints == {0: 12, 1: 0}  # the first record of each partition's latest append
    with open_log(kafka_url) as log:  # a new object knows nothing: it reads the tails
        assert log.last_sequence(topic, 0, "imp") == 41
        assert log.last_sequence(topic, 0, "other") == 4
        assert log.last_sequence(topic, 1, "imp") == 3
        assert log.last_sequence(topic, 1, "nobody") is None
        result = log.append(
            topic, 0, [Record(b"old"), Record(b"new")], producer="imp", sequences=[41, 42]
        )
        assert result.offsets == [None, 15]


@pytest.mark.parametrize("hint", [1, 3, 1000])
def test_stale_hint_falls_back_to_a_full_scan(kafka_url: str, topic: str, hint: int) -> None:
    with open_log(kafka_url) as log:
        log.create_topic(topic, 1)
        log.append(topic, 0, [Record(b"a"), Record(b"b")], producer="imp", sequences=[1, 2])
        log.append(topic, 0, [Record(b"c"), Record(b"d")], producer="other", sequences=[1, 2])
        time.sleep(0.5)
        # points inside the producer's append, at another producer's record, or past the end
        log.commit_offsets(HINT_GROUP_PREFIX + "imp", topic, {0: hint})
    with open_log(kafka_url) as log:
        assert log.last_sequence(topic, 0, "imp") == 2


def test_threads_sharing_a_producer_name_are_serialised(kafka_url: str, topic: str) -> None:
    with open_log(kafka_url) as log:
        log.create_topic(topic, 1)

        def work(start: int) -> None:  # overlapping sequence ranges from 4 threads
            for sequence in range(start, 60, 3):
                log.append(
                    topic, 0, [Record(b"%d" % sequence)], producer="imp", sequences=[sequence]
                )

        threads = [threading.Thread(target=work, args=(start,)) for start in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stored = [int(r.value) for r in log.read(topic, 0, 0)]
        assert stored == sorted(set(stored))  # increasing: never a sequence twice
        assert log.last_sequence(topic, 0, "imp") == stored[-1] == 59


# -- Tansu's high watermark ---------------------------------------------------------------------


def test_end_offsets_despite_tansu_watermark(kafka_url: str, topic: str) -> None:
    with open_log(kafka_url) as log:
        log.create_topic(topic, 1)
        log.append(topic, 0, [Record(b"%d" % i) for i in range(4)])
        log.append(topic, 0, [Record(b"%d" % i) for i in range(4, 8)])
    # Tansu says base offset of the last batch + 1 (5); a Kafka broker would say 8
    assert watermark(kafka_url, topic, 0) in {5, 8}
    with open_log(kafka_url) as log:  # a fresh object: no end learned from its own appends
        assert log.end_offsets(topic) == {0: 8}
    with open_log(kafka_url) as log:
        started = time.monotonic()
        assert [r.offset for r in log.read(topic, 0, 6)] == [6, 7]
        assert log.read(topic, 0, 8) == []
        assert log.read(topic, 0, 9) == []
        assert [r.offset for r in log.read(topic, 0, 0)] == list(range(8))
        assert time.monotonic() - started < 2


def test_close_is_idempotent(kafka_url: str) -> None:
    log = open_log(kafka_url)
    log.close()
    log.close()


# -- reads that stop short ----------------------------------------------------------------------


def written_by_fenced_writers(log: KafkaLog, topic: str, partitions: int) -> list[list[int]]:
    """Each partition filled by transactional writers (a marker after each commit) and plain
    appends; the offsets of its records."""
    log.create_topic(topic, partitions)
    for partition in range(partitions):
        for round_ in range(6):
            writer = log.open_writer(topic, partition, f"w{round_ % 2}")
            for size in (1, 22, 3):
                writer.append([Record(b"%d-%d" % (round_, i)) for i in range(size)])
                writer.commit()
            writer.close()
            log.append(topic, partition, [Record(b"plain")] * (round_ + 1))
    found = []
    for partition in range(partitions):
        found.append([r.offset for r in raw_reads(log, topic, partition)])
    return found


def raw_reads(log: KafkaLog, topic: str, partition: int) -> list[Record]:
    """Every record by plain reads, retried until the partition's end: what is there."""
    end, offset, out = log.end_offset(topic, partition), 0, []
    deadline = time.monotonic() + 30
    while offset < end and time.monotonic() < deadline:
        batch = log.read(topic, partition, offset)
        out += batch
        offset = batch[-1].offset + 1 if batch else offset
        if not batch and out and out[-1].offset + 1 >= offset:
            break  # only markers left
    return out


def test_range_reads_get_every_record_when_fetches_stop_short(
    kafka_url: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reader of ranges reads each record once though half the fetches stop short."""
    from exactly.dedupe.recovery import newest_first
    from exactly.spark.datasource import source
    from exactly.spark.datasource.options import SourceOptions
    from exactly.spark.datasource.sink import last_mark
    from tests import short_reads

    with open_log(kafka_url) as log:
        assert isinstance(log, KafkaLog)
        expected = written_by_fenced_writers(log, topic, 3)
    monkeypatch.setattr(KafkaLog, "_fetch", KafkaLog._fetch)  # restored after the test
    monkeypatch.setattr(short_reads.Counts, "cut", 0)
    short_reads.install(0.5, seed=7)
    with open_log(kafka_url) as log:
        for partition, offsets in enumerate(expected):
            for max_records in (1, 5, 1000):
                chunks = log.read_range(topic, partition, 0, max_records=max_records)
                assert [r.offset for chunk in chunks for r in chunk] == offsets
            newest = [r.offset for r in newest_first(log, topic, partition)]
            assert newest == offsets[::-1]
            assert last_mark(log, topic, partition, "sink", 0) is None  # read to the end
    options = SourceOptions(log=kafka_url, topic=topic, arrow=False, read_records=7)
    for partition, offsets in enumerate(expected):
        task = source.OffsetRange(partition, 0, offsets[-1] + 1)
        assert [row[1] for row in source.read(options, task)] == offsets
    assert short_reads.Counts.cut > 50  # the fault fired


def test_a_range_read_that_gets_nowhere_fails(
    kafka_url: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exactly.errors import ShortRead
    from tests import short_reads

    with open_log(kafka_url) as log:
        log.create_topic(topic, 1)
        log.append(topic, 0, [Record(b"%d" % i) for i in range(5)])
    monkeypatch.setattr(KafkaLog, "_fetch", KafkaLog._fetch)
    short_reads.install(1.0)  # every fetch comes back short: the last record never comes
    with open_log(kafka_url) as log:
        started = time.monotonic()
        with pytest.raises(ShortRead, match=r"stopped at offset 4, short of 5"):
            list(log.read_range(topic, 0, 0, patience=0.5))
        assert 0.5 <= time.monotonic() - started < 5


class Stalled:
    """A consumer that delivers nothing, as librdkafka's reader did for 10 s and more on a loaded
    machine (126 s once, while the same process's other partitions were read)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer

    def poll(self, timeout: float) -> Any:
        time.sleep(timeout)
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


def test_a_read_that_hears_nothing_tries_a_new_consumer_before_it_fails(
    kafka_url: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_log(kafka_url) as log:
        log.create_topic(topic, 1)
        log.append(topic, 0, [Record(b"%d" % i) for i in range(5)])
    with open_log(kafka_url, timeout=2) as log:
        assert isinstance(log, KafkaLog)
        log.silent_tries = 3  # 12 by default: 24 s of silence at this timeout
        log.end_offsets(topic)  # the end known: the reads below are the reader's alone
        stalled = log._reader = Stalled(log._reader)
        started = time.monotonic()
        assert [r.value for r in log.read(topic, 0, 0)] == [b"%d" % i for i in range(5)]
        assert log._reader is not stalled and time.monotonic() - started >= 2
        made: list[Stalled] = []

        def silent(config: Any) -> Stalled:
            made.append(Stalled(Consumer(log._consumer_config(config))))
            return made[-1]

        monkeypatch.setattr(log, "_consumer", silent)
        log._reader = silent(READER)
        with pytest.raises(LogUnavailable, match="no answer"):
            log.read(topic, 0, 0)
        assert len(made) == 3  # the first, two new ones, then the error


# -- a transaction a killed writer left open ----------------------------------------------------

KILLED_WRITER = """
import os, sys
from exactly.log import Record, open_log
log = open_log(sys.argv[1])
writer = log.open_writer(sys.argv[2], 1, "sink-a")
writer.append([Record(b"open 1"), Record(b"open 2")])
writer._producer.flush(10)  # at the broker, in a transaction never committed
os.kill(os.getpid(), 9)
"""


def test_a_sink_restarting_ends_the_transaction_its_killed_run_left_open(
    kafka_url: str, topic: str
) -> None:
    from exactly.errors import ShortRead
    from exactly.spark.datasource.sink import end_open_writes

    with open_log(kafka_url) as log:
        log.create_topic(topic, 2)
        log.append(topic, 1, [Record(b"before")])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, kafka_url, topic], env=env)
    assert killed.returncode == -9
    with open_log(kafka_url, timeout=2) as log:
        log.append(topic, 1, [Record(b"after")])
        with pytest.raises((ShortRead, LogUnavailable)):  # Tansu never times it out
            list(log.read_range(topic, 1, 0, 4, patience=2))
        assert end_open_writes(log, topic, None) == 0  # a first run: no query id, nothing
        assert end_open_writes(log, topic, "sink-a") == 2
    with open_log(kafka_url) as log:
        started = time.monotonic()
        values = [r.value for chunk in log.read_range(topic, 1, 0) for r in chunk]
        assert time.monotonic() - started < 5
    # what the killed writer left stays visible on Tansu (the writer module's TANSU QUIRK)
    assert values == [b"before", b"open 1", b"open 2", b"after"]
