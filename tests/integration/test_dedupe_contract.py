"""The contract of every dedupe store (``exactly.dedupe.base``), run on each store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from exactly.dedupe.base import Claim, DedupeStore, Status
from exactly.errors import InvalidId
from exactly.events.ids import pack_id, pack_owner
from tests.conftest import redis_namespace
from tests.dedupe_stores import STORES, make_store, message_id

ROOT = Path(__file__).resolve().parents[2]
NEW, OWN, DUP = Status.NEW, Status.OWN, Status.DUPLICATE


@pytest.fixture(params=STORES)
def store_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def where(store_name: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if store_name == "redis":
        urls: list[str] = request.getfixturevalue("redis_servers")
        return f"{urls[0]},{urls[1]} {redis_namespace()}"
    return str(tmp_path / "store")


@pytest.fixture
def store(store_name: str, where: str) -> DedupeStore:
    return make_store(store_name, where)


def claim(text: str, partition: int, offset: int, at: int = 1_000) -> Claim:
    return Claim(pack_id(text), pack_owner(partition, offset), at)


Statuses = Callable[..., list[Status]]


def statuses(store: DedupeStore, partition: int, *claims: Claim) -> list[Status]:
    with store.open(partition) as part:
        return [verdict.status for verdict in part.claim(list(claims))]


def test_new_then_own_retry_then_duplicate(store: DedupeStore) -> None:
    assert statuses(store, 0, claim("a", 0, 5)) == [NEW]
    assert statuses(store, 0, claim("a", 0, 5)) == [OWN]  # a retried task claims again
    with store.open(0) as part:
        [verdict] = part.claim([claim("a", 0, 9)])
    assert verdict.status is DUP and verdict.owner == pack_owner(0, 5) and not verdict.passes
    assert verdict.describe() == "duplicate of 0:5"


def test_the_first_of_a_batch_wins_and_order_is_kept(store: DedupeStore) -> None:
    got = statuses(store, 1, claim("a", 1, 0), claim("b", 1, 1), claim("a", 1, 2), claim("c", 1, 3))
    assert got == [NEW, NEW, DUP, NEW]
    with store.open(1) as part:
        verdicts = part.claim([claim("a", 1, 0), claim("a", 1, 2), claim("b", 1, 7)])
    assert [v.status for v in verdicts] == [OWN, DUP, DUP]
    assert {v.owner for v in verdicts[1:]} == {pack_owner(1, 0), pack_owner(1, 1)}


def test_partitions_are_independent(store: DedupeStore) -> None:
    assert statuses(store, 0, claim("a", 0, 0)) == [NEW]
    assert statuses(store, 2, claim("a", 2, 0)) == [NEW]


def test_claims_survive_reopening(store: DedupeStore, store_name: str, where: str) -> None:
    statuses(store, 0, *(claim(f"id-{n}", 0, n) for n in range(1000)))
    again = make_store(store_name, where)
    got = statuses(again, 0, *(claim(f"id-{n}", 0, n + 1000) for n in range(0, 1000, 7)))
    assert set(got) == {DUP}


def test_position_is_one_past_the_highest_claimed_offset(store: DedupeStore) -> None:
    with store.open(0) as part:
        assert part.position() is None
        part.claim([claim("a", 0, 10), claim("b", 0, 11)])
        assert part.position() == 12
        part.claim([claim("a", 0, 10)])  # a replay does not move it back
        assert part.position() == 12
    with store.open(0) as part:
        assert part.position() == 12


def test_restore_records_owners_without_counting_and_keeps_existing(store: DedupeStore) -> None:
    with store.open(0) as part:
        part.claim([claim("a", 0, 1)])
        part.restore([claim("a", 0, 2), claim("b", 0, 3)])
        assert part.position() == 4
        verdicts = part.claim([claim("a", 0, 2), claim("b", 0, 3), claim("b", 0, 4)])
        assert [v.status for v in verdicts] == [DUP, OWN, DUP]
        assert verdicts[0].owner == pack_owner(0, 1)
        counters = part.stats().counters
    assert (counters.claimed, counters.new, counters.duplicates) == (2, 1, 1)


def test_counters_count_each_offset_once(store: DedupeStore) -> None:
    batch = [claim("a", 0, 0), claim("b", 0, 1), claim("a", 0, 2)]
    with store.open(0) as part:
        part.claim(batch)
        part.claim(batch)  # a replay of the same micro-batch
        part.claim([claim("c", 0, 3)])
        stats = part.stats()
    assert (stats.counters.claimed, stats.counters.new, stats.counters.duplicates) == (4, 3, 1)
    assert stats.keys == 3 and stats.position == 4
    assert stats.oldest is not None and stats.newest is not None
    assert stats.window(now=10_000) is None  # nothing aged out: unbounded so far


@pytest.mark.parametrize(
    "bad",
    [
        Claim(b"short", pack_owner(0, 1), 0),
        Claim(pack_id("a"), b"\x00\x00\x01", 0),
        Claim(pack_id("a"), pack_owner(1, 1), 0),  # a record of another partition
    ],
)
def test_malformed_claims_are_refused_and_nothing_is_stored(store: DedupeStore, bad: Claim) -> None:
    with store.open(0) as part:
        with pytest.raises(InvalidId):
            part.claim([claim("ok", 0, 0), bad])
        assert part.position() is None
        assert [v.status for v in part.claim([claim("ok", 0, 0)])] == [NEW]


def test_an_empty_claim_is_a_no_op(store: DedupeStore) -> None:
    with store.open(0) as part:
        assert part.claim([]) == []
        assert part.position() is None


def test_concurrent_openers_never_grant_an_id_twice(store: DedupeStore) -> None:
    ids = [f"race-{n}" for n in range(300)]
    results: list[list[Status]] = []

    def contender(first_offset: int) -> None:
        mine = [claim(text, 0, first_offset + n) for n, text in enumerate(ids)]
        with store.open(0) as part:
            results.append([v.status for v in part.claim(mine)])

    threads = [threading.Thread(target=contender, args=(k * 1000,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    per_id = [Counter(result[n] for result in results) for n in range(len(ids))]
    assert all(counts == {NEW: 1, DUP: 2} for counts in per_id)


@pytest.mark.slow
def test_acknowledged_claims_survive_sigkill(
    store: DedupeStore, store_name: str, where: str
) -> None:
    acked = -1
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.dedupe_stores", store_name, where, "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(5):
            line = proc.stdout.readline()
            acked = max(acked, int(line))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    with store.open(0) as part:
        position = part.position()
        assert position is not None and position > acked
        offsets = range(acked + 1)  # every acknowledged claim, each found as its own
        verdicts = part.claim([claim(message_id(o), 0, o) for o in offsets])
    assert {v.status for v in verdicts} == {OWN}
