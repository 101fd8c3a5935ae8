"""What a newcomer meets (issue 32): every command's text fits 80 columns whatever the terminal's
width, names are never cut, counts read ``2,000``, and ``status`` hides internal topics.

The data dir is made without Spark (a dedupe status file, an aggregate marker, JobDB jobs), deep
in a long temporary path so that every absolute path would overflow a line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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
    ):
        done = run(home, *args)
        assert done.returncode == 0, done.stderr
        assert_fits(done.stdout + done.stderr)


# -- a fresh project at a long path (issue 41, item 5) -----------------------------------------

LONG = "a-rather-long-directory-name-" * 3
DATA_COLUMNS = 64  # the data dir's absolute path: see fresh()
DESTINATIONS_TOML = """
[[destinations]]
name = "orders-warehouse"
url = "http://127.0.0.1:9/a-rather-long-path-of-a-receiver/that-takes-orders"
"""


@pytest.fixture
def fresh() -> Iterator[Path]:
    """A project where nothing has run: a config naming a destination, its data dir
    (``./.exactly``) at an absolute path of :data:`DATA_COLUMNS` characters.

    Long enough that no line naming it with anything else fits, short enough that the longest
    URL built on it, the log's ``sqlite://DATA_DIR/log;`` in an error, fits on a line of its own
    (a longer path fits no line unless it is cut, and cutting it would make it useless). It is
    made under ``/tmp`` itself, not pytest's temporary directory, whose length depends on the
    run (``popen-gw1/`` under pytest-xdist).
    """
    base = Path(tempfile.mkdtemp(prefix="w", dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        room = DATA_COLUMNS - len(str(base)) - len("/.exactly") - 1
        assert room > 20, f"the temporary directory {base} is too long for this test"
        here = base / LONG[:room].rstrip("-")
        here.mkdir()
        (here / "exactly.toml").write_text(DESTINATIONS_TOML)
        assert len(str((here / ".exactly").resolve())) <= DATA_COLUMNS
        yield here
    finally:
        shutil.rmtree(base, ignore_errors=True)


def exactly(here: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``exactly ARGS`` in ``here``, as a user runs it, at a terminal 200 columns wide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXACTLY_")}
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=here,
        env={**env, "COLUMNS": "200"},
        timeout=120,
        check=False,
    )


def assert_told(done: subprocess.CompletedProcess[str]) -> None:
    """Every line of stdout and stderr fits 80 columns, and a failure is no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    assert_fits(done.stdout)
    assert_fits(done.stderr)
    assert done.stdout.strip() or done.stderr.strip()


FRESH = [
    ("status",),
    ("status", "--json"),
    ("deliveries",),
    ("deliveries", "directors"),
    ("deliveries", "pause", "orders-warehouse"),
    ("deliveries", "expire", "orders-warehouse", "--before", "1h"),
    ("deliveries", "pause", "no-such-destination-of-a-rather-long-name"),
    ("stats",),
    ("audit",),
    ("log", "stat"),
    ("log", "stat", "raw"),
    ("log", "read", "a-topic-that-does-not-exist-with-a-long-name"),
    ("log", "create", "raw", "--partitions", "2"),
    ("log", "create", "raw", "--partitions", "0"),
    ("sink", "owner", "raw"),
    ("lake", "optimize"),
    ("lake", "vacuum"),
    ("lake", "sql", "select 1 as one"),
    ("lake", "optimize", "--table", "mysql://somewhere/a-table-of-a-rather-long-name"),
    ("trace", "m-1"),
    ("doctor", "--no-spark"),
    ("dedupe",),  # aggregate and route start Spark before they find no topic: left out
    ("copy", "raw", "a-copy-of-raw"),
    ("collect",),
    ("replay", "--destination", "orders-warehouse", "--since", "1h"),
    ("replay",),
    ("import", "no-such-file.jsonl", "--source", "web"),
    ("import", f"/{LONG[:35]}/{LONG[:30]}.jsonl", "--source", "web"),
    ("status", "--no-such-option"),
    ("no-such-command",),
    ("log", "no-such-command"),
    (),
    ("replay", "--help"),
    ("--config", "missing-config-of-a-rather-long-name.toml", "status"),
    ("--data-dir", "elsewhere", "deliveries"),
    ("--log", f"kafka://{LONG[:70]}", "log", "stat"),  # no port: refused before connecting
    ("--log", f"mysql://{LONG}/log", "log", "stat"),
]


@pytest.mark.parametrize("args", FRESH, ids=lambda args: " ".join(args) or "(none)")
def test_every_line_on_a_fresh_project_fits_80_columns(fresh: Path, args: tuple[str, ...]) -> None:
    assert_told(exactly(fresh, *args))


BAD_CONFIGS = {
    "not toml": "data_dir = \n",
    "unknown key": "[delivery]\nno_such_setting_of_a_rather_long_name = 1\n",
    "bad value": '[dedupe]\nwindow = "a window of a rather long description"\n',
    "unreachable jobdb": (
        '[delivery]\njobdb = "postgresql://exactly:secret@127.0.0.1:9/jobs-of-a-long-name"\n'
    ),
    "bad log URL": f'[log]\nurl = "sqlite-ish://{LONG[:50]}"\n',
}


@pytest.mark.parametrize("config", BAD_CONFIGS.values(), ids=BAD_CONFIGS)
@pytest.mark.parametrize("args", [("status",), ("doctor", "--no-spark")], ids=" ".join)
def test_a_bad_config_is_told_in_80_columns(
    fresh: Path, config: str, args: tuple[str, ...]
) -> None:
    (fresh / "exactly.toml").write_text(config + DESTINATIONS_TOML)
    assert_told(exactly(fresh, *args))


def test_an_error_is_wrapped_whole_and_its_first_line_says_what(fresh: Path) -> None:
    done = exactly(fresh, "log", "stat", "raw")
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) > 1, done.stderr
    assert lines[0].startswith("error: topic 'raw' does not exist")
    assert all(line.startswith("  ") for line in lines[1:])
    whole = " ".join(done.stderr.split())
    log = fresh.resolve() / ".exactly" / "log"
    assert f"sqlite://{log}; create it with: exactly log create raw --partitions N" in whole
    assert "  create it with: exactly log create raw --partitions N" in lines  # kept together
