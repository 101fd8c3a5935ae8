"""SIGKILL the aggregate job at random points while ``events`` grows: the tables stay exact.

Each run is a real job process (Spark's JVM and Python workers in its process group), killed
with SIGKILL at a random moment, 20 times: while Spark or the query starts, inside
micro-batches. Four more runs kill themselves at the worst moment on purpose: right after the SQL
commit of a batch and before Spark's commit (``EXACTLY_TEST_KILL_AFTER_COMMIT``), so the next run
replays a batch the database already holds. The next run warms up while the previous one works
(``tests/aggregate_job_child.py``). At the end one run catches up undisturbed, and every table
must equal the recount in plain Python of the events appended, on each backend.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from exactly.aggregate import open_db
from exactly.log import open_log
from tests.aggregate_db import BACKENDS, database
from tests.aggregate_job_child import KILL_AFTER_COMMIT
from tests.aggregate_stream import EventStream, append
from tests.integration.test_aggregate import assert_exact, distinct_raw
from tests.job_child import kill_at_random_points
from tests.seeds import crash_rng

pytestmark = [pytest.mark.spark, pytest.mark.slow]
KILLS = 20  # random, besides the runs that kill themselves
SELF_KILLED = (3, 8, 13, 18)
MODULE = "tests.aggregate_job_child"
PARTITIONS = 2


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", BACKENDS)
def test_aggregate_killed_at_random_points_stays_exact(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = crash_rng(f"aggregate-crash-{backend}", "1")
    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = EventStream(seed=9, duplicate_rate=0.0)
    monkeypatch.delenv(KILL_AFTER_COMMIT, raising=False)  # only the runs told to kill themselves

    runs = 0

    def self_kill(rng: random.Random) -> dict[str, str]:
        """Runs 3, 8, 13 and 18 kill themselves between the SQL and the Spark commits, after
        their first, second or third commit."""
        nonlocal runs
        runs += 1
        return {KILL_AFTER_COMMIT: str(rng.randint(1, 3))} if runs in SELF_KILLED else {}

    with database(backend, tmp_path) as db_url, open_log(log_url) as log:
        args = [str(tmp_path / "data"), log_url, db_url, str(tmp_path / "checkpoint")]
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, distinct_raw(stream, 1500))
        self_kills = kill_at_random_points(
            MODULE,
            args,
            log_url=log_url,
            grow=lambda writer: append(writer, "events", PARTITIONS, distinct_raw(stream, 20)),
            rng=rng,
            kills=KILLS + len(SELF_KILLED),
            self_kill=self_kill,
        )
        assert self_kills == len(SELF_KILLED)  # and 20 random kills besides
        assert stream.sent > 2_000
        with open_db(db_url) as db:
            assert_exact(db, list(stream.events.values()))
            replays = db.query("SELECT COUNT(*) FROM exactly_batches")[0][0]
            assert replays > KILLS
