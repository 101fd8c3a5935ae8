"""SIGKILL the aggregate job at random points while ``events`` grows: the tables stay exact.

Each run is a real job process (Spark's JVM and Python workers in its process group), killed
with SIGKILL at a random moment: while Spark or the query starts, inside micro-batches. Some runs
kill themselves at the worst moment on purpose: right after the SQL commit of a batch and before
Spark's commit (``EXACTLY_TEST_KILL_AFTER_COMMIT``), so the next run replays a batch the
database already holds. The next run warms up while the previous one works
(``tests/aggregate_job_child.py``). At the end one run catches up undisturbed, and every table
must equal the recount in plain Python of the events appended, on each backend.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from exactly.aggregate import open_db
from exactly.log import open_log
from tests.aggregate_db import BACKENDS, database
from tests.aggregate_job_child import KILL_AFTER_COMMIT
from tests.aggregate_stream import EventStream, append
from tests.integration.test_aggregate import assert_exact, distinct_raw
from tests.job_child import FAST_JVM, ROOT, Child

pytestmark = [pytest.mark.spark, pytest.mark.slow]
KILLS = 20
MODULE = "tests.aggregate_job_child"
PARTITIONS = 2


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", BACKENDS)
def test_aggregate_killed_at_random_points_stays_exact(tmp_path: Path, backend: str) -> None:
    rng = random.Random(f"aggregate-crash-{backend}")
    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = EventStream(seed=9, duplicate_rate=0.0)
    env = {**os.environ, "JDK_JAVA_OPTIONS": FAST_JVM, "PYTHONPATH": str(ROOT)}
    env.pop(KILL_AFTER_COMMIT, None)
    with database(backend, tmp_path) as db_url, open_log(log_url) as log:
        args = [str(tmp_path / "data"), log_url, db_url, str(tmp_path / "checkpoint")]
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, distinct_raw(stream, 1500))
        growing = threading.Event()
        growing.set()

        def grow() -> None:
            with open_log(log_url) as writer:
                while growing.is_set():
                    append(writer, "events", PARTITIONS, distinct_raw(stream, 20))
                    time.sleep(0.25)

        def child(last: bool) -> tuple[Child, bool]:
            """The next run; one in four kills itself between the SQL and Spark commits."""
            suicidal = not last and rng.random() < 0.25
            own = dict(env, **{KILL_AFTER_COMMIT: str(rng.randint(1, 3))}) if suicidal else env
            return Child(MODULE, args, own, "catch-up" if last else "streaming"), suicidal

        appender = threading.Thread(target=grow, daemon=True)
        appender.start()
        current, suicidal = child(False)
        current.go()
        children = [current]
        kills = self_kills = 0
        began = time.monotonic()
        try:
            while kills < KILLS:
                last = kills == KILLS - 1
                following, following_suicidal = child(last)
                children.append(following)
                assert current.wait_for("running"), f"run {kills} did not start: {current.lines}"
                if suicidal:
                    assert current.wait_for("<exit>", timeout=240), current.lines
                    assert not current.saw("done"), current.lines
                    self_kills += 1
                elif rng.random() < 0.4:
                    time.sleep(rng.uniform(0.0, 4.0))  # query start, planning, first batches
                else:
                    assert current.wait_for("batch", timeout=120), f"no batch: {current.lines}"
                    time.sleep(rng.uniform(0.0, 2.0))  # inside later micro-batches
                if not suicidal:
                    assert not current.saw("<exit>"), f"run {kills} died: {current.lines}"
                if last:
                    growing.clear()
                    appender.join()
                current.kill()
                kills += 1
                print(f"kill {kills} at {time.monotonic() - began:.0f} s: {current.lines[-2:]}")
                current, suicidal = following, following_suicidal
                current.go()
            growing.clear()
            appender.join()
            assert current.wait_for("done", timeout=300), f"the last run failed: {current.lines}"
        finally:
            growing.clear()
            for run in children:
                run.kill()
        assert self_kills >= 2, "the kill between the SQL and the Spark commit never ran"
        assert stream.sent > 2_000
        with open_db(db_url) as db:
            assert_exact(db, list(stream.events.values()))
            replays = db.query("SELECT COUNT(*) FROM exactly_batches")[0][0]
            assert replays > KILLS
