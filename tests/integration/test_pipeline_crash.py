"""The pipeline's Spark queries on the scale-out stack, SIGKILLed at random points: 20 kills.

Dedupe (the redis store over two servers), aggregate (PostgreSQL) and route (a PostgreSQL JobDB)
read and write the log on a Kafka-protocol broker (Tansu), in one Spark application as ``exactly
up`` runs them (``tests/pipeline_job_child.py``), so each kill interrupts all three. Runs are
SIGKILLed 20 times at random moments (the harness of ``tests/job_child.py``: while Spark or the
queries start, inside micro-batches); four more kill themselves right after a database commit and
before Spark's (two after the aggregate's SQL commit, two after the route's JobDB commit), so the
next run replays a batch the database already holds. Meanwhile ``raw`` grows with duplicates, one
of the two Redis servers is SIGKILLed and started again empty three times, and a fifth of the
log's fetches come back short (``tests/short_reads.py``). At the end:

* ``events`` is exactly the first record of each messageId in ``raw``, in order, per partition;
* both tables equal a recount in plain Python of the distinct events;
* the JobDB holds one job per (event, matching destination): a director drains it and each
  receiver gets exactly the events its destination's filters take, each once.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.aggregate import open_db
from exactly.delivery import open_jobdb
from exactly.delivery.base import SUCCEEDED
from exactly.log import Log, open_log
from tests import short_reads
from tests.aggregate_stream import EventStream, append
from tests.dedupe_stream import RAW, assert_deduplicated
from tests.integration.test_aggregate import assert_exact
from tests.integration.test_route_crash import FILTERS, expected
from tests.job_child import kill_at_random_points
from tests.pipeline_job_child import KILL_AFTER_COMMIT
from tests.receiver import Receiver
from tests.seeds import crash_rng
from tests.servers import RedisServer
from tests.up_service import ScaleOut, spark_failures

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.kafka]
KILLS = 20
SELF_KILLS = {3: "aggregate:1", 8: "route:2", 13: "aggregate:2", 18: "route:1"}  # by run
SHARD_RESTARTS = (120, 300, 480)  # at these appends to raw (every 0.25 s)
PARTITIONS = 4  # more than the application's 2 cores: a read task reads several


def write_config(path: Path, backends: ScaleOut, receivers: dict[str, str]) -> Path:
    text = (
        f'data_dir = "{path.parent / "data"}"\n[log]\nurl = "{backends.log}"\n'
        f'[dedupe]\nstore = "{backends.store}"\n[aggregate]\nurl = "{backends.database}"\n'
        f'[delivery]\njobdb = "{backends.database}"\n'
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
def test_pipeline_on_the_scale_out_stack_killed_at_random_points_stays_exact(
    tmp_path: Path, scale_out: tuple[ScaleOut, RedisServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = crash_rng("pipeline-crash", "30")
    monkeypatch.delenv(KILL_AFTER_COMMIT, raising=False)  # only the runs told to kill themselves
    backends, shard = scale_out
    stream = EventStream(seed=31, duplicate_rate=0.02)
    cuts = tmp_path / "short-reads.txt"
    runs = appends = 0

    def self_kill(_: random.Random) -> dict[str, str]:
        nonlocal runs
        runs += 1
        return {KILL_AFTER_COMMIT: SELF_KILLS[runs]} if runs in SELF_KILLS else {}

    def grow(log: Log) -> None:
        nonlocal appends
        appends += 1
        append(log, RAW, PARTITIONS, stream.chunk(20))
        if appends in SHARD_RESTARTS:
            shard.restart()  # SIGKILL; back empty while the queries claim ids on it
            print(f"redis shard restarted empty at append {appends}")

    with contextlib.ExitStack() as servers:
        receivers = {name: servers.enter_context(Receiver()) for name in FILTERS}
        urls = {name: receiver.url for name, receiver in receivers.items()}
        config = write_config(tmp_path / "exactly.toml", backends, urls)
        with open_log(backends.log) as log:
            log.create_topic(RAW, PARTITIONS)
            append(log, RAW, PARTITIONS, stream.chunk(1000))
            self_kills = kill_at_random_points(
                "tests.pipeline_job_child",
                [str(config)],
                log_url=backends.log,
                grow=grow,
                rng=rng,
                kills=KILLS + len(SELF_KILLS),
                self_kill=self_kill,
                env=short_reads.environment(0.2, cuts),
            )
            assert self_kills == len(SELF_KILLS)
            assert appends >= SHARD_RESTARTS[-1], "the run ended before every shard restart"
            assert_deduplicated(log, PARTITIONS)
        distinct = list(stream.events.values())
        with open_db(backends.database) as db:
            assert_exact(db, distinct)
        drained = subprocess.run(
            [
                sys.executable,
                "-m",
                "exactly",
                "--config",
                str(config),
                "deliver",
                "--until-drained",
            ],
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert drained.returncode == 0, drained.stderr.decode()[-2000:]
        truth = expected([json.dumps(event).encode() for event in distinct])
        with open_jobdb(backends.database) as jobdb:
            assert jobdb.states() == {name: {SUCCEEDED: len(ids)} for name, ids in truth.items()}
        for name, receiver in receivers.items():
            got = receiver.successes("/ok")
            assert set(got) == truth[name], name
            assert max(got.values()) == 1, f"{name}: delivered twice with no director killed"
    torn = spark_failures(tmp_path / "data", "exactly-pipeline-crash")
    assert not torn, torn[:3]
    cut = short_reads.cuts(cuts)
    print(f"{stream.sent} events, {stream.duplicates} duplicates; fetches cut short {dict(cut)}")
    assert cut[RAW] >= 5 and cut["events"] >= 5, cut  # dedupe, aggregate and route met them
