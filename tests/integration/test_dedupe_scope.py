"""Dedupe scopes without Spark: each store and checkpoint keeps the scope it was built with, and
a store rebuilt from ``events`` packs ids per source as the task does (issue 17 item 4)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from exactly.dedupe.base import Claim, write_once
from exactly.dedupe.job import STORES, DedupePlan, prepare, store_kind
from exactly.dedupe.recovery import source_offset
from exactly.dedupe.redis import RedisStore, connect
from exactly.dedupe.rocksdb import RocksDBStore
from exactly.dedupe.task import TaskPlan, dedupe_partition
from exactly.errors import ConfigError
from exactly.events.ids import pack_id, pack_owner
from exactly.log import Log, Record, open_log
from exactly.spark.datasource.source import to_arrow
from tests.conftest import redis_namespace
from tests.dedupe_stores import STORES as CLAIM_STORES
from tests.dedupe_stores import make_store


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    with open_log(f"sqlite://{tmp_path / 'log'}") as opened:
        opened.create_topic("raw", 2)
        yield opened


def plan_for(log: Log, tmp_path: Path, store: str, scope: str) -> DedupePlan:
    checkpoint = tmp_path / f"checkpoint-{store_kind(store)}"
    return DedupePlan(log.url, store, tmp_path, checkpoint, scope=scope)


@pytest.mark.parametrize("store", STORES)
def test_a_store_keeps_its_scope_and_refuses_another_at_start(
    log: Log, tmp_path: Path, store: str, dedupe_store: str
) -> None:
    assert prepare(log, plan_for(log, tmp_path, dedupe_store, "source")) == 2
    assert prepare(log, plan_for(log, tmp_path, dedupe_store, "source")) == 2  # again: the same
    with pytest.raises(ConfigError) as refused:
        prepare(log, plan_for(log, tmp_path, dedupe_store, "workspace"))
    message = str(refused.value)
    assert "'source', not 'workspace'" in message and "EXACTLY_DEDUPE__SCOPE=source" in message
    assert "\n" not in message


@pytest.mark.parametrize("store", STORES)
def test_a_store_built_before_scopes_is_workspace_wide(
    log: Log, tmp_path: Path, store: str, dedupe_store: str
) -> None:
    plan = plan_for(log, tmp_path, dedupe_store, "source")
    if plan.mode == "spark-state":  # a checkpoint with a planned batch and no scope file
        (plan.checkpoint / "offsets").mkdir(parents=True)
        (plan.checkpoint / "offsets" / "0").write_text("v1\n")
    else:
        opened = plan.open_store()
        opened.scope = None  # written as before scopes existed
        with opened.open(1) as part:
            part.claim([Claim(pack_id("m"), pack_owner(1, 0), 1_000)])
    with pytest.raises(ConfigError, match="scope 'workspace', not 'source'"):
        prepare(log, plan)
    prepare(log, plan_for(log, tmp_path, dedupe_store, "workspace"))


def test_a_bad_scope_is_refused_before_anything(log: Log, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dedupe scope 'tenant': use one of source, workspace"):
        prepare(log, plan_for(log, tmp_path, "rocksdb", "tenant"))


def value(source: str | None, message_id: str, n: int) -> bytes:
    event: dict[str, object] = {"messageId": message_id, "n": n}
    if source is not None:
        event["sourceId"] = source
    return orjson.dumps(event) if n % 2 else json.dumps(event).encode()


def run_batch(log: Log, plan: TaskPlan, start: int, end: int) -> None:
    """One micro-batch of partition 0 through the task; its rows appended to the output."""
    records = log.read(plan.source, 0, start, max_records=end - start)
    rows = []
    for out in dedupe_partition(plan, iter([to_arrow(records)])):
        for row in out.to_pylist():
            headers = tuple((h["key"], h["value"]) for h in row["headers"])
            rows.append(Record(row["value"], row["key"], headers))
    if rows:
        log.append(plan.output, 0, rows)


@pytest.mark.parametrize("store", CLAIM_STORES)
def test_a_lost_store_is_rebuilt_per_source_from_the_output(
    log: Log, tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    log.create_topic("events", 2)
    log.create_topic("raw.rejected", 2)

    def where(n: int) -> str:
        if store == "redis":
            urls: list[str] = request.getfixturevalue("redis_servers")
            return f"{urls[0]} {redis_namespace()}"
        return str(tmp_path / f"store-{n}")

    sources = ["web", "ios", None]
    first = [Record(value(s, f"m{n}", n), key=f"m{n}".encode()) for n in range(4) for s in sources]
    log.append("raw", 0, first)
    plan = TaskPlan(log.url, "raw", "events", "raw.rejected", make_store(store, where(0)))
    run_batch(log, plan, 0, 12)
    assert len(log.read("events", 0, 0, max_records=100)) == 12  # one per (source, messageId)
    # the store is lost (a new, empty one): it is rebuilt from events before deciding
    plan = TaskPlan(log.url, "raw", "events", "raw.rejected", make_store(store, where(1)))
    again = [
        Record(value(s, f"m{n}", 100 + n), key=f"m{n}".encode()) for n in range(4) for s in sources
    ]
    log.append("raw", 0, [*again, Record(value("android", "m0", 200), key=b"m0")])
    run_batch(log, plan, 12, 25)
    passed = [source_offset(r.headers) for r in log.read("events", 0, 0, max_records=100)]
    assert passed == [*range(12), 24]  # retries dropped; the new source's m0 passes


def test_redis_refuses_a_scope_when_one_shard_recorded_another(
    redis_servers: list[str],
) -> None:
    from exactly.dedupe.redis.sharding import sharding_from

    namespace = redis_namespace()
    store = RedisStore(sharding_from(redis_servers[:2]), namespace)
    connect(redis_servers[1]).set(f"{namespace}:scope", "workspace")
    with pytest.raises(ConfigError, match="scope 'workspace', not 'source'"):
        store.adopt_scope("source", 2)


def test_rocksdb_records_its_scope_in_a_file(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path / "store")
    store.adopt_scope("workspace", 2)
    assert (tmp_path / "store" / "scope").read_text() == "workspace\n"


def test_the_first_scope_recorded_wins(tmp_path: Path) -> None:
    path = tmp_path / "scope"
    assert write_once(path, "source") == "source"
    assert write_once(path, "workspace") == "source"  # a concurrent start with another scope
    assert [p.name for p in tmp_path.iterdir()] == ["scope"]


def test_a_redis_shard_restarted_empty_takes_the_scope_and_dedupe_goes_on(
    log: Log, tmp_path: Path, redis_servers: list[str]
) -> None:
    """A shard that lost its data while the job ran: the job rebuilds it with its scope, and
    the next start neither refuses nor asks for a setting (issue 30, defect 2)."""
    from tests.dedupe_stores import redis_store_url
    from tests.servers import RedisServer

    namespace = redis_namespace()
    scope_key = f"{namespace}:scope"
    with RedisServer() as lost:
        url = redis_store_url([redis_servers[0], lost.url], namespace)
        plan = DedupePlan(log.url, url, tmp_path, tmp_path / "checkpoint", scope="source")
        assert prepare(log, plan) == 2
        task = TaskPlan(log.url, "raw", "events", "raw.rejected", plan.open_store(), scope="source")
        ids = [f"m{n}" for n in range(40)]
        log.append(
            "raw", 0, [Record(value("web", m, n), key=m.encode()) for n, m in enumerate(ids)]
        )
        run_batch(log, task, 0, 40)
        for round_, writer_scope in enumerate(["source", None]):  # None: a job before scopes
            lost.restart()  # SIGKILL; back empty, without the scope, while the job runs
            assert connect(lost.url).get(scope_key) is None
            task.store.scope = writer_scope
            start = log.end_offset("raw", 0)
            retries = [Record(value("web", m, 100 + n), key=m.encode()) for n, m in enumerate(ids)]
            fresh = [Record(value("web", f"r{round_}", 1), key=b"r%d" % round_)]
            log.append("raw", 0, [*retries, *fresh])
            run_batch(log, task, start, start + 41)  # the shard is rebuilt from events first
            assert (connect(lost.url).get(scope_key) == b"source") == (writer_scope is not None)
            assert prepare(log, plan) == 2  # no refusal: the other shard says 'source'
            assert connect(lost.url).get(scope_key) == b"source"
        passed = [source_offset(r.headers) for r in log.read("events", 0, 0, max_records=500)]
        assert passed == [*range(40), 80, 121]  # every retry caught after each restart


def test_redis_shards_of_two_scopes_are_refused_without_a_setting_to_try(
    redis_servers: list[str],
) -> None:
    from exactly.dedupe.redis.sharding import sharding_from

    namespace = redis_namespace()
    store = RedisStore(sharding_from(redis_servers[:2]), namespace)
    connect(redis_servers[0]).set(f"{namespace}:scope", "source")
    connect(redis_servers[1]).set(f"{namespace}:scope", "workspace")
    with pytest.raises(ConfigError) as refused:
        store.adopt_scope("source", 2)
    message = str(refused.value)
    assert "several scopes (source, workspace) on different servers" in message
    assert "set [dedupe] scope" not in message and "?namespace=NS" in message
