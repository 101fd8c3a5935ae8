"""``exactly dedupe`` and ``exactly status`` as a user runs them (without starting Spark)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exactly.dedupe.base import Claim
from exactly.dedupe.job import DedupePlan, default_checkpoint
from exactly.dedupe.status import collect, metrics_path, prometheus, save
from exactly.dedupe.window import Bounds
from exactly.events.ids import pack_id, pack_owner
from exactly.log import Record, open_log

EXACTLY = [sys.executable, "-m", "exactly"]


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
        (["--store", "nope"], "error: --store 'nope': use one of rocksdb, spark-state"),
        (["--window", "5x"], "error: --window '5x' is not a duration"),
        (["--max-bytes", "lots"], "error: --max-bytes 'lots' is not a size"),
        (["--scope", "tenant"], "error: dedupe scope 'tenant': use one of source, workspace"),
        ([], "error: topic 'raw' does not exist"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = run("dedupe", *args, cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.split(":")[0]), done.stderr
    assert message.split("'")[0] in lines[0] or message in lines[0], lines[0]


def test_status_before_and_after_a_run(tmp_path: Path) -> None:
    assert "nothing has run" in run("status", cwd=tmp_path).stdout
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
        store = plan.open_store()
        assert store.claims
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
    report = json.loads(run("status", "--json", cwd=tmp_path).stdout)
    assert report[0]["job"] == "dedupe" and report[0]["partitions"][0]["raw_end"] == 6
    metrics = metrics_path(data, "raw").read_text()
    assert metrics == prometheus(status)
    assert 'exactly_dedupe_keys{source="raw",store="rocksdb",partition="0"} 3' in metrics
    assert "exactly_dedupe_window_seconds" in metrics
