"""The console's pure parts: the state document from snapshots, the chart's series, the page's
formats and its rendering (the browser test drives the whole page)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from exactly.console.page import render, show
from exactly.console.state import (
    CHART_SERIES,
    ArchivedDeliveries,
    chart_of,
    duplicates,
    part_entry,
    stage_entries,
    totals,
    with_parts,
)
from exactly.delivery.jobdb.base import AWAITING_SCHEDULING, SUCCEEDED, Summary
from exactly.up.supervisor import Part, Running
from exactly.up.watch import History, Snapshot, Stage


def test_duplicates_are_committed_less_kept_and_rejected_never_below_zero() -> None:
    now = Snapshot(1.0, ends={"raw": 100, "events": 80, "raw.rejected": 5}, positions={})
    assert duplicates(now) is None  # dedupe has not committed a batch
    now.positions["dedupe"] = 95
    assert duplicates(now) == 10
    now.positions["dedupe"] = 70  # outputs written, the batch not committed yet
    assert duplicates(now) == 0


def test_totals_count_delivered_per_destination() -> None:
    now = Snapshot(
        1.0,
        ends={"raw": 10, "events": 9},
        positions={"dedupe": 10},
        deliveries={"b": Summary("b", {SUCCEEDED: 3, AWAITING_SCHEDULING: 2})},
    )
    found = totals(now, 7)
    assert found == {
        "accepted": 10,
        "kept": 9,
        "duplicates": 1,
        "rejected": 0,
        "suppressed": 0,
        "counted": 7,
        "delivered": {"b": 3},
    }
    # a forgotten person's records are suppressed, not duplicates
    now.ends["raw.suppressed"] = 1
    assert totals(now, 7)["duplicates"] == 0 and totals(now, 7)["suppressed"] == 1


def test_stage_rates_and_lags_from_two_snapshots() -> None:
    stages = [Stage("dedupe", "raw", __file__), Stage("aggregate", "events", __file__)]  # type: ignore[arg-type]
    history = History()
    history.add(Snapshot(10.0, ends={"raw": 100, "events": 50}, positions={"dedupe": 40}))
    history.add(Snapshot(12.0, ends={"raw": 300, "events": 150}, positions={"dedupe": 140}))
    found = {s["name"]: s for s in stage_entries(stages, history, [])}
    assert found["collector"]["per_second"] == 100.0
    assert found["dedupe"]["per_second"] == 50.0 and found["dedupe"]["lag"] == 160
    assert found["aggregate"]["done"] is None and found["aggregate"]["lag"] is None
    assert "director" not in found


def test_a_part_that_died_shows_its_restarts_and_last_words() -> None:
    running = Running(Part("pipeline", ["false"]), starts=3, restart_at=105.0)
    running.last_exit, running.last_words = 1, "error: the log is unreachable"
    entry = part_entry(running, stopping=False, now=100.0)
    assert entry["state"] == "restarting" and entry["restarts"] == 2
    assert entry["restart_in_seconds"] == 5.0 and entry["pid"] is None
    assert part_entry(running, stopping=True, now=100.0)["state"] == "stopped"
    process = subprocess.Popen(["sleep", "5"])
    try:
        running.process, running.started = process, 90.0
        entry = part_entry(running, stopping=False, now=100.0)
        assert entry["state"] == "running" and entry["pid"] == process.pid
        assert entry["up_seconds"] == 10.0
    finally:
        process.kill()
        process.wait()
    stages = with_parts([{"name": "aggregate", "part": "pipeline"}], [entry])
    assert stages[0]["restarts"] == 2 and stages[0]["last_words"].startswith("error:")


def test_the_chart_keeps_the_busiest_events_and_fills_gaps() -> None:
    rows = [("2026-01-01 10:00:00", f"event {i}", 10 - i) for i in range(8)]
    rows += [("2026-01-01 10:03:00", "event 0", 4), ("2026-01-01 10:03:00", "event 7", 1)]
    chart = chart_of(rows)
    assert chart["minutes"] == [f"2026-01-01 10:0{m}:00" for m in range(4)]
    assert len(chart["series"]) == CHART_SERIES and "other" in chart["series"]
    assert chart["series"]["event 0"] == [10, 0, 0, 4]
    assert sum(sum(values) for values in chart["series"].values()) == sum(r[2] for r in rows)
    assert chart_of([]) == {"by": "minute", "minutes": [], "series": {}}


def test_the_chart_shows_the_newest_thirty_minutes() -> None:
    rows = [(f"2026-01-01 1{h}:{m:02d}:00", "e", 1) for h in range(2) for m in range(60)]
    chart = chart_of(rows)
    assert len(chart["minutes"]) == 30 and chart["minutes"][-1] == "2026-01-01 11:59:00"


def test_formats() -> None:
    assert show(1234567, "n") == "1,234,567"
    assert show(None, "n") == "—"
    assert show(0.0, "time") == "00:00:00 UTC" and show(13 * 3600 + 5, "time") == "13:00:05 UTC"
    assert show(250.4, "ms") == "250 ms" and show(1234, "ms") == "1.2 s"
    assert show(2.25, "r") == "2.2/s" and show(1234.4, "r") == "1,234/s"
    assert show(90.0, "s") == "1m 30s"
    assert show(86_400_000, "w") == "1d"
    assert show([], "t") == "none" and show(["a", "b"], "t") == "a; b"


def test_the_page_is_rendered_with_the_state_and_escapes_it() -> None:
    document = {
        "at": 0.0,
        "totals": {
            "accepted": 1200,
            "kept": 1,
            "duplicates": 0,
            "rejected": 0,
            "counted": None,
            "delivered": {"hook": 5},
        },
        "parts": [],
        "stages": [{"name": "collector", "part": "collector", "done": 1200}],
        "dedupe": {"window_ms": 3_600_000, "warnings": []},
        "destinations": [{"name": "hook", "last_error": "<b>503</b></script>"}],
        "counts": {"by": "minute", "minutes": [], "series": {}},
        "problems": [],
    }
    page = render(document)
    assert '<div data-k="totals.accepted" data-f="n" title="1,200">1,200</div>' in page
    assert 'data-k="totals.delivered.hook"' in page
    assert "&lt;b&gt;503&lt;/b&gt;" in page and "<b>503" not in page
    assert "\\u003c/b>\\u003c/script>" in page  # the JSON cannot end its script element
    assert "{{" not in page


def _job(destination: str, *states: str) -> dict[str, object]:
    return {"destination": destination, "transitions": [{"state": s} for s in states]}


def test_archived_deliveries_are_read_once_per_file(tmp_path: Path) -> None:
    from exactly.delivery.archive import open_archive

    archive = open_archive(str(tmp_path))
    archive.write(
        "jobs-20260101T000000Z-1-1.jsonl.gz",
        [
            _job("a", "executing", "succeeded", "archiving", "archived"),
            _job("a", "executing", "discarded", "archiving", "archived"),
            _job("b", "executing", "awaiting-retry", "executing", "succeeded", "archived"),
        ],
    )
    tally = ArchivedDeliveries(str(tmp_path))
    assert tally.succeeded() == {"a": 1, "b": 1} and tally.pending == 0
    archive.write("jobs-20260101T000100Z-4-2.jsonl.gz", [_job("a", "succeeded", "archived")])
    assert tally.succeeded() == {"a": 2, "b": 1}
    (tmp_path / "jobs-20260101T000000Z-1-1.jsonl.gz").unlink()  # read once: still counted
    assert tally.succeeded() == {"a": 2, "b": 1}
    archive.write("jobs-20260101T000200Z-5-3.jsonl.gz", [_job("b", "succeeded")])
    slow = ArchivedDeliveries(str(tmp_path), budget=-1.0)  # no time to read anything
    assert slow.succeeded() == {} and slow.pending == 2


def test_the_console_worker_runs_calls_in_order_and_never_holds_up_exit() -> None:
    import sys
    import time

    from exactly.console.server import Worker

    worker = Worker("test")
    first, second = worker.submit(lambda: 1), worker.submit(lambda: 1 / 0)
    assert first.result(5) == 1
    try:
        second.result(5)
        raise AssertionError("the error was not handed back")
    except ZeroDivisionError:
        pass
    worker.stop()
    # a call stuck (a database that does not answer) does not keep the process from exiting
    began = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; from exactly.console.server import Worker; "
            "Worker('stuck').submit(lambda: time.sleep(60)); time.sleep(0.2)",
        ],
        check=True,
        timeout=30,
    )
    assert time.monotonic() - began < 10


def test_the_console_is_on_by_default_on_loopback_and_off_by_port_or_flag(
    tmp_path: Path,
) -> None:
    from exactly.config import load_settings

    config = tmp_path / "exactly.toml"
    config.write_text("")
    default = load_settings(config).console
    assert (default.host, default.port, default.on) == ("127.0.0.1", 8089, True)
    config.write_text("[console]\nport = 0\n")
    assert not load_settings(config).console.on
    config.write_text("[console]\nenabled = false\n")
    assert not load_settings(config).console.on
