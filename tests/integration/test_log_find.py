"""The sqlite log's lookup by key (``Log.find``): the index ``records_by_key`` across buckets."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from exactly.log import Record, open_log


def test_find_returns_every_record_of_a_key_across_buckets_in_its_partition(
    tmp_path: Path,
) -> None:
    with open_log(f"sqlite://{tmp_path}") as log:
        log.create_topic("raw", 2)
        for start in range(0, 3_000, 500):  # six appends, 3,000 offsets: six buckets of 512
            keys = [b"hot" if n % 700 == 0 else b"k%d" % n for n in range(start, start + 500)]
            log.append("raw", 1, [Record(b"v%d" % n, key) for n, key in enumerate(keys, start)])
        log.append("raw", 0, [Record(b"other", b"hot")])
        log.append("raw", 1, [Record(b"no key")])
        found = log.find("raw", 1, b"hot")
        assert found is not None
        assert [r.offset for r in found] == [0, 700, 1400, 2100, 2800]
        assert [r.value for r in found] == [b"v0", b"v700", b"v1400", b"v2100", b"v2800"]
        assert log.find("raw", 1, b"k2999") is not None
        assert [r.offset for r in log.find("raw", 1, b"k2999") or []] == [2999]
        assert log.find("raw", 1, b"absent") == []
        assert [r.value for r in log.find("raw", 0, b"hot") or []] == [b"other"]
        assert log.indexed("raw")  # type: ignore[attr-defined]


def test_a_topic_without_the_index_is_searched_and_gets_it_when_opened_for_writing(
    tmp_path: Path,
) -> None:
    with open_log(f"sqlite://{tmp_path}") as log:
        log.create_topic("raw", 1)
        log.append("raw", 0, [Record(b"a", b"m-1"), Record(b"b", b"m-2"), Record(b"c", b"m-1")])
    conn = sqlite3.connect(tmp_path / "raw.sqlite")
    conn.execute("DROP INDEX records_by_key")  # as a topic created before the index existed
    conn.close()
    with open_log(f"sqlite://{tmp_path}") as log:
        assert not log.indexed("raw")  # type: ignore[attr-defined]
        assert [r.offset for r in log.find("raw", 0, b"m-1") or []] == [0, 2]
        log.create_topic("raw", 1, exist_ok=True)  # what the collector does at start
        assert log.indexed("raw")  # type: ignore[attr-defined]
        assert [r.offset for r in log.find("raw", 0, b"m-1") or []] == [0, 2]
