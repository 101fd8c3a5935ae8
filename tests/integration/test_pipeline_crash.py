"""The pipeline's Spark queries SIGKILLed at random points, on every backend: 20 kills a stack.

Dedupe, aggregate and route run in one Spark application as ``exactly up`` runs them
(``tests/pipeline_job_child.py``), so each kill interrupts all three. Three stacks cover every
backend of the three stages:

* ``embedded``: the sqlite log, the rocksdb store, SQLite aggregates and JobDB;
* ``spark-state``: the sqlite log, Spark's own state store, PostgreSQL aggregates, a MariaDB
  JobDB, and the lake query into a PostgreSQL table;
* ``scale-out``: the log on a Kafka-protocol broker (Tansu) with a fifth of its fetches cut short
  at random (``tests/short_reads.py``, as Tansu once cut one), the redis store over two servers
  with one SIGKILLed and started again empty three times, PostgreSQL aggregates and JobDB, and
  the lake query into an Iceberg table whose catalog is in PostgreSQL.

(The lake on Delta is killed by ``test_lake_crash.py``, with a kill between a batch's files and
its commit.)

Runs are SIGKILLed 20 times at random moments (the harness of ``tests/job_child.py``: three while
the queries start, the others 0 to 0.5 s after a micro-batch of the run's own is in flight); each
kill is recorded as inside a micro-batch or between two, read from the four checkpoints once the
run is dead, and at least three quarters must land inside one; four more kill themselves right
after a database commit and before Spark's (two after the aggregate's SQL commit, two after the
route's JobDB commit, and on the stacks with a lake two after the lake's table commit), so the
next run replays a batch the database already holds. ``raw`` grows meanwhile (for its first
1,000 appends of 20, far past what the killed runs work off), with duplicates and records
without a usable messageId; raw has more partitions than the application has cores,
and the claim stores get Arrow batches far smaller than a task's rows, so that batches span
partitions as they do in production. At the end:

* ``events`` is exactly the first record of each messageId in ``raw``, in order, per partition,
  and every bad record is in ``raw.rejected`` once;
* both tables equal a recount in plain Python of the distinct events;
* the JobDB holds one job per (event, matching destination): a director drains it and each
  receiver gets exactly the events its destination's filters take, each once;
* the lake table, read by its own library (pyiceberg's scan, a plain SQL query), holds every
  messageId of ``events`` once; it has the segment layout, and Segment's tables beside it
  (tracks, one per event name, pages, identifies, users) hold each id once, ``users`` equal to
  a recomputation from the identifies, read back in a fresh process by the format's library;
* no task failed for Spark 4.3's torn environment map (``exactly.spark.datasource``).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.aggregate import open_db
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED
from exactly.log import Log, Record, open_log
from tests import short_reads
from tests.aggregate_db import postgres_missing, postgres_schema
from tests.aggregate_stream import EventStream, append
from tests.batches_in_flight import Checkpoints
from tests.conftest import require
from tests.dedupe_stream import RAW, assert_deduplicated
from tests.integration.test_aggregate import assert_exact
from tests.integration.test_route_crash import LISTS as FILTERS
from tests.integration.test_route_crash import expected
from tests.job_child import kill_at_random_points
from tests.jobdb import mysql_database, mysql_missing
from tests.pipeline_job_child import KILL_AFTER_COMMIT
from tests.receiver import Receiver
from tests.seeds import crash_rng
from tests.servers import RedisServer
from tests.up_service import Stack, spark_failures
from tests.warehouse_checks import assert_warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]
KILLS = 20
SELF_KILLS = {3: "aggregate:1", 8: "route:2", 13: "aggregate:2", 18: "route:1"}  # by run
LAKE_SELF_KILLS = {5: "lake:1", 15: "lake:2"}  # by run, on the stacks with a lake
SHARD_RESTARTS = (120, 300, 480)  # at these appends to raw (every 0.25 s)
# raw stops growing after this many appends of 20 (about 4 minutes): the queries are far behind
# by then, so every later kill still finds batches to land in, and the catch-up and the drain
# stay the same size however slow a loaded machine makes the runs (they had grown to 67,000
# events and a drain past its 300 s)
APPENDS = 1000
PARTITIONS = 4  # more than the application's 2 cores: a read task reads several
STACKS = ["embedded", "spark-state", "scale-out"]


@contextlib.contextmanager
def backends(
    stack: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Stack, RedisServer | None]]:
    """The log, store and databases of ``stack``; the Redis server to restart (scale-out)."""
    if stack == "embedded":
        sqlite = f"sqlite://{tmp_path / 'log'}"
        aggregates, jobdb = (
            f"sqlite://{tmp_path / 'aggregates.db'}",
            f"sqlite://{tmp_path / 'jobdb'}",
        )
        yield Stack(sqlite, "rocksdb", aggregates, jobdb), None
    elif stack == "spark-state":
        require(postgres_missing())
        require(mysql_missing())
        with postgres_schema() as aggregates, mysql_database() as jobdb:
            yield Stack(f"sqlite://{tmp_path / 'log'}", "spark-state", aggregates, jobdb), None
    else:
        scale_out: tuple[Stack, RedisServer] = request.getfixturevalue("scale_out")
        yield scale_out


def lost_claims(errors: str) -> bool:
    """A run that failed because the Redis server restarted empty under one of its claims: the
    claim refuses the server that lost its position, the micro-batch fails (no task retries in
    the run's local[2]) and the next run rebuilds the server from ``events`` before it claims."""
    return "StoreUnavailable" in errors and "the shard lost claims" in errors


def shard_down(errors: str, restarted: list[float]) -> bool:
    """A run that failed because it claimed while the test had its Redis server down (killed,
    not yet started again: a wider window on a loaded machine), within a minute of a restart."""
    refused = "StoreUnavailable" in errors and "Connection refused" in errors
    return refused and bool(restarted) and time.monotonic() - restarted[-1] < 60


def lake_of(stack: str, used: Stack, tmp_path: Path) -> str | None:
    """The lake table of ``stack``: PostgreSQL beside spark-state's aggregates, Iceberg with its
    catalog in the scale-out stack's PostgreSQL; none on the embedded stack (Delta is killed by
    test_lake_crash.py)."""
    if stack == "spark-state":
        return f"{used.database}&table=lake_events"
    if stack == "scale-out":
        base = used.database.removeprefix("postgresql://")
        return f"iceberg+postgresql://{base}&warehouse={tmp_path / 'warehouse'}"
    return None


def lake_message_ids(url: str) -> list[str]:
    """Every row's messageId, read by the table's own library: pyiceberg's scan of the catalog's
    current snapshot, or a plain SQL query of the PostgreSQL table."""
    if url.startswith("iceberg"):
        from exactly.lake.iceberg import IcebergTable

        catalog = IcebergTable.from_url(url)  # the SqlCatalog the URL names; pyiceberg reads
        table = catalog.catalog.load_table(catalog.identifier)
        return [str(m) for m in table.scan(selected_fields=("messageId",)).to_arrow()["messageId"]]
    import psycopg

    database, _, _ = url.partition("&table=")
    with psycopg.connect(database) as connection:
        return [row[0] for row in connection.execute('SELECT "messageId" FROM lake_events')]


def write_config(
    path: Path, stack: Stack, receivers: dict[str, str], lake: str | None = None
) -> Path:
    text = (
        f'data_dir = "{path.parent / "data"}"\n[log]\nurl = "{stack.log}"\n'
        f'[dedupe]\nstore = "{stack.store}"\n[aggregate]\nurl = "{stack.database}"\n'
        # one dataset holds every job: JobDB.states() counts the live datasets, and a full one
        # is archived and dropped once done (over 100,000 jobs when a loaded run grows long)
        f'[delivery]\njobdb = "{stack.jobdb_url}"\ndataset_rows = 10000000\n'
        + (f'[lake]\nurl = "{lake}"\nlayout = "segment"\n' if lake else "")
    )
    for name, (sources, events) in FILTERS.items():
        text += (
            f'[[destinations]]\nname = "{name}"\nurl = "{receivers[name]}/ok"\n'
            + (f"sources = {json.dumps(sources)}\n" if sources else "")
            + (f"events = {json.dumps(events)}\n" if events else "")
        )
    path.write_text(text)
    return path


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("stack", STACKS)
def test_pipeline_killed_at_random_points_stays_exact(
    tmp_path: Path, stack: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = crash_rng(f"pipeline-crash-{stack}", "30")
    monkeypatch.delenv(KILL_AFTER_COMMIT, raising=False)  # only the runs told to kill themselves
    stream = EventStream(seed=31, duplicate_rate=0.02)
    cuts = tmp_path / "short-reads.txt"
    runs = appends = rejects = 0
    restarted: list[float] = []  # when the Redis shard went down (scale-out)
    with contextlib.ExitStack() as servers:
        used, shard = servers.enter_context(backends(stack, tmp_path, request))
        lake = lake_of(stack, used, tmp_path)
        self_kills = SELF_KILLS | (LAKE_SELF_KILLS if lake else {})

        def self_kill(_: random.Random) -> dict[str, str]:
            nonlocal runs
            runs += 1
            return {KILL_AFTER_COMMIT: self_kills[runs]} if runs in self_kills else {}

        def grow(log: Log) -> None:
            nonlocal appends, rejects
            if appends == APPENDS:
                return
            appends += 1
            append(log, RAW, PARTITIONS, stream.chunk(20))
            if appends % 25 == 0:  # no usable messageId: to raw.rejected
                log.append(RAW, appends % PARTITIONS, [Record(b"not json %d" % appends)])
                rejects += 1
            if shard is not None and appends in SHARD_RESTARTS:
                restarted.append(time.monotonic())
                shard.restart()  # SIGKILL; back empty while the queries claim ids on it
                print(f"redis shard restarted empty at append {appends}")

        receivers = {name: servers.enter_context(Receiver()) for name in FILTERS}
        urls = {name: receiver.url for name, receiver in receivers.items()}
        config = write_config(tmp_path / "exactly.toml", used, urls, lake)
        faults = short_reads.environment(0.2, cuts) if stack == "scale-out" else {}
        with open_log(used.log) as log:
            log.create_topic(RAW, PARTITIONS)
            append(log, RAW, PARTITIONS, stream.chunk(1000))
            data = tmp_path / "data"  # the child's checkpoints: data / QUERY
            queries = ["dedupe", "aggregate", "route"] + (["lake"] if lake else [])
            kills = kill_at_random_points(
                "tests.pipeline_job_child",
                [str(config)],
                log_url=used.log,
                grow=grow,
                rng=rng,
                kills=KILLS + len(self_kills),
                checkpoints=Checkpoints({query: data / query for query in queries}),
                self_kill=self_kill,
                env=faults,
                may_fail=(
                    (lambda errors: lost_claims(errors) or shard_down(errors, restarted))
                    if shard is not None
                    else None
                ),
            )
            assert kills.self_kills == len(self_kills)
            kills.landings.check()
            if shard is not None:
                assert shard.restarts == len(SHARD_RESTARTS), "the run ended before a restart"
            assert rejects >= 5
            assert_deduplicated(log, PARTITIONS)
        distinct = list(stream.events.values())
        with open_db(used.database) as db:
            assert_exact(db, distinct)
        if lake is not None:
            landed = Counter(lake_message_ids(lake))
            assert set(landed) == {event["messageId"] for event in distinct}
            assert max(landed.values()) == 1, landed.most_common(3)
            tables = assert_warehouse(lake, distinct)  # Segment's tables beside it, each id once
            print(f"segment layout: {len(tables)} tables")
        deliver = [sys.executable, "-m", "exactly", "--config", str(config), "deliver"]
        drained = subprocess.run(
            [*deliver, "--until-drained"], capture_output=True, timeout=300, check=False
        )
        assert drained.returncode == 0, drained.stderr.decode()[-2000:]
        truth = expected([json.dumps(event).encode() for event in distinct])
        with open_jobdb(used.jobdb_url) as jobdb:
            assert jobdb.states() == {name: {SUCCEEDED: len(ids)} for name, ids in truth.items()}
        for name, receiver in receivers.items():
            got = receiver.successes("/ok")
            assert set(got) == truth[name], name
            assert max(got.values()) == 1, f"{name}: delivered twice with no director killed"
    torn = spark_failures(tmp_path / "data", "exactly-pipeline-crash")
    assert not torn, torn[:3]
    print(f"{stream.sent} events, {stream.duplicates} duplicates, {rejects} rejects")
    if stack == "scale-out":
        cut = short_reads.cuts(cuts)
        print(f"fetches cut short {dict(cut)}")
        assert cut[RAW] >= 5 and cut["events"] >= 5, cut  # dedupe, aggregate and route met them
