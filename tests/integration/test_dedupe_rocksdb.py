"""What only the rocksdb store does: age-out by size and time in generations, its file lock."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from exactly.dedupe.base import Claim, Status
from exactly.dedupe.rocksdb import META_KEY, Meta, RocksDBStore, RocksPartition
from exactly.dedupe.window import Bounds, Generation
from exactly.errors import StoreUnavailable
from exactly.events.ids import pack_id, pack_owner

ROOT = Path(__file__).resolve().parents[2]


def batch(first: int, count: int, at: int, partition: int = 0) -> list[Claim]:
    return [
        Claim(pack_id(f"id-{o}"), pack_owner(partition, o), at) for o in range(first, first + count)
    ]


def meta(part: RocksPartition) -> Meta:
    return Meta.unpack(part._db.get(META_KEY))


def test_size_bound_ages_out_oldest_first_and_the_window_shrinks(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path, Bounds(max_keys=2_000))
    windows = []
    with store.open(0) as part:
        for n in range(12):
            part.claim(batch(n * 500, 500, at=n * 1_000))
            stats = part.stats()
            assert stats.keys <= 2_000
            windows.append(stats.window(now=n * 1_000))
        assert windows[:4] == [None] * 4  # nothing aged out yet: unbounded
        assert all(w is not None and w <= 4_000 for w in windows[4:])
        assert stats.aged_out == 6_000 - 2_000 and stats.keys == 2_000
        # the oldest 4000 ids are gone: their duplicates pass, the kept ones' do not
        verdicts = part.claim(
            [
                Claim(pack_id("id-3999"), pack_owner(0, 6_000), 12_000),
                Claim(pack_id("id-5999"), pack_owner(0, 6_001), 12_000),
            ]
        )
    assert [v.status for v in verdicts] == [Status.NEW, Status.DUPLICATE]


def test_a_faster_stream_shortens_the_window(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path, Bounds(max_keys=1_000))
    with store.open(0) as part:
        for n in range(15):  # 100 ids a second
            part.claim(batch(n * 100, 100, at=n * 1_000))
        slow = part.stats().window(now=15_000)
        for n in range(15, 20):  # 500 ids a second
            part.claim(batch(1_500 + (n - 15) * 500, 500, at=n * 1_000))
        fast = part.stats().window(now=20_000)
    assert slow is not None and fast is not None and fast < slow


def test_time_window_ages_out_ids_received_before_it(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path, Bounds(window=5_000))
    with store.open(0) as part:
        for n in range(10):
            part.claim(batch(n * 100, 100, at=n * 1_000))
        stats = part.stats()
        assert stats.oldest is not None and stats.oldest >= 9_000 - 5_000 - 1_000
        assert 500 <= stats.keys <= 700
        old, recent = "id-0", "id-899"
        verdicts = part.claim(
            [
                Claim(pack_id(old), pack_owner(0, 1_000), 9_500),
                Claim(pack_id(recent), pack_owner(0, 1_001), 9_500),
            ]
        )
    assert [v.status for v in verdicts] == [Status.NEW, Status.DUPLICATE]


def test_whole_generations_age_out_oldest_first_and_their_families_go(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path, Bounds(max_keys=800))  # a generation holds 100 ids
    with store.open(0) as part:
        for n in range(12):  # call n fills generation n
            part.claim(batch(n * 100, 100, at=n))
        state = meta(part)
        verdicts = part.claim(  # starts generation 12, and drops generation 4 to make room
            [
                Claim(pack_id("id-399"), pack_owner(0, 1_200), 12),  # in generation 3: gone
                Claim(pack_id("id-500"), pack_owner(0, 1_201), 12),  # in generation 5: kept
            ]
        )
    assert [g.number for g in state.generations] == list(range(4, 12))
    assert state.keys == 800 and state.aged_out == 400
    assert [v.status for v in verdicts] == [Status.NEW, Status.DUPLICATE]
    families = sorted(Rdict.list_cf(str(store.path(0))))
    assert families == ["default", *(f"g{n:08d}" for n in range(5, 13))]


def test_a_call_larger_than_a_generation_fills_several(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path, Bounds(max_keys=800))
    with store.open(0) as part:
        part.claim(batch(0, 30, at=1))
        part.claim(batch(30, 420, at=2))
        state = meta(part)
    assert [(g.number, g.keys) for g in state.generations] == [
        (0, 100),
        (1, 100),
        (2, 100),
        (3, 100),
        (4, 50),
    ]
    assert [(g.earliest, g.newest) for g in state.generations][:2] == [(1, 2), (2, 2)]


def test_a_family_left_by_a_crash_before_its_drop_goes_at_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RocksDBStore(tmp_path, Bounds(max_keys=16))  # a generation holds 2 ids
    with monkeypatch.context() as patch:
        patch.setattr(RocksPartition, "_drop", lambda self, name: None)  # killed before step 5
        with store.open(0) as part:
            for n in range(10):
                part.claim(batch(n * 2, 2, at=n))
    assert "g00000000" in Rdict.list_cf(str(store.path(0)))
    with store.open(0) as part:
        assert [g.number for g in meta(part).generations] == list(range(2, 10))
        # below the position: ages nothing out; generation 9 is full, so it starts generation 10
        assert part.claim(batch(0, 1, at=4))[0].status is Status.NEW
    kept = sorted(Rdict.list_cf(str(store.path(0))))
    assert kept == ["default", *(f"g{n:08d}" for n in range(2, 11))]


def test_a_partition_in_the_earlier_layout_is_converted(tmp_path: Path) -> None:
    """Ids in ``default`` with a ``seq`` index by age (before generations) become generation 0."""
    path = RocksDBStore(tmp_path).path(0)
    ids = [pack_id(f"id-{o}") for o in range(300)]
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    db = Rdict(str(path), options, column_families={"seq": Options(raw_mode=True)})
    seq = db.get_column_family("seq")
    for offset, packed in enumerate(ids):
        db[packed] = offset.to_bytes(6, "big")
    seq[(0).to_bytes(8, "big")] = (1_000).to_bytes(8, "big") + b"".join(ids[:100])  # aged out
    seq[(1).to_bytes(8, "big")] = (2_000).to_bytes(8, "big") + b"".join(ids[100:])
    # position 300, 300 keys, 0 aged out, seek hint 1, next seq 2, newest 3000, counters
    db[META_KEY] = struct.pack(">10q", 300, 300, 0, 1, 2, 3_000, 300, 300, 0, 0)
    seq.close()
    db.close()
    [before] = RocksDBStore(tmp_path).stats(1)
    assert (before.keys, before.position, before.oldest) == (300, 300, 2_000)
    with RocksDBStore(tmp_path).open(0) as part:
        state = meta(part)
        verdicts = part.claim(
            [
                Claim(ids[5], pack_owner(0, 300), 3_000),
                Claim(pack_id("new"), pack_owner(0, 301), 3_000),
            ]
        )
        stats = part.stats()
    assert state.generations == (Generation(0, 300, 2_000, 3_000),)
    assert [v.status for v in verdicts] == [Status.DUPLICATE, Status.NEW]
    assert verdicts[0].owner == pack_owner(0, 5)
    assert (stats.keys, stats.position, stats.counters.claimed) == (301, 302, 302)
    assert sorted(Rdict.list_cf(str(path))) == ["default", "g00000000"]
    with RocksDBStore(tmp_path).open(0) as part:  # reopened: nothing converted twice
        assert meta(part).keys == 301
        assert list(part.db.keys()) == [META_KEY]


def test_a_replayed_batch_ages_nothing_out(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path, Bounds(max_keys=1_000))
    with store.open(0) as part:
        for n in range(3):
            part.claim(batch(n * 500, 500, at=n))
        before = meta(part)
        again = part.claim(batch(1_000, 500, at=2))  # the last batch again (a retried task)
        assert {v.status for v in again} == {Status.OWN}
        assert meta(part) == before


def test_bytes_bound_holds_the_store_near_it(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path, Bounds(max_bytes=400_000))
    with store.open(0) as part:
        for n in range(40):
            part.claim(batch(n * 2_000, 2_000, at=n))
        stats = part.stats()
    assert stats.aged_out > 0
    assert stats.keys < 80_000 - stats.aged_out + 1


def test_a_held_partition_times_out_with_a_clear_error_and_stats_still_work(
    tmp_path: Path,
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from exactly.dedupe.rocksdb import RocksDBStore\n"
            "from exactly.dedupe.base import Claim\n"
            "from exactly.events.ids import pack_id, pack_owner\n"
            f"part = RocksDBStore({str(tmp_path)!r}).open(0)\n"
            "part.claim([Claim(pack_id('a'), pack_owner(0, 0), 1)])\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreUnavailable, match="held by another process"):
            RocksDBStore(tmp_path, lock_timeout=0.3).open(0)
        [stats] = RocksDBStore(tmp_path).stats(1)
        assert stats.keys == 1 and stats.position == 1
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with RocksDBStore(tmp_path, lock_timeout=5).open(0) as part:  # released at exit
        assert part.position() == 1


def test_drop_deletes_a_partition(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path)
    with store.open(0) as part:
        part.claim(batch(0, 10, at=1))
    store.drop(0)
    with store.open(0) as part:
        assert part.position() is None


def test_stats_read_again_when_a_compaction_removes_a_file_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status after each batch reads a running job's store: a vanished file is retried."""
    import exactly.dedupe.rocksdb as rocksdb

    store = RocksDBStore(tmp_path)
    with store.open(0) as part:
        part.claim(batch(0, 100, at=1_000))
    real = rocksdb._open_db
    failures = iter([True, True])

    def racing(path: Path, access: object = None) -> object:
        if next(failures, False):
            raise Exception("Corruption: IO error: No such file or directory: 000018.sst")
        return real(path, access)  # type: ignore[arg-type]

    monkeypatch.setattr(rocksdb, "_open_db", racing)
    assert store.stats(1)[0].keys == 100
    monkeypatch.setattr(rocksdb, "_open_db", lambda *_: racing_forever())
    with pytest.raises(StoreUnavailable, match="while its job writes it"):
        store.stats(1)


def racing_forever() -> object:
    raise Exception("Corruption: IO error: No such file or directory")
