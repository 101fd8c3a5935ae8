"""Durability under SIGKILL: every append that returned is there after a restart, none twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exactly.log import Record, open_log

ROOT = Path(__file__).resolve().parents[2]
KILLS = 12


def run_and_kill(
    url: str, topic: str, producer: str, rng: random.Random
) -> list[tuple[int, int, int]]:
    """Start the writer, let it append for a random while, SIGKILL it; return its acked appends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_writer", url, topic, producer],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    lines: list[str] = []
    first_ack = threading.Event()

    def collect() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            first_ack.set()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    if rng.random() < 0.25:
        time.sleep(rng.uniform(0.0, 0.3))  # early: during start-up, tail scan or the first append
    else:
        first_ack.wait(timeout=30)  # a Kafka producer needs up to a second for its producer id
        time.sleep(rng.uniform(0.02, 0.5))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join()
    acked = []
    for line in lines:
        if not line.endswith("\n"):
            continue  # cut by the kill: this append was not reported as acknowledged
        partition, first, last = map(int, line.split())
        acked.append((partition, first, last))
    return acked


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_append(log_url: str, topic: str) -> None:
    rng = random.Random(7)
    with open_log(log_url) as log:
        log.create_topic(topic, 3)
    acked: list[tuple[int, int, int]] = []
    for _ in range(KILLS):
        acked += run_and_kill(log_url, topic, "crashy", rng)
    assert len(acked) > KILLS  # the writer made progress between kills

    with open_log(log_url) as log:
        for partition in range(3):
            stored = []
            offset = 0
            while batch := log.read(topic, partition, offset, max_records=1000):
                stored += batch
                offset = batch[-1].offset + 1
            assert [r.offset for r in stored] == list(range(len(stored)))
            sequences = []
            for record in stored:
                producer, seq, padding = record.value.split(b":")
                assert producer == b"crashy" and padding == b"x" * 200  # nothing torn
                sequences.append(int(seq))
            # no gap and nothing twice: exactly 0..n-1 in order
            assert sequences == list(range(len(sequences)))
            mine = [(first, last) for p, first, last in acked if p == partition]
            if mine:
                assert max(last for _, last in mine) < len(sequences)  # every ack is stored
            assert log.last_sequence(topic, partition, "crashy") == (
                len(sequences) - 1 if sequences else None
            )
        # the log still accepts appends after all those kills
        assert log.append(topic, 0, [Record(b"after")]).appended == 1
