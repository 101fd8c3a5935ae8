"""SIGKILL the dedupe job at random points while raw grows: events stay exact, for each store.

Each run is a real job process (Spark's JVM and Python workers in its process group), killed
with SIGKILL as a machine crash would, at a random moment: while Spark starts, while a query
starts, inside micro-batches (claims, appends, commits). The next run is already warming up
(``tests/dedupe_job_child.py``) so that the required number of kills stays affordable. At the
end one run catches up undisturbed, and ``events`` must be exactly the first record of each
messageId in ``raw``, in order, per partition, with every bad record in ``raw.rejected`` once.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from exactly.dedupe.job import STORES
from exactly.log import open_log
from tests.dedupe_stream import RAW, Stream, assert_deduplicated
from tests.job_child import FAST_JVM, ROOT, Child

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.usefixtures("redis_store_env")]
KILLS = 20
MODULE = "tests.dedupe_job_child"
PARTITIONS = 2


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("store", STORES)
def test_dedupe_killed_at_random_points_stays_exact(tmp_path: Path, store: str) -> None:
    rng = random.Random(f"dedupe-crash-{store}")
    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = Stream(PARTITIONS, seed=5, duplicate_rate=0.02, reject_rate=0.002)
    env = {**os.environ, "JDK_JAVA_OPTIONS": FAST_JVM, "PYTHONPATH": str(ROOT)}
    args = [
        str(tmp_path / "data"),
        log_url,
        store,
        str(tmp_path / "checkpoint"),
    ]
    with open_log(log_url) as log:
        log.create_topic(RAW, PARTITIONS)
        stream.append(log, 300)
        growing = threading.Event()
        growing.set()

        def grow() -> None:
            with open_log(log_url) as writer:
                while growing.is_set():
                    stream.append(writer, 10)
                    time.sleep(0.25)

        appender = threading.Thread(target=grow, daemon=True)
        appender.start()
        current = Child(MODULE, args, env)
        current.go()
        children = [current]
        kills = 0
        began = time.monotonic()
        try:
            while kills < KILLS:
                last = kills == KILLS - 1
                following = Child(MODULE, args, env, "catch-up" if last else "streaming")
                children.append(following)
                assert current.wait_for("running"), f"run {kills} did not start: {current.lines}"
                if rng.random() < 0.4:
                    time.sleep(rng.uniform(0.0, 4.0))  # query start, planning, the first tasks
                else:
                    assert current.wait_for("batch", timeout=120), f"no batch: {current.lines}"
                    time.sleep(rng.uniform(0.0, 2.0))  # inside later micro-batches
                assert not current.saw("<exit>"), f"run {kills} died: {current.lines}"
                if last:  # raw stops growing before the final run can take its turn
                    growing.clear()
                    appender.join()
                current.kill()
                kills += 1
                print(f"kill {kills} at {time.monotonic() - began:.0f} s: {current.lines[-2:]}")
                current = following
                current.go()
            growing.clear()
            appender.join()
            assert current.wait_for("done", timeout=300), f"the last run failed: {current.lines}"
        finally:
            growing.clear()
            for child in children:
                child.kill()
        assert stream.sent > 1_000
        assert_deduplicated(log, PARTITIONS)
