"""``exactly import`` as a user runs it, and killed with SIGKILL at random points then resumed."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from exactly.collector.importer import import_file, producer_name
from exactly.errors import UnknownTopic
from exactly.log import open_log
from exactly.text import message
from tests.cli_text import said
from tests.integration.collector_server import read_all
from tests.seeds import crash_rng

EXACTLY = [sys.executable, "-m", "exactly"]


def write_events(path: Path, count: int, *, invalid: dict[int, str] | None = None) -> list[str]:
    """``count`` lines of events (a third without messageId); returns the lines written."""
    lines = []
    for n in range(count):
        event: dict[str, object] = {
            "type": "track", "event": "Imported", "userId": f"u{n % 97}",
            "properties": {"n": n}, "timestamp": "2024-02-03T04:05:06.789Z",
        }  # fmt: skip
        if n % 3:
            event["messageId"] = f"line-{n}"
        lines.append(json.dumps(event))
    for number, text in (invalid or {}).items():
        lines[number - 1] = text
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")
    return lines


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXACTLY, *args], capture_output=True, text=True, cwd=cwd, timeout=300, check=False
    )


def logged(log_url: str) -> int:
    """Records in raw (0 before the topic exists)."""
    try:
        with open_log(log_url) as log:
            return sum(log.end_offsets("raw").values())
    except UnknownTopic:
        return 0


def imported_numbers(log_url: str) -> Counter[int]:
    """How many times each line (by its property n) is in raw."""
    return Counter(json.loads(r.value)["properties"]["n"] for r in read_all(log_url))


def test_import_reports_invalid_lines_and_resumes_to_nothing(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_events(path, 500, invalid={7: "{not json", 9: '{"type": "track", "userId": "u"}', 11: ""})
    first = run("import", str(path), "--source", "files", cwd=tmp_path)
    assert first.returncode == 1
    text = said(first.stderr)  # each message wrapped to 80 columns
    assert f"{path}:7: " in text and f"{path}:9: track needs event" in text
    assert "imported 497 events" in text
    assert "2 invalid, 1 blank" in text
    assert text.split("2 invalid, 1 blank ")[-1].startswith("error: 2 invalid lines")
    assert "Traceback" not in first.stderr

    again = run("import", str(path), "--source", "files", cwd=tmp_path)
    assert "imported 0 events" in again.stderr and "497 already in the log" in again.stderr
    counts = imported_numbers(f"sqlite://{tmp_path / '.exactly' / 'log'}")
    assert len(counts) == 497 and set(counts.values()) == {1}
    event = json.loads(read_all(f"sqlite://{tmp_path / '.exactly' / 'log'}")[0].value)
    assert event["sourceId"] == "files" and event["originalTimestamp"] == "2024-02-03T04:05:06.789Z"


def test_gzip_and_clean_file_exit_zero(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl.gz"
    write_events(path, 300)
    done = run("import", str(path), "--source", "files", "--topic", "imports", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "imported 300 events" in done.stderr
    with open_log(f"sqlite://{tmp_path / '.exactly' / 'log'}") as log:
        assert sum(log.end_offsets("imports").values()) == 300
        assert "raw" not in log.topics()


def test_user_errors_are_one_line(tmp_path: Path) -> None:
    missing = run("import", str(tmp_path / "nope.jsonl"), "--source", "files", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("error: cannot read")
    assert missing.stderr == message(said(missing.stderr)) + "\n"  # one message
    bad_source = run("import", str(tmp_path / "x"), "--source", "a b", cwd=tmp_path)
    assert bad_source.returncode == 1 and "source name" in bad_source.stderr


def test_messageids_derived_for_lines_without_one_are_stable(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_events(path, 30)
    ids = []
    for attempt in range(2):
        with open_log(f"sqlite://{tmp_path / f'log{attempt}'}") as log:
            report = import_file(log, path, "files")
            assert report.imported == 30
        ids.append(sorted(json.loads(r.value)["messageId"] for r in read_all(log.url)))
    assert ids[0] == ids[1]
    assert producer_name("files", path) == producer_name("files", path)


@pytest.mark.slow
def test_import_killed_at_random_points_ends_with_every_line_once(tmp_path: Path) -> None:
    """SIGKILL the import at random moments (at least 10 while it is part-way), resume each time."""
    path = tmp_path / "events.jsonl"
    count = 100_000
    write_events(path, count, invalid={100: "oops"})
    command = [*EXACTLY, "import", str(path), "--source", "files", "--batch", "100"]
    log_url = f"sqlite://{tmp_path / '.exactly' / 'log'}"
    rng = crash_rng("import-crash", "1")
    part_way = 0
    progress = [0]
    for _ in range(40):
        process = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            # wait until this run has appended something, then kill it a random moment later
            deadline = time.monotonic() + 120
            while process.poll() is None and time.monotonic() < deadline:
                if logged(log_url) > progress[-1]:
                    break
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.1))  # short: an idle machine imports fast
            killed = process.poll() is None
            if killed:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if not (tmp_path / ".exactly" / "log" / "raw.sqlite").exists():
            continue
        counts = imported_numbers(log_url)
        assert max(counts.values(), default=1) == 1, "a line is in raw twice"
        assert len(counts) >= progress[-1], "a killed run lost lines a previous one had logged"
        progress.append(len(counts))
        if killed and len(counts) < count - 1:
            part_way += 1
        if part_way >= 12 or len(counts) == count - 1:
            break
    assert part_way >= 10, f"too few kills part-way through the import: {progress}"
    final = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert final.returncode == 1, final.stderr  # the one invalid line
    counts = imported_numbers(log_url)
    assert set(counts) == set(range(count)) - {99}, "lines missing"
    assert set(counts.values()) == {1}, "lines logged twice"
