"""The route query: events in the log become exactly the expected jobs in the JobDB.

The expected jobs are recomputed in plain Python from the events appended (``expected``), sharing
no code with the query; the JobDB is read back job by job. Replays (a micro-batch Spark runs
again) and a lost checkpoint must add nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exactly.delivery.jobdb import BACKENDS, JobDB, open_jobdb
from exactly.delivery.route import Event, EventColumns, RoutePlan, drive, jobs_for
from exactly.delivery.settings import DestinationSettings
from exactly.errors import JobDBError
from exactly.log import open_log
from tests.aggregate_stream import EventStream, append
from tests.cli_text import messages, said
from tests.job_child import FAST_JVM
from tests.jobdb import jobdb_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 2
DESTINATIONS = (
    DestinationSettings(name="all", url="http://127.0.0.1:9/all"),
    DestinationSettings(name="orders", url="http://127.0.0.1:9/o", events=("Order Completed",)),
    DestinationSettings(name="ios", url="http://127.0.0.1:9/ios", sources=("ios",)),
    DestinationSettings(
        name="ios-signups",
        url="http://127.0.0.1:9/signups",
        sources=("ios",),
        events=("Signed Up",),
        headers={"X-Team": "growth"},
        expire="1h",  # type: ignore[arg-type]
    ),
    DestinationSettings(name="nobody", url="http://127.0.0.1:9/n", sources=("android",)),
)

Key = tuple[str, str, str, bytes]  # bucket, destination, message id, payload


def expected(values: list[bytes]) -> Counter[Key]:
    """The jobs routing must make, from the events as plain JSON (independent of jobs_for)."""
    import json

    out: Counter[Key] = Counter()
    for value in values:
        event = json.loads(value)
        source, name = event["sourceId"], event.get("event")
        takes = {
            "all": True,
            "orders": name == "Order Completed",
            "ios": source == "ios",
            "ios-signups": source == "ios" and name == "Signed Up",
            "nobody": False,
        }
        for destination, yes in takes.items():
            if yes:
                out[(f"{source}/{destination}", destination, event["messageId"], value)] += 1
    return out


def stored(db: JobDB) -> Counter[Key]:
    return Counter(
        (job.bucket, job.destination, job.message_id, job.payload)
        for bucket in db.buckets()
        for job in db.pending(bucket, limit=10**6)
    )


class Events:
    """Distinct events appended to the ``events`` topic, their values kept in append order."""

    def __init__(self, log_url: str) -> None:
        self.log_url = log_url
        self.stream = EventStream(seed=5, duplicate_rate=0.0)
        self.values: list[bytes] = []
        with open_log(log_url) as log:
            log.create_topic("events", PARTITIONS)

    def add(self, count: int) -> None:
        records = list(self.stream.chunk(count))
        self.values += [value for _, value in records]
        with open_log(self.log_url) as log:
            append(log, "events", PARTITIONS, records)


def route(spark: SparkSession, log_url: str, db: JobDB, checkpoint: Path, **options: Any) -> Any:
    plan = RoutePlan(
        log_url,
        checkpoint,
        DESTINATIONS,
        until_caught_up=True,
        read_records=500,
        max_records_per_trigger=options.pop("max_records_per_trigger", 700),
        **options,
    )
    return drive(spark, plan, db, say=lambda _: None)


def test_jobs_for_matches_each_destination_filter() -> None:
    def event(source: str | None, name: str | None, message_id: str | None = "m") -> Event:
        return Event(source, name, message_id, "u1", b"{}", 1, 7)

    now = 1_000.0
    events = [event("ios", "Signed Up"), event("web", None), event(None, "Order Completed", None)]
    jobs = jobs_for(EventColumns.of(events), DESTINATIONS, now)
    assert [(j.source, j.destination) for j in jobs] == [  # each destination's in event order
        ("ios", "all"),
        ("web", "all"),
        ("", "all"),
        ("", "orders"),
        ("ios", "ios"),
        ("ios", "ios-signups"),
    ]
    assert jobs_for(EventColumns.of([]), DESTINATIONS, now) == []
    signup = jobs[5]
    assert signup.destination == "ios-signups" and signup.expire_at == now + 3600
    assert signup.user_id == "u1"
    assert jobs[0].expire_at == now + 24 * 3600
    assert jobs[3].message_id == "1-7"  # no messageId: its place in the log


@pytest.mark.spark
@pytest.mark.parametrize("backend", BACKENDS)
def test_route_adds_each_job_once_across_reruns_replays_and_a_lost_checkpoint(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    events = Events(log_url)
    checkpoint = tmp_path / "checkpoint"
    with jobdb_url(backend, tmp_path) as url, open_jobdb(url) as db:
        events.add(1500)
        first = route(spark, log_url, db, checkpoint)
        assert len(first.batches) >= 3 and first.replays == 0
        truth = expected(events.values)
        assert stored(db) == truth
        assert first.jobs == sum(truth.values()) and first.events == 1500
        assert {destination for _, destination, _, _ in truth} == {
            "all",
            "orders",
            "ios",
            "ios-signups",
        }

        # a rerun over nothing new adds nothing
        assert route(spark, log_url, db, checkpoint).jobs == 0
        assert stored(db) == truth

        # new events, then a replay: Spark runs the last batch again (its commit file lost)
        events.add(400)
        assert route(spark, log_url, db, checkpoint).jobs > 0
        last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
        (checkpoint / "commits" / str(last)).unlink()
        (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
        replayed = route(spark, log_url, db, checkpoint)
        assert replayed.replays == 1 and replayed.jobs == 0
        assert stored(db) == expected(events.values)

        # a lost checkpoint: the next run starts where the JobDB says routing stopped
        shutil.rmtree(checkpoint)
        events.add(300)
        again = route(spark, log_url, db, checkpoint)
        assert again.events == 300
        assert stored(db) == expected(events.values)


def run_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "exactly", "--config", str(config), *args]
    env = {**os.environ, "JDK_JAVA_OPTIONS": FAST_JVM}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.spark
def test_exactly_route_from_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "exactly.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    refused = run_cli(config, "route", "--until-caught-up")
    assert refused.returncode == 1 and len(messages(refused.stderr)) == 1
    assert "no [[destinations]]" in said(refused.stderr)
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        '[[destinations]]\nname = "orders"\nurl = "http://127.0.0.1:9/o"\n'
        'events = ["Order Completed"]\n'
    )
    log_url = f"sqlite://{tmp_path / 'data' / 'log'}"
    events = Events(log_url)
    events.add(300)
    started = time.monotonic()
    result = run_cli(config, "route", "--until-caught-up")
    assert result.returncode == 0, result.stderr[-2000:]
    orders = sum(n for (_, d, _, _), n in expected(events.values).items() if d == "orders")
    assert f"caught up: {orders:,} jobs for {orders:,} events" in result.stdout
    with open_jobdb(f"sqlite://{tmp_path / 'data' / 'jobdb'}") as db:
        assert {d: sum(s.values()) for d, s in db.states().items()} == {"orders": orders}
    again = run_cli(config, "route", "--until-caught-up")
    assert again.returncode == 0 and "caught up: 0 jobs" in again.stdout, again.stderr[-2000:]
    print(f"two runs of exactly route in {time.monotonic() - started:.0f} s")


ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def admin(sql: str) -> list[Any]:
    import psycopg

    with psycopg.connect(ADMIN, autocommit=True) as connection:
        cursor = connection.execute(sql)
        return cursor.fetchall() if cursor.description else []


@pytest.mark.spark
def test_route_rides_out_a_failing_jobdb_and_stops_in_one_line_past_its_patience(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.aggregate_db import postgres_missing
    from tests.conftest import require

    require(postgres_missing())
    name = f"exactly_route_{uuid.uuid4().hex[:12]}"  # its own: terminating touches no other test
    admin(f"CREATE DATABASE {name}")
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    log_url = f"sqlite://{tmp_path / 'log'}"
    checkpoint = tmp_path / "checkpoint"
    try:
        events = Events(log_url)
        events.add(1500)
        stop, terminated = threading.Event(), []

        def terminate() -> None:
            while not stop.wait(0.5):
                terminated.extend(
                    admin(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                    )
                )

        thread = threading.Thread(target=terminate, daemon=True)
        with open_jobdb(url) as db:
            thread.start()
            try:
                route(spark, log_url, db, checkpoint, max_records_per_trigger=100)
            finally:
                stop.set()
                thread.join(10)
        assert len(terminated) >= 3
        assert "the JobDB failed" in capsys.readouterr().err  # the retry ran
        with open_jobdb(url) as db:
            assert stored(db) == expected(events.values)

        # the database gone: the query stops after its patience, in one line
        events.add(200)
        with open_jobdb(url) as db:
            assert db.marker("none") is None  # connected
            admin(f"DROP DATABASE {name} WITH (FORCE)")
            started = time.monotonic()
            with pytest.raises(JobDBError, match="did not recover within 2 s") as caught:
                route(spark, log_url, db, checkpoint, jobdb_patience=2.0)
        assert "\n" not in str(caught.value) and time.monotonic() - started < 60
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
