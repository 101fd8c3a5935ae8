"""``exactly lake optimize`` and ``exactly lake vacuum`` on a Delta table (no Spark needed)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from exactly.cli import main
from exactly.lake import Marker, open_table
from exactly.lake.columns import event_rows
from exactly.log import Record, open_log
from exactly.text import message
from tests.cli_text import said
from tests.lake_tables import plant_uncommitted


def values(start: int, count: int) -> list[bytes]:
    return [
        json.dumps({"messageId": f"m{n}", "timestamp": "2026-01-01T10:00:00Z"}).encode()
        for n in range(start, start + count)
    ]


def run(args: list[str]) -> None:
    """``exactly ARGS`` in this process; it must succeed."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code in (0, None)


def test_optimize_and_vacuum_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / ".exactly" / "lake" / "events"  # the default table of the data dir
    with open_table(f"delta://{path}") as table:
        for n in range(3):
            assert table.append(event_rows(values(n * 10, 10)), Marker("q", n))
        planted = plant_uncommitted(table, values(100, 5))
    assert planted is not None
    run(["lake", "optimize"])
    assert "3 files compacted into 1" in capsys.readouterr().out
    run(["lake", "vacuum", "--no-expire"])  # the planted file is younger than an hour
    assert "0 uncommitted files removed" in capsys.readouterr().out
    old = time.time() - 7200
    os.utime(path / planted, (old, old))
    run(["lake", "vacuum", "--no-expire"])
    out = capsys.readouterr().out
    assert f"removed {planted}" in out and "1 uncommitted files removed" in out
    assert not (path / planted).exists()
    with open_table(f"delta://{path}") as table:
        assert table.read().num_rows == 30


def test_sql_prints_80_columns_csv_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_table(f"delta://{tmp_path / '.exactly' / 'lake' / 'events'}") as table:
        assert table.append(event_rows(values(0, 150)), Marker("q", 0))
    run(["lake", "sql", "select count(*) as events, max(messageId) as last from events"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["events", "last"] and out[2].split() == ["150", "m99"]
    assert out[-1] == "(1 rows)"
    run(["lake", "sql", "select * from events order by messageId"])  # too wide: row blocks
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "-- row 1" and out[1].split() == ["messageId", "m0"]
    assert "50 more rows: add a LIMIT, or --format csv" in out and out[-1] == "(150 rows)"
    assert max(len(line) for line in out) <= 80
    run(["lake", "sql", "--format", "csv", "select messageId, timestamp from events limit 2"])
    assert capsys.readouterr().out.splitlines()[0] == '"messageId","timestamp"'
    run(["lake", "sql", "--format", "json", "select messageId, timestamp from events limit 1"])
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {"messageId": "m0", "timestamp": "2026-01-01T10:00:00Z"}
    with pytest.raises(SystemExit) as exit_:
        main(["lake", "sql", "select nope from events"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert 'column "nope" not found' in said(err) and err == message(said(err)) + "\n"


def test_status_shows_the_lakes_version_and_lag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    home = tmp_path / ".exactly"
    with open_log(f"sqlite://{home / 'log'}") as log:
        log.create_topic("events", 2)
        for partition in (0, 1):
            log.append("events", partition, [Record(value) for value in values(0, 8)])
    with open_table(f"delta://{home / 'lake' / 'events'}") as table:
        assert table.append(event_rows(values(0, 6)), Marker("q", 0, {0: 4, 1: 2}))
    run(["status"])
    out = capsys.readouterr().out
    assert "lake delta lake/events\n  version 0: 6 records of events, lag 10\n" in out
    run(["status", "--json"])
    lake = json.loads(capsys.readouterr().out)["lake"]
    assert lake["version"] == 0 and lake["landed"] == 6 and lake["lag"] == 10


def test_a_bad_table_url_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["lake", "optimize", "--table", "mysql://x/y"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: lake URL") and "delta://PATH" in said(err)
    assert err == message(said(err)) + "\n"  # one message
