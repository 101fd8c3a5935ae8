"""``exactly dedupe`` and ``exactly status`` as a user runs them (without starting Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exactly.dedupe.base import Claim
from exactly.dedupe.job import DedupePlan, default_checkpoint, store_kind
from exactly.dedupe.status import (
    DedupeStatus,
    collect,
    load,
    metrics_path,
    prometheus,
    save,
    status_path,
)
from exactly.dedupe.window import Bounds
from exactly.errors import ConfigError
from exactly.events.ids import pack_id, pack_owner
from exactly.log import Record, open_log
from tests.cli_text import messages
from tests.conftest import redis_namespace
from tests.dedupe_stores import redis_store_url

EXACTLY = [sys.executable, "-m", "exactly"]
HOUR = 3_600_000


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXACTLY, "--data-dir", str(cwd / "data"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store", "nope"], "error: dedupe store 'nope': use rocksdb, rocksdb://DIR"),
        (["--store", "redis"], "error: the redis dedupe store needs its servers"),
        (
            ["--store", "redis://:hunter2@127.0.0.1:1/0?shards=2"],
            "error: redis store URL 'redis://:***@127.0.0.1:1/0?shards=2&namespace=exactly",
        ),
        (["--window", "5x"], "error: --window '5x' is not a duration"),
        (["--max-bytes", "lots"], "error: --max-bytes 'lots' is not a size"),
        (["--scope", "tenant"], "error: dedupe scope 'tenant': use one of source, workspace"),
        ([], "error: topic 'raw' does not exist"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = run("dedupe", *args, cwd=tmp_path)
    assert done.returncode == 1
    lines = messages(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(message.split(":")[0]), done.stderr
    assert message.split("'")[0] in lines[0] or message in lines[0], lines[0]
    assert "hunter2" not in done.stderr


def test_status_before_and_after_a_run(tmp_path: Path) -> None:
    assert "nothing has run" in run("status", cwd=tmp_path).stderr
    data = tmp_path / "data"
    log_url = f"sqlite://{data / 'log'}"
    plan = DedupePlan(
        log_url,
        "rocksdb",
        data,
        default_checkpoint(data, "rocksdb", "raw", "events"),
        bounds=Bounds(max_keys=3, window=3_600_000),
        min_window=86_400_000,
    )
    with open_log(log_url) as log:
        log.create_topic("raw", 2)
        log.create_topic("events", 2)
        log.append("raw", 0, [Record(b"{}", key=b"m%d" % n) for n in range(6)])
        assert plan.mode == "claim"
        store = plan.open_store()
        now = int(time.time() * 1000)
        with store.open(0) as part:
            for n in range(6):  # the bound of 3 ages ids out: the window is bounded, and short
                part.claim([Claim(pack_id(f"m{n}"), pack_owner(0, n), now - 1_000 * (6 - n))])
        status = collect(log, plan)
        save(plan, status)
    assert status.partitions[0].keys == 3 and status.partitions[0].window is not None
    assert status.warnings() and "below the minimum 1d" in status.warnings()[0]
    text = run("status", cwd=tmp_path).stdout
    assert "dedupe raw -> events (rocksdb" in text and "warning: partition 0" in text
    report = json.loads(run("status", "--json", cwd=tmp_path).stdout)["dedupe"]
    assert report[0]["job"] == "dedupe" and report[0]["partitions"][0]["raw_end"] == 6
    metrics = metrics_path(data, "raw").read_text()
    assert metrics == prometheus(status)
    assert 'exactly_dedupe_keys{source="raw",store="rocksdb",partition="0"} 3' in metrics
    assert "exactly_dedupe_window_seconds" in metrics


def dedupe_ran(data: Path, store: str, partition: int, scope: str = "source") -> None:
    """As if a dedupe job ran in ``data``: 5 records in raw ``partition``, 3 claimed, its status
    file saved."""
    log_url = f"sqlite://{data / 'log'}"
    checkpoint = default_checkpoint(data, store_kind(store), "raw", "events")
    plan = DedupePlan(log_url, store, data, checkpoint, scope=scope)
    with open_log(log_url) as log:
        log.create_topic("raw", 2)
        log.create_topic("events", 2)
        log.append("raw", partition, [Record(b"{}", key=b"m%d" % n) for n in range(5)])
        with plan.open_store().open(partition) as part:
            part.claim(
                [Claim(pack_id(f"m{n}"), pack_owner(partition, n), 1_000 + n) for n in range(3)]
            )
        save(plan, collect(log, plan))


def test_status_after_a_redis_run_needs_no_flags_nor_config(
    tmp_path: Path, redis_servers: list[str]
) -> None:
    store = redis_store_url(redis_servers[:2], redis_namespace())
    dedupe_ran(tmp_path / "data", store, 0)
    done = run("status", cwd=tmp_path)  # the store is in the status file: nothing to repeat
    assert done.returncode == 0, done.stderr
    assert "dedupe raw -> events (redis" in done.stdout
    report = json.loads(run("status", "--json", cwd=tmp_path).stdout)["dedupe"]
    assert report[0]["store"] == "redis" and report[0]["location"] == store
    assert report[0]["partitions"][0]["keys"] == 3


def test_the_status_file_keeps_the_store_url_without_its_password(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_url = f"sqlite://{data / 'log'}"
    url = "redis://:hunter2@127.0.0.1:1/0?namespace=ns"
    plan = DedupePlan(log_url, url, data, data / "checkpoint")
    save(plan, DedupeStatus("redis", "raw", "events", str(plan.checkpoint), HOUR, None))
    path = status_path(data, "raw")
    assert "hunter2" not in path.read_text()
    assert '"store": "redis://:***@127.0.0.1:1/0?namespace=ns"' in path.read_text()
    loaded, _ = load(path, log_url, data, url)  # the same store in the settings: its password
    assert loaded.store == url
    with pytest.raises(ConfigError, match=r"needs its password: set \[dedupe\] store"):
        load(path, log_url, data, "redis://:hunter2@127.0.0.1:2/0?namespace=ns")  # another
    done = run("status", cwd=tmp_path)
    assert done.returncode == 1 and "needs its password" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("dedupe", ["[dedupe.store; default rocksdb]", "[dedupe.window; default 24h]", "[dedupe]"]),
        ("collect", ["[collector.host; default 127.0.0.1]", "Prefer [collector.sources]"]),
    ],
)
def test_help_names_the_setting_behind_each_option(command: str, shown: list[str]) -> None:
    done = subprocess.run(
        [*EXACTLY, command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    words = " ".join(done.stdout.split())  # the help is wrapped at 80 columns whatever COLUMNS
    for text in shown:
        assert text in words


def test_status_covers_every_stage_from_the_config(tmp_path: Path) -> None:
    from exactly.aggregate import open_db
    from exactly.aggregate.base import Batch
    from exactly.aggregate.spec import EVENT_COUNTS
    from exactly.delivery.jobdb import open_jobdb
    from exactly.delivery.jobdb.base import NewJob

    data = tmp_path / "data"
    (tmp_path / "exactly.toml").write_text(
        f'data_dir = "{data}"\n[dedupe]\nscope = "workspace"\n'
        '[[destinations]]\nname = "hook"\nurl = "http://127.0.0.1:9/hook"\n'
        '[[destinations]]\nname = "idle"\nurl = "http://127.0.0.1:9/idle"\n'
    )
    dedupe_ran(data, "rocksdb", 1, scope="workspace")
    with open_db(f"sqlite://{data / 'aggregates.db'}") as db:
        db.prepare([EVENT_COUNTS], "cp", fresh=True)
        rows = [("web", "track", "A", "2024-01-01 00:00:00", 3, 0)]
        db.commit(Batch("q1", 4, "cp", "events", {0: 3}, {"event_counts": rows}, 3), [EVENT_COUNTS])
    with open_jobdb(f"sqlite://{data / 'jobdb'}") as jobdb:
        jobs = [NewJob("web", "hook", b"{}", f"m{n}", None, 0.0) for n in range(2)]
        jobdb.add(jobs, query_id="route", batch_id=0)
    done = subprocess.run(
        [*EXACTLY, "status", "--json"], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    report = json.loads(done.stdout)
    raw = next(t for t in report["log"]["topics"] if t["topic"] == "raw")
    assert raw["partitions"] == 2 and raw["records"] == 5 and raw["end_offsets"] == {"0": 0, "1": 5}
    dedupe = report["dedupe"][0]
    assert (dedupe["store"], dedupe["scope"]) == ("rocksdb", "workspace")
    assert dedupe["location"] == f"rocksdb://{data / 'dedupe' / 'raw' / 'rocksdb'}"
    assert (dedupe["partitions"][1]["keys"], dedupe["partitions"][1]["position"]) == (3, 3)
    marker = report["aggregate"]["marker"]
    assert (marker["query_id"], marker["batch_id"], marker["events"]) == ("q1", 4, 3)
    queued = {d["destination"]: d["queued"] for d in report["delivery"]["destinations"]}
    assert queued == {"hook": 2, "idle": 0}
    text = subprocess.run(
        [*EXACTLY, "status"], capture_output=True, text=True, cwd=tmp_path, check=True
    ).stdout
    for line in (
        "log sqlite log\n",
        "dedupe raw -> events (rocksdb, scope workspace, window",
        "store rocksdb dedupe/raw/rocksdb",
        "aggregate sqlite aggregates.db\n",
        "batch 4 committed at",
        "of query q1",
        "hook: queued 2",
        "idle: queued 0",
    ):
        assert line in text, text
    assert f"data dir {data}" in " ".join(text.split())  # a long path on a line of its own


def test_status_of_a_fresh_data_dir_creates_nothing(tmp_path: Path) -> None:
    done = run("status", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert messages(done.stderr) == [f"nothing has run in {tmp_path.resolve() / 'data'} yet"]
    done = run("status", "--json", cwd=tmp_path)  # no stage to report: the same line
    assert done.returncode == 1 and done.stdout == "" and "nothing has run" in done.stderr
    assert not (tmp_path / "data").exists()


def test_an_unreachable_database_is_one_line_and_hides_no_other_stage(tmp_path: Path) -> None:
    data = tmp_path / "data"
    dedupe_ran(data, "rocksdb", 0)
    (tmp_path / "exactly.toml").write_text(
        f'data_dir = "{data}"\n[aggregate]\nurl = "postgresql://u:hunter2@127.0.0.1:1/x"\n'
        '[delivery]\njobdb = "mysql://root:hunter2@127.0.0.1:1/test"\n'
    )
    done = run("status", "--json", cwd=tmp_path)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["dedupe"][0]["partitions"][0]["keys"] == 3
    assert report["aggregate"]["url"] == "postgresql://u:***@127.0.0.1:1/x"
    assert report["aggregate"]["error"] and report["delivery"]["error"]
    lines = messages(done.stderr)
    assert [line.split(":")[:2] for line in lines] == [
        ["error", " aggregate"],
        ["error", " delivery"],
    ]
    text = run("status", cwd=tmp_path)
    assert text.returncode == 1 and "dedupe raw -> events (rocksdb" in text.stdout
    assert "hunter2" not in done.stdout + done.stderr + text.stdout + text.stderr
