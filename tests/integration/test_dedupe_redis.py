"""What only the redis store does: resharding by epochs, a flushed shard, an unreachable server,
a lost lock; on the store, and through the Spark job."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from exactly.dedupe.base import Claim, Status
from exactly.dedupe.job import DedupePlan, prepare, run
from exactly.dedupe.redis import RedisStore
from exactly.dedupe.redis.sharding import Epoch, Sharding
from exactly.dedupe.window import Bounds
from exactly.errors import StoreUnavailable
from exactly.events.ids import pack_id, pack_owner
from exactly.log import Log, Record, open_log
from tests.conftest import redis_namespace
from tests.dedupe_stores import hosts, redis_store_url
from tests.dedupe_stream import RAW, Stream, actual_events, assert_deduplicated

HOUR = 3_600_000
PARTITIONS = 2


def claims(prefix: str, offsets: range, at: int) -> list[Claim]:
    return [Claim(pack_id(f"{prefix}-{o % 500}"), pack_owner(0, o), at + o) for o in offsets]


def keys_in(url: str, namespace: str) -> int:
    return sum(1 for _ in redis.Redis.from_url(url).scan_iter(f"{namespace}:*", count=1000))


def test_resharding_from_two_to_three_shards_keeps_every_id_findable(
    redis_servers: list[str],
) -> None:
    namespace, old, new = redis_namespace(), redis_servers[:2], redis_servers
    cutover = 10 * HOUR
    before = RedisStore(Sharding(Epoch(tuple(old), buckets=16, slot_ms=HOUR)), namespace)
    with before.open(0) as part:
        first = part.claim(claims("id", range(500), cutover - HOUR))
    assert {v.status for v in first} == {Status.NEW}
    assert keys_in(new[2], namespace) == 0
    sharding = Sharding(
        Epoch(tuple(new), buckets=16, slot_ms=HOUR), Epoch(tuple(old), 16, HOUR), cutover
    )
    after = RedisStore(sharding, namespace)
    with after.open(0) as part:
        assert part.position() == 500
        again = part.claim(claims("id", range(500, 1000), cutover))  # each id again
        fresh = part.claim(claims("new", range(1000, 1500), cutover + HOUR))
        assert part.position() == 1500
    assert {v.status for v in again} == {Status.DUPLICATE}
    assert [v.owner for v in again] == [pack_owner(0, o) for o in range(500)]
    assert {v.status for v in fresh} == {Status.NEW}
    assert keys_in(new[2], namespace) > 0  # the new shard takes its share after the cutover
    stats = after.stats(1)[0]
    assert stats.keys == 1000 and stats.counters.duplicates == 500 and stats.bytes > 0


def test_a_flushed_shard_shows_no_position(redis_servers: list[str]) -> None:
    namespace, urls = redis_namespace(), redis_servers[1:3]
    store = RedisStore(Sharding(Epoch(tuple(urls))), namespace)
    with store.open(0) as part:
        part.claim(claims("id", range(100), HOUR))
        assert part.position() == 100
    redis.Redis.from_url(urls[1]).flushall()
    with store.open(0) as part:
        assert part.position() is None  # so the job rebuilds it from events


def test_a_shard_flushed_while_a_task_holds_it_fails_the_claim(redis_servers: list[str]) -> None:
    namespace, urls = redis_namespace(), redis_servers[1:3]
    store = RedisStore(Sharding(Epoch(tuple(urls))), namespace)
    with store.open(0) as part:
        part.claim(claims("id", range(100), HOUR))
        redis.Redis.from_url(urls[1]).flushall()
        with pytest.raises(StoreUnavailable, match="lost claims"):
            part.claim(claims("id", range(100, 200), HOUR))


def test_an_unreachable_server_fails_the_claim_and_passes_nothing(
    redis_servers: list[str],
) -> None:
    from tests.servers import RedisServer

    with RedisServer() as server:
        store = RedisStore(Sharding(Epoch((redis_servers[0], server.url))), redis_namespace())
        with store.open(0) as part:
            part.claim(claims("id", range(10), HOUR))
            server.stop()
            with pytest.raises(StoreUnavailable, match="redis dedupe store at"):
                part.claim(claims("id", range(10, 20), HOUR))


def test_a_holder_whose_lock_lapsed_is_refused(redis_servers: list[str]) -> None:
    namespace = redis_namespace()
    store = RedisStore(Sharding(Epoch((redis_servers[0],))), namespace, lock_ttl=1)
    part = store.open(0)
    lease = part._lease
    assert lease is not None
    lease._stop.set()  # as if the holder's process stalled: no renewal
    time.sleep(1.2)
    with store.open(0) as other:
        other.claim(claims("id", range(10), HOUR))
        with pytest.raises(StoreUnavailable, match="lock was lost"):
            part.claim(claims("id", range(10, 20), HOUR))
    part.close()


def test_ids_are_found_in_earlier_slots_until_their_slot_ages_out(redis_servers: list[str]) -> None:
    """Slots of 500 ms and a window of 100 ms: a bucket lives about a second past its slot."""
    namespace, url = redis_namespace(), redis_servers[0]
    epoch = Epoch((url,), buckets=4, slot_ms=500)
    store = RedisStore(Sharding(epoch), namespace, Bounds(window=100))
    start = 1_000 * 500  # the start of slot 1000
    with store.open(0) as part:
        first = part.claim([Claim(pack_id(f"s-{n}"), pack_owner(0, n), start) for n in range(40)])
        assert {v.status for v in first} == {Status.NEW}
        later = [Claim(pack_id(f"s-{n}"), pack_owner(0, 40 + n), start + 550) for n in range(40)]
        assert {v.status for v in part.claim(later)} == {Status.DUPLICATE}  # the next slot
        time.sleep(1.6)  # slot 1000's buckets and meta entry expire
        again = [Claim(pack_id(f"s-{n}"), pack_owner(0, 80 + n), start + 900) for n in range(40)]
        assert {v.status for v in part.claim(again)} == {Status.NEW}
        stats = part.stats()
    assert stats.aged_out == 40 and stats.counters.duplicates == 40 and stats.keys == 40


def test_a_claim_speaks_resp2_as_well_as_resp3(
    redis_servers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replies are parsed straight from the socket: a hash is an array in RESP2, a map in RESP3."""
    import exactly.dedupe.redis.partition as partition_module

    monkeypatch.setattr(
        partition_module, "connect", lambda url, timeout: redis.Redis.from_url(url, protocol=2)
    )
    store = RedisStore(Sharding(Epoch((redis_servers[0],))), redis_namespace())
    with store.open(0) as part:
        part.claim(claims("id", range(500), HOUR))
        verdicts = part.claim(claims("id", range(500, 1000), HOUR))
        assert {v.status for v in verdicts} == {Status.DUPLICATE}
        assert part.position() == 1000


def test_a_meta_written_by_another_holder_during_a_claim_writes_nothing(
    redis_servers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The WATCH: another holder's write between the reads and the EXEC fails the claim."""
    from exactly.dedupe.redis import transaction

    namespace, url = redis_namespace(), redis_servers[0]
    store = RedisStore(Sharding(Epoch((url,))), namespace)
    lookup = transaction._lookup

    def lookup_then_intrude(*args: object) -> object:
        redis.Redis.from_url(url).hset(f"{namespace}:0:meta", "newest", 1)
        return lookup(*args)  # type: ignore[arg-type]

    with store.open(0) as part:
        part.claim(claims("id", range(10), HOUR))
        monkeypatch.setattr(transaction, "_lookup", lookup_then_intrude)
        with pytest.raises(StoreUnavailable, match="meta changed during the claim"):
            part.claim(claims("id", range(10, 20), HOUR))
        monkeypatch.undo()
        retried = part.claim(claims("id", range(10, 20), HOUR))
        assert {v.status for v in retried} == {Status.NEW}  # not OWN: nothing was written
        assert part.position() == 20


# -- through the Spark job ------------------------------------------------------------------------


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    with open_log(f"sqlite://{tmp_path / 'log'}") as opened:
        opened.create_topic(RAW, PARTITIONS)
        yield opened


def plan_for(log: Log, tmp_path: Path, store: str) -> DedupePlan:
    return DedupePlan(
        log.url,
        store,
        tmp_path,
        tmp_path / "checkpoint",
        bounds=Bounds(window=HOUR),
        until_caught_up=True,
        max_records_per_trigger=700,
        read_records=200,
    )


@pytest.mark.spark
@pytest.mark.slow
def test_the_job_resharded_mid_stream_passes_no_duplicate(
    spark: object, log: Log, tmp_path: Path, redis_servers: list[str]
) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    namespace = redis_namespace()
    stream = Stream(PARTITIONS, seed=21, duplicate_rate=0.05)
    plan = plan_for(log, tmp_path, redis_store_url(redis_servers[:2], namespace, buckets=8))
    partitions = prepare(log, plan)
    stream.append(log, 1_000)
    run(spark, plan, partitions)
    cutover = int(time.time() * 1000) + 1
    time.sleep(0.01)
    three = redis_store_url(
        redis_servers, namespace, buckets=8, previous=hosts(redis_servers[:2]), cutover=cutover
    )
    stream.append(log, 1_000)  # duplicates of ids before and after the cutover
    run(spark, plan_for(log, tmp_path, three), partitions)
    assert stream.kinds.get("duplicate earlier", 0) >= 5
    assert_deduplicated(log, PARTITIONS)
    assert keys_in(redis_servers[2], namespace) > 0


@pytest.mark.spark
@pytest.mark.slow
def test_a_flushed_redis_is_rebuilt_from_events_before_the_job_resumes(
    spark: object, log: Log, tmp_path: Path, redis_servers: list[str]
) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    stream = Stream(PARTITIONS, seed=23)
    stream.append(log, 800)
    plan = plan_for(log, tmp_path, redis_store_url(redis_servers[1:3], redis_namespace()))
    partitions = prepare(log, plan)
    run(spark, plan, partitions)
    store = plan.open_store()
    assert isinstance(store, RedisStore)
    kept = store.stats(PARTITIONS)[0].keys
    for url in redis_servers[1:3]:
        redis.Redis.from_url(url).flushall()
    assert store.stats(PARTITIONS)[0].position is None
    # every id of partition 0 again, with new payloads: all within the window, all duplicates
    again = [
        Record(json.dumps({"messageId": k.decode(), "again": True}).encode(), key=k)
        for k, _, _ in actual_events(log, 0)
    ]
    log.append(RAW, 0, again)
    run(spark, plan, partitions)
    assert_deduplicated(log, PARTITIONS)
    assert store.stats(PARTITIONS)[0].keys == kept
