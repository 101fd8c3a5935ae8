"""What a newcomer meets (issue 32): every command's text fits 80 columns whatever the terminal's
width, names are never cut, counts read ``2,000``, and ``status`` hides internal topics.

The data dir is made without Spark (a dedupe status file, an aggregate marker, JobDB jobs), deep
in a long temporary path so that every absolute path would overflow a line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from exactly.aggregate import open_db
from exactly.aggregate.base import Batch
from exactly.aggregate.spec import EVENT_COUNTS
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import EXECUTING, NewJob, Transition
from exactly.log import Record, open_log
from tests.integration.test_dedupe_cli import dedupe_ran

EVENTS = ["Order Completed", "Checkout Started", "Product Viewed", "Signed Up", "Cart Viewed"]
DESTINATIONS = ["all-events", "orders-warehouse", "refusing"]
QUERY = "3f2b9c1e-5d7a-4e8f-9b6c-2a1d0e4f7c3b-a81c2d4e-0f9b-47c1-8e2a-5b6d7c8e9f0a"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config and a data dir where every stage has run, at a path of about 60 characters."""
    base = tmp_path_factory.mktemp("w")
    here = base / ("analytics-pipeline-" * 4)[: 56 - len(str(base))]
    data = here / "data"
    text = f'data_dir = "{data}"\n'
    for name in DESTINATIONS:
        text += f'[[destinations]]\nname = "{name}"\nurl = "http://127.0.0.1:9/{name}"\n'
        text += "rate = 1500\n" if name == "orders-warehouse" else ""
    here.mkdir(parents=True)
    (here / "exactly.toml").write_text(text)
    dedupe_ran(data, "rocksdb", 1)
    with open_log(f"sqlite://{data / 'log'}") as log:
        log.create_topic("exactly.sinks", 1)
        log.append("exactly.sinks", 0, [Record(b"{}", key=b"events")])
        log.append("raw", 0, [Record(b"{}", key=b"m%d" % n) for n in range(2_000)])
    with open_db(f"sqlite://{data / 'aggregates.db'}") as db:
        db.prepare([EVENT_COUNTS], "cp", fresh=True)
        rows = [
            ("web", "track", event, f"2024-01-01 {hour:02d}:05:00", 1_000 + hour, Decimal("1234.5"))
            for hour in range(10, 16)
            for event in EVENTS
        ]
        events = sum(row[4] for row in rows)
        db.commit(
            Batch(QUERY, 12, "cp", "events", {0: 6}, {"event_counts": rows}, events), [EVENT_COUNTS]
        )
    with open_jobdb(f"sqlite://{data / 'jobdb'}") as jobdb:
        queued = (("all-events", 2_500), ("orders-warehouse", 3), ("refusing", 2))
        for batch, (name, count) in enumerate(queued):
            jobs = [NewJob("web", name, b"{}", f"{name}-{n}") for n in range(count)]
            jobdb.add(jobs, query_id="route", batch_id=batch)
        refused = jobdb.pending("web/refusing")
        jobdb.record([Transition(job.id, EXECUTING, 1) for job in refused])
        error = "status 404: the receiver says " + "this hook is gone and will never come back " * 3
        jobdb.record(
            [Transition(job.id, "discarded", 1, status_code=404, response=error) for job in refused]
        )
    return here


def run(home: Path, *args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        capture_output=True,
        text=True,
        cwd=home,
        env=env,
        timeout=120,
        check=False,
    )


def assert_fits(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, "\n".join(wide)
    assert "…" not in text  # no name cut


COMMANDS = [
    ("status",),
    ("status", "--all"),
    ("stats",),
    ("deliveries",),
    ("trace", "m-1"),
    ("log", "stat"),
    ("doctor", "--no-spark"),
]


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_line_fits_80_columns(home: Path, args: tuple[str, ...], columns: int) -> None:
    done = run(home, *args, columns=columns)
    assert done.returncode in (0, 1), done.stderr
    assert done.stdout.strip(), done.stderr
    assert_fits(done.stdout)
    assert_fits(done.stderr)


def test_counts_have_separators_and_the_counts_table_a_total(home: Path) -> None:
    stats = run(home, "stats").stdout
    lines = stats.splitlines()
    assert len([line for line in lines if line.startswith("2024-01-01")]) == 30  # one line a row
    assert any("Checkout Started" in line and "1,015" in line for line in lines)
    total = lines[-1].split()
    assert total[0] == "total" and total[1] == f"{sum(1_000 + h for h in range(10, 16)) * 5:,}"
    status = run(home, "status").stdout
    assert re.search(r"raw +2 partitions +2,005 records", status), status
    assert "(30,375 events)" in status and "queued 2,500" in status
    assert QUERY in status  # on a line of its own, never cut
    table = run(home, "deliveries").stdout
    assert re.search(r"all-events +2,500 +0 +0 +0 +0", table), table
    assert "(max 1,500)" in table and "orders-warehouse" in table


def test_status_hides_internal_topics_unless_all(home: Path) -> None:
    shown = run(home, "status").stdout
    assert "raw" in shown and "exactly.sinks" not in shown
    everything = run(home, "status", "--all").stdout
    assert re.search(r"exactly\.sinks +1 partitions +1 records", everything), everything
    data = home / "data"
    assert f"data dir {data}" in shown or f"data dir\n  {data}" in shown
    assert "log sqlite log\n" in shown and "aggregate sqlite aggregates.db\n" in shown


def test_deliveries_subcommands_fit_80_columns(home: Path) -> None:
    for args in (
        ("deliveries", "pause", "orders-warehouse"),
        ("deliveries", "expire", "orders-warehouse", "--before", "1h"),
        ("deliveries", "resume", "orders-warehouse"),
    ):
        done = run(home, *args)
        assert done.returncode == 0, done.stderr
        assert_fits(done.stdout + done.stderr)
