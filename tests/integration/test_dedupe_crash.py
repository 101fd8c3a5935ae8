"""SIGKILL the dedupe job at random points while raw grows: events stay exact, for each store.

Each run is a real job process (Spark's JVM and Python workers in its process group), killed
with SIGKILL as a machine crash would, at a random moment: while Spark starts, while a query
starts, inside micro-batches (claims, appends, commits). The next run is already warming up
(``tests/dedupe_job_child.py``) so that the required number of kills stays affordable
(``tests.job_child.kill_at_random_points``, the harness the aggregate crash test shares). At the
end one run catches up undisturbed, and ``events`` must be exactly the first record of each
messageId in ``raw``, in order, per partition, with every bad record in ``raw.rejected`` once.

raw has more partitions than the job has cores, so a read task reads several; for the stores that
claim, the child sets Arrow batches far smaller than a task's rows: the batches the sink's worker
gets span partitions, as they do in production with Spark's own batch size.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.dedupe.job import STORES
from exactly.log import open_log
from tests.dedupe_stream import RAW, Stream, assert_deduplicated
from tests.job_child import kill_at_random_points
from tests.seeds import crash_rng

pytestmark = [pytest.mark.spark, pytest.mark.slow]
KILLS = 20
MODULE = "tests.dedupe_job_child"
PARTITIONS = 5


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("store", STORES)
def test_dedupe_killed_at_random_points_stays_exact(
    tmp_path: Path, store: str, dedupe_store: str
) -> None:
    rng = crash_rng(f"dedupe-crash-{store}", "1")
    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = Stream(PARTITIONS, seed=5, duplicate_rate=0.02, reject_rate=0.002)
    args = [str(tmp_path / "data"), log_url, dedupe_store, str(tmp_path / "checkpoint")]
    with open_log(log_url) as log:
        log.create_topic(RAW, PARTITIONS)
        stream.append(log, 300)
        kill_at_random_points(
            MODULE,
            args,
            log_url=log_url,
            grow=lambda writer: stream.append(writer, 10),
            rng=rng,
            kills=KILLS,
        )
        assert stream.sent > 1_000
        assert_deduplicated(log, PARTITIONS)
