"""The lake query SIGKILLed at random points on a Delta table with the segment layout, then a
catch-up.

Runs are killed while the query starts, inside micro-batches, right after a table commit and
before Spark's, and after a batch's file is written but before its commit; the events topic
grows all the while. Each kill is recorded as inside a micro-batch or between two (read from the
checkpoint, ``tests/batches_in_flight.py``), and at least three quarters land inside one. After
the catch-up, read back with ``deltalake`` and ``polars`` (not our code): every messageId of
``events`` is in the table exactly once, no file written before a killed commit is visible, and
vacuum removes those files (and those of batches a random kill stopped between their files and
their commit) and nothing else. The events are the SDKs' (every call type,
``tests/warehouse_events.py``), and Segment's tables beside ``events`` hold each id once, with
``users`` equal to a recomputation from the identifies, also read back by ``deltalake`` in a
fresh process (``tests/warehouse_checks.py``). Iceberg and PostgreSQL run the layout in
``test_pipeline_crash.py``.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from deltalake import DeltaTable

from exactly.lake import open_table
from exactly.lake.files import FILE_NAME
from exactly.log import Log, open_log
from tests.aggregate_stream import append
from tests.batches_in_flight import Checkpoints
from tests.job_child import kill_at_random_points
from tests.lake_job_child import KILL_AFTER_COMMIT, KILL_BEFORE_COMMIT, KILLED
from tests.seeds import crash_seed
from tests.warehouse_checks import assert_warehouse
from tests.warehouse_events import sdk_events

pytestmark = [pytest.mark.spark, pytest.mark.slow]
KILLS = 20  # as issue 35 asks (Iceberg and PostgreSQL: test_pipeline_crash.py's stacks)
SELF_KILLS = 4
PARTITIONS = 2


@pytest.mark.timeout(1200)  # 5 minutes on a quiet machine, 10 at a load of 8
def test_the_lake_query_killed_at_random_points_lands_every_event_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = crash_seed("35")
    rng = random.Random(f"lake-{seed}")
    for name in (KILL_AFTER_COMMIT, KILL_BEFORE_COMMIT):
        monkeypatch.delenv(name, raising=False)  # only the runs told to kill themselves
    sent: list[dict[str, Any]] = []
    message_ids: list[str] = []
    log_url = f"sqlite://{tmp_path / 'log'}"
    path = tmp_path / "lake" / "events"
    config = tmp_path / "exactly.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[log]\nurl = "{log_url}"\n[lake]\nlayout = "segment"\n'
    )
    starts = 0

    def self_kill(_: random.Random) -> dict[str, str]:
        """Runs 3 and 9 die before a commit, after its files; runs 5 and 11 after one."""
        nonlocal starts
        starts += 1
        if starts in (3, 9):
            return {KILL_BEFORE_COMMIT: str(starts % 2 + 1)}
        if starts in (5, 11):
            return {KILL_AFTER_COMMIT: str(starts % 3 + 1)}
        return {}

    def grow(log: Log) -> None:
        events = sdk_events(len(sent), 8, users=7)
        sent.extend(events)
        message_ids.extend(event["messageId"] for event in events)
        append(
            log, "events", PARTITIONS, [(e["messageId"], json.dumps(e).encode()) for e in events]
        )

    with open_log(log_url) as log:
        log.create_topic("events", PARTITIONS)
        grow(log)
    checkpoint = tmp_path / "checkpoint"
    kills = kill_at_random_points(
        "tests.lake_job_child",
        [str(config), f"delta://{path}", str(checkpoint)],
        log_url=log_url,
        grow=grow,
        rng=rng,
        kills=KILLS + SELF_KILLS,
        checkpoints=Checkpoints({"lake": checkpoint}),
        self_kill=self_kill,
    )
    assert kills.self_kills == SELF_KILLS
    kills.landings.check()

    # read back by the format's own library and by polars
    table = DeltaTable(str(path))
    ids = table.to_pyarrow_table(columns=["messageId"]).column("messageId").to_pylist()
    assert len(ids) == len(set(ids)), "a messageId is in the table twice"
    assert sorted(ids) == sorted(message_ids)
    frame = pl.read_delta(str(path))
    assert frame.height == len(message_ids) and frame["messageId"].n_unique() == len(message_ids)

    killed = set((tmp_path / KILLED).read_text().split())
    assert len(killed) >= 2  # the two runs killed between their files and their commit
    committed = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
    assert not killed & committed
    with open_table(f"delta://{path}") as lake:
        removed = set(lake.vacuum(timedelta(0)))
    assert killed <= removed and not removed & committed
    assert all(FILE_NAME.match(Path(file).name) for file in removed)  # batches' files alone
    assert not any((path / file).exists() for file in killed)
    assert DeltaTable(str(path)).to_pyarrow_table(columns=["messageId"]).num_rows == len(ids)
    tables = assert_warehouse(f"delta://{path}", sent)
    assert {"tracks", "order_completed", "identifies", "users", "groups", "accounts"} <= set(tables)
