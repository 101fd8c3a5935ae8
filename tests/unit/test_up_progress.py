"""What ``exactly up`` and the console say while the pipeline starts and while a steady stream
flows: ``starting (N s)`` until each query's first micro-batch, rates that do not drop to 0
between two micro-batches, a clock on every line, and the same dedupe window as ``status``."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from exactly.config import load_settings
from exactly.console.page import show
from exactly.console.state import Reader, percentiles, stage_entries, with_parts
from exactly.dedupe.status import DedupeStatus, PartitionStatus, render, save, saved_window
from exactly.dedupe.window import shortest_window, window_in_effect
from exactly.stages import DEDUPE
from exactly.up import watch
from exactly.up.supervisor import Part, Supervisor
from exactly.up.view import View
from exactly.up.watch import History, Progress, Snapshot, starting


def test_a_query_is_starting_until_its_first_micro_batch() -> None:
    began = Progress(pid=42, began=100.0, first_batch={})
    assert starting(began, "dedupe", 112.0, since=None, pid=None) == 12.0
    ran = Progress(pid=42, began=100.0, first_batch={"dedupe": 130.0})
    assert starting(ran, "dedupe", 140.0, since=None, pid=None) is None
    assert starting(ran, "aggregate", 140.0, since=None, pid=None) == 40.0
    # the part restarted: the file is the earlier run's, the query starts again
    assert starting(ran, "dedupe", 140.0, since=135.0, pid=43) == 5.0
    assert starting(None, "dedupe", 140.0, since=135.0, pid=43) == 5.0
    assert starting(None, "dedupe", 140.0, since=None, pid=None) is None  # nothing known


def steady(seconds: int, every: int = 7, per_second: int = 100) -> list[Snapshot]:
    """One snapshot a second of a stream of ``per_second`` records whose query commits a
    micro-batch every ``every`` seconds (its position moves in steps)."""
    return [
        Snapshot(
            float(t),
            ends={"raw": per_second * t, "events": per_second * t},
            positions={"dedupe": per_second * (t - t % every)},
        )
        for t in range(seconds)
    ]


def test_the_rate_of_a_steady_stream_never_drops_to_zero_between_micro_batches() -> None:
    history = History()
    rates = []
    for snapshot in steady(120):
        history.add(snapshot)
        rates.append(history.rate(watch.position_of("dedupe")))
    settled = rates[int(watch.RATE_WINDOW) :]
    assert min(settled) > 0 and all(abs(r - 100) < 30 for r in settled), settled
    # two snapshots a second apart (the view before) showed 0/s most of the time
    short, zeros = History(window=1.0), 0
    for snapshot in steady(120):
        short.add(snapshot)
        zeros += short.rate(watch.position_of("dedupe")) == 0
    assert zeros > 60


def supervised(tmp_path: Path, started: float) -> Supervisor:
    supervisor = Supervisor([Part("pipeline", ["sleep", "30"])], tmp_path)
    running = supervisor.parts[0]
    running.process = subprocess.Popen(["sleep", "30"])
    running.started, running.starts = started, 1
    return supervisor


def test_up_and_the_console_say_starting_then_show_a_rate(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data")
    supervisor = supervised(tmp_path, time.monotonic() - 13)  # 12 s at the newest snapshot
    process = supervisor.parts[0].process
    assert process is not None
    lines: list[str] = []
    try:
        view = View(settings, None, supervisor, live=False, say=lines.append)  # type: ignore[arg-type]
        reader = Reader(settings, supervisor)
        at = time.time()
        for snapshot in steady(3):
            snapshot.at = at - 3 + snapshot.at
            view.history.add(snapshot)
            reader.history.add(snapshot)
        shown = view.lines()
        assert all(len(line) <= 80 for line in shown), shown
        assert all(line[:8] == time.strftime("%H:%M:%S", time.gmtime(at - 1)) for line in shown)
        dedupe = next(line for line in shown if " dedupe " in line)
        assert "starting (12 s)" in dedupe and "window 1d" in dedupe, dedupe
        stages = with_parts(
            stage_entries(watch.stages(settings), reader.history, [], reader.starting),
            reader.parts(),
        )
        entry = next(s for s in stages if s["name"] == "dedupe")
        assert entry["state"] == "starting (12 s)" and entry["per_second"] is None

        # the pipeline part reports the first micro-batch: a rate from then on
        path = watch.progress_path(settings.data_dir)
        watch.save_progress(path, Progress(process.pid, at - 12, {"dedupe": at - 1}))
        for snapshot in steady(40)[3:]:
            snapshot.at = at - 3 + snapshot.at
            snapshot.progress = watch.read_progress(path)
            view.history.add(snapshot)
            reader.history.add(snapshot)
        dedupe = next(line for line in view.lines() if " dedupe " in line)
        assert "starting" not in dedupe and " 0/s" not in dedupe and "/s" in dedupe, dedupe
        stages = stage_entries(watch.stages(settings), reader.history, [], reader.starting)
        entry = next(s for s in with_parts(stages, reader.parts()) if s["name"] == "dedupe")
        assert entry["state"] == "running" and entry["per_second"] > 0
    finally:
        process.kill()
        process.wait()


def test_status_the_console_and_up_show_the_same_window(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data")
    plan = DEDUPE.plan(settings)
    day = 24 * 3_600_000
    partitions = [
        PartitionStatus(0, 10, 10, 10, 0, keys=10, window=None),  # nothing aged out
        PartitionStatus(1, 10, 10, 10, 0, keys=10, window=5 * 3_600_000),  # aged out: 5h
    ]
    status = DedupeStatus("rocksdb", "raw", "events", "cp", day, day, partitions)
    assert window_in_effect(day, None) == day and window_in_effect(day, 2 * day) == day
    assert status.effective_window == shortest_window(day, [None, 5 * 3_600_000]) == 5 * 3_600_000
    save(plan, status)

    table = render(status)  # exactly status
    assert "unbounded" not in table and "window 5h)" in table
    rows = table.splitlines()[4:6]  # after the head, store, checkpoint and column names
    assert rows[0].split()[-1] == "1d" and rows[1].split()[-1] == "5h"
    console = Reader(settings)._dedupe(Snapshot(0.0), [])  # the console
    assert show(console["effective_window_ms"], "w") == "5h"
    assert show(console["window_ms"], "w") == "1d"
    assert saved_window(settings.data_dir, plan)[0] == 5 * 3_600_000  # exactly up
    supervisor = Supervisor([Part("pipeline", ["true"])], tmp_path)
    view = View(settings, None, supervisor, live=False)  # type: ignore[arg-type]
    view.window = saved_window(settings.data_dir, plan)[0]
    view.history.add(Snapshot(time.time()))
    assert any("window 5h" in line for line in view.lines())


def test_latency_percentiles_are_weighted() -> None:
    assert percentiles([]) == {"p50_ms": None, "p99_ms": None, "events": 0}
    found = percentiles([(100.0, 98.0), (900.0, 1.0), (5000.0, 1.0)])
    assert found == {"p50_ms": 100, "p99_ms": 900, "events": 100}


def test_several_directors_are_one_entry_of_the_parts_line(tmp_path: Path) -> None:
    """[delivery] directors = 8: the parts line stays within 80 columns."""
    names = ["collector", "pipeline", "director", *(f"director-{n}" for n in range(2, 9))]
    supervisor = Supervisor([Part(name, ["true"]) for name in names], tmp_path)
    view = View(load_settings(data_dir=tmp_path / "data"), None, supervisor, live=False)  # type: ignore[arg-type]
    line = f"14:02:07 UTC  {view.parts()}"
    assert line.endswith("pipeline starting; directors 0/8 up") and len(line) <= 80, line
    for running in supervisor.parts[2:]:
        running.starts = 3  # each director restarted twice
    assert view.parts().endswith("directors 0/8 up (16 restarts)")


def test_up_the_console_and_status_say_what_a_starting_query_waits_on(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data")
    supervisor = supervised(tmp_path, time.monotonic() - 13)
    process = supervisor.parts[0].process
    assert process is not None
    try:
        path = watch.progress_path(settings.data_dir)
        waiting = {"dedupe": "batch 48, run again", "aggregate": "Spark to start"}
        at = time.time()
        watch.save_progress(path, Progress(process.pid, at - 12, {"aggregate": at - 1}, waiting))
        view = View(settings, None, supervisor, live=False)  # type: ignore[arg-type]
        reader = Reader(settings, supervisor)
        for snapshot in steady(3):
            snapshot.at = at - 3 + snapshot.at
            snapshot.progress = watch.read_progress(path)
            view.history.add(snapshot)
            reader.history.add(snapshot)
        shown = view.lines()
        assert all(len(line) <= 80 for line in shown), shown
        dedupe = next(line for line in shown if " dedupe " in line)
        assert dedupe.endswith("starting (12 s)  window 1d  on batch 48, run again"), dedupe
        aggregate = next(line for line in shown if " aggregate " in line)
        assert "starting" not in aggregate and " on " not in aggregate, aggregate
        entries = stage_entries(
            watch.stages(settings), reader.history, [], reader.starting, reader.waiting_on
        )
        entry = next(s for s in with_parts(entries, reader.parts()) if s["name"] == "dedupe")
        assert entry["waiting_on"] == "batch 48, run again"
        assert entry["state"] == "starting (12 s), on batch 48, run again"
        # exactly status: the running part's starting queries; none once the part is gone
        starting_now = watch.starting_now(settings.data_dir, now=at)
        assert starting_now == {"dedupe": (12.0, "batch 48, run again")}
    finally:
        process.kill()
        process.wait()
    assert watch.starting_now(settings.data_dir) == {}
