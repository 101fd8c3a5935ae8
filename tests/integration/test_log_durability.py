"""Durability under SIGKILL: every append that returned is there after a restart, none twice."""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exactly.errors import LogError
from exactly.log import Record, open_log
from tests.seeds import crash_rng

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
    rng = crash_rng("log-writer-crash", "7")
    with open_log(log_url) as log:
        log.create_topic(topic, 3)
    acked: list[tuple[int, int, int]] = []
    for _ in range(KILLS):
        acked += run_and_kill(log_url, topic, "crashy", rng)
    assert len(acked) > KILLS  # the writer made progress between kills

    with open_log(log_url) as log:
        # as a restarted producer does: last_sequence first. On sqlite this starts a writer, which
        # syncs and shows what the last killed writer committed but never synced (nor acked).
        last = [log.last_sequence(topic, partition, "crashy") for partition in range(3)]
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
            assert last[partition] == (len(sequences) - 1 if sequences else None)
        # the log still accepts appends after all those kills
        assert log.append(topic, 0, [Record(b"after")]).appended == 1


# -- sqlite: readers stop at the synced watermark; a failed fsync is fatal for its writer ---------


class HeldSync:
    """``os.fdatasync`` for the log's syncer threads: waits until released, then syncs or fails.

    Other threads (a writer's recovery at start, the test itself) sync at once.
    """

    def __init__(self, *, fail_first: bool = False) -> None:
        self.real = os.fdatasync
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_first = fail_first
        self.calls = 0

    def __call__(self, fd: int) -> None:
        if threading.current_thread().name.startswith("log-sync-"):
            self.calls += 1
            self.entered.set()
            assert self.release.wait(30)
            if self.fail_first and self.calls == 1:
                raise OSError(errno.EIO, "Input/output error")
        self.real(fd)


def committed_rows(directory: Path, topic: str) -> int:
    """Records committed to the topic's database, synced or not (what a reader saw before)."""
    with sqlite3.connect(directory / f"{topic}.sqlite") as conn:
        (count,) = conn.execute("SELECT coalesce(sum(count), 0) FROM batches").fetchone()
    return int(count)


def test_readers_do_not_see_records_before_their_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from exactly.spark.datasource.options import SourceOptions
    from exactly.spark.datasource.source import (
        LogBatchReader,
        LogStreamReader,
        OffsetRange,
        read_range,
    )

    url = f"sqlite://{tmp_path / 'log'}"
    with open_log(url) as writer, open_log(url) as reader, ThreadPoolExecutor(2) as pool:
        writer.create_topic("t", 2)
        writer.append("t", 0, [Record(b"durable")])
        held = HeldSync()
        monkeypatch.setattr(os, "fdatasync", held)
        pending = pool.submit(writer.append, "t", 0, [Record(b"a"), Record(b"b")])
        assert held.entered.wait(10)
        assert committed_rows(tmp_path / "log", "t") == 3  # committed, not yet synced

        assert reader.end_offsets("t") == {0: 1, 1: 0}
        assert reader.end_offset("t", 0) == 1
        assert [r.value for r in reader.read("t", 0, 0)] == [b"durable"]
        assert reader.read("t", 0, 1) == []
        # the Spark source plans and reads through the same methods
        options = SourceOptions(log=url, topic="t", arrow=False)
        assert LogBatchReader(options).partitions() == [OffsetRange(0, 0, 1)]
        stream = LogStreamReader(options)
        assert stream.latestOffset({"0": 0, "1": 0}, ReadAllAvailable()) == {"0": 1, "1": 0}
        # a task asked for a range past the durable end reads what is durable, then waits
        rows = read_range(options, OffsetRange(0, 0, 3))
        assert next(rows)[3] == b"durable"
        following = pool.submit(next, rows)
        time.sleep(0.5)
        assert not following.done() and not pending.done()

        held.release.set()
        assert pending.result(10).offsets == [1, 2]
        assert [following.result(10)[3], *(row[3] for row in rows)] == [b"a", b"b"]
        assert reader.end_offsets("t") == {0: 3, 1: 0}
        assert [r.value for r in reader.read("t", 0, 0)] == [b"durable", b"a", b"b"]
        assert stream.latestOffset({"0": 0, "1": 0}, ReadAllAvailable()) == {"0": 3, "1": 0}


_HELD_WRITER = """
import os, sys, threading
from exactly.log import Record, open_log

url, topic = sys.argv[1:3]
real = os.fdatasync

def held(fd):
    if threading.current_thread().name.startswith("log-sync-"):
        print("committed", flush=True)
        threading.Event().wait()  # killed here: committed, never synced
    real(fd)

with open_log(url) as log:
    log.topic_info(topic)
    os.fdatasync = held
    log.append(topic, 0, [Record(b"a"), Record(b"b")], producer="p", sequences=[0, 1])
"""


@pytest.mark.parametrize("opens", ["a writer", "a reader that settles"])
def test_records_of_a_writer_killed_before_its_fsync_show_once_a_writer_opens(
    tmp_path: Path, opens: str
) -> None:
    url = f"sqlite://{tmp_path / 'log'}"
    with open_log(url) as log:
        log.create_topic("t", 2)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HELD_WRITER, url, "t"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "committed"
        assert committed_rows(tmp_path / "log", "t") == 2
        with open_log(url) as reader:
            assert reader.end_offsets("t") == {0: 0, 1: 0}
            assert reader.read("t", 0, 0) == []
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert reader.end_offsets("t") == {0: 0, 1: 0}  # never acknowledged, still unsynced
            if opens == "a reader that settles":  # as `exactly forget` reads, run again
                with open_log(url) as settler:
                    settler.settle("t")
                    assert settler.end_offsets("t") == {0: 2, 1: 0}
                assert reader.end_offsets("t") == {0: 2, 1: 0}
            with open_log(url) as successor:
                # a process that starts writing syncs what is committed and raises the watermark;
                # a producer resumes after records that are durable now
                assert successor.last_sequence("t", 0, "p") == 1
                assert reader.end_offsets("t") == {0: 2, 1: 0}
                assert [r.value for r in reader.read("t", 0, 0)] == [b"a", b"b"]
                successor.append("t", 0, [Record(b"c")], producer="p", sequences=[2])
            assert [r.value for r in reader.read("t", 0, 0)] == [b"a", b"b", b"c"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watermark_file_missing_or_corrupt_is_rebuilt(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    with open_log(f"sqlite://{directory}") as log:
        log.create_topic("t", 2)
        log.append("t", 1, [Record(b"a"), Record(b"b")])
    synced = directory / "t.synced"
    for damage in (b"", b"garbage", b"\0" * 4096):
        synced.write_bytes(damage)
        with open_log(f"sqlite://{directory}") as reader:
            assert reader.end_offsets("t") == {0: 0, 1: 2}
            assert [r.value for r in reader.read("t", 1, 0)] == [b"a", b"b"]
    synced.unlink()
    with open_log(f"sqlite://{directory}") as reader:
        assert [r.value for r in reader.read("t", 1, 0)] == [b"a", b"b"]


def test_a_failed_fsync_is_fatal_for_its_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO: nothing in flight or queued is acknowledged, even if a later fsync would succeed; the
    next append reopens (cached pages dropped), verifies and fsyncs before it answers."""
    url = f"sqlite://{tmp_path / 'log'}"
    dropped: list[int] = []
    real_fadvise = os.posix_fadvise

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        dropped.append(advice)
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    with open_log(url) as log, ThreadPoolExecutor(4) as pool:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"ok")])
        held = HeldSync(fail_first=True)  # the first sync fails, later ones would succeed
        monkeypatch.setattr(os, "fdatasync", held)
        first = pool.submit(log.append, "t", 0, [Record(b"lost?")])
        assert held.entered.wait(10)
        queued = [pool.submit(log.append, "t", 0, [Record(b"queued")]) for _ in range(3)]
        time.sleep(0.3)  # committed behind the failing sync, or waiting for the committer
        held.release.set()
        for future in (first, *queued):
            with pytest.raises(LogError, match="could not fsync"):
                future.result(10)
        assert held.calls == 1  # no fsync on the broken connection, so no answer over lost pages

        monkeypatch.setattr(os, "fdatasync", held.real)
        assert log.append("t", 0, [Record(b"after")]).offsets == [
            committed_rows(tmp_path / "log", "t") - 1
        ]
        assert os.POSIX_FADV_DONTNEED in dropped
        stored = [r.value for r in log.read("t", 0, 0)]
        assert stored[0] == b"ok" and stored[-1] == b"after"
        assert [r.offset for r in log.read("t", 0, 0)] == list(range(len(stored)))


def test_a_writer_that_cannot_fsync_refuses_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite://{tmp_path / 'log'}"
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with open_log(url) as log:
        log.create_topic("t", 1)
        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(LogError, match="could not fsync"):
            log.append("t", 0, [Record(b"a")])
        with pytest.raises(LogError, match="integrity_check"):
            log.append("t", 0, [Record(b"b")])  # the reopen's own fsync fails: nothing answered
        monkeypatch.setattr(os, "fdatasync", real)
        assert log.append("t", 0, [Record(b"c")]).appended == 1


_READ_AND_CLOSE = """
import sys
from exactly.log import open_log

with open_log(sys.argv[1]) as log:
    print(len(log.read(sys.argv[2], 0, 0)))
"""


def test_a_writer_start_keeps_sqlite_locks_so_no_other_process_deletes_its_wal(
    tmp_path: Path,
) -> None:
    """Closing any descriptor of a database drops the process's SQLite (POSIX) locks on it; a
    reader elsewhere then believes it is the last connection, checkpoints and deletes the WAL that
    this writer keeps appending to. The writer's recovery must not open the database file."""
    url = f"sqlite://{tmp_path / 'log'}"
    with open_log(url) as log:
        log.create_topic("t", 1)
    with open_log(url) as log:
        log.append("t", 0, [Record(b"a")])  # this process's writer starts: recovery
        for expected in (1, 2):
            out = subprocess.run(
                [sys.executable, "-c", _READ_AND_CLOSE, url, "t"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            assert out.stdout.strip() == str(expected)
            log.append("t", 0, [Record(b"b")])
        assert (tmp_path / "log" / "t.sqlite-wal").exists()
    with open_log(url) as log:
        assert [r.value for r in log.read("t", 0, 0)] == [b"a", b"b", b"b"]


def _create_at(url: str, topic: str, start: float) -> str:
    """In a pool process: wait for ``start``, create ``topic`` if missing; the error, if any."""
    while time.time() < start:
        pass
    try:
        with open_log(url) as log:
            log.create_topic(topic, 1, exist_ok=True)
    except LogError as error:
        return str(error)
    return ""


def test_processes_starting_on_a_new_topic_together_all_open_it(tmp_path: Path) -> None:
    """A job's tasks start together and each opens the new topic's file for writing. Putting it in
    WAL mode upgrades a read to a write transaction, which SQLite refuses at once while another
    connection writes (no busy handler there): each must wait its turn instead of failing. Without
    the wait, about one round in five had a process fail with ``database is locked``."""
    with multiprocessing.get_context("spawn").Pool(5) as pool:
        for attempt in range(20):
            url = f"sqlite://{tmp_path / str(attempt)}"
            start = time.time() + 0.2
            errors = pool.starmap(_create_at, [(url, "exactly.sinks", start)] * 5)
            assert errors == [""] * 5, f"round {attempt}: {errors}"
