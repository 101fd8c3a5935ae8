"""``exactly trace`` on the Kafka log, which keeps no index by messageId: one line, no scan."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exactly.log import Record, open_log
from tests.cli_text import messages, said


def test_trace_on_kafka_says_it_is_unavailable_in_one_line(kafka_url: str, tmp_path: Path) -> None:
    with open_log(kafka_url) as log:
        log.create_topic("raw", 2, exist_ok=True)
        log.append("raw", 0, [Record(b"{}", b"m-1")])
    args = ["--data-dir", str(tmp_path), "--log", kafka_url, "trace", "m-1"]
    shown = subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
        check=False,
    )
    assert shown.returncode == 1
    assert len(messages(shown.stderr)) == 1 and shown.stderr.startswith("error: "), shown.stderr
    assert "unavailable for this log" in said(shown.stderr)
