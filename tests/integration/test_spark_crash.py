"""``exactly copy`` killed with SIGKILL at random points while its source grows, then resumed.

Each run is a real ``exactly copy`` process (driver, JVM, Python workers) in its own process
group, killed as a whole, as a machine crash would. Most kills come at a random moment after the
run copied something, so they land in every phase of a micro-batch (reading, appending, the
sink's commit, Spark's checkpoint writes); a quarter come during start-up. Three runs in four
write appends of 7 records (``--append-records``), so that a kill can land between two appends of
one task, leaving part of its output stored for the next run to find. After the last kill, a
run with ``--until-caught-up`` finishes the copy, and the destination must equal the source: per
partition, in order, no record lost and none twice.

A run's time is mostly Spark starting, so the runs start it fast: the JVM compiles with C1 only,
uses the serial collector and maps a class-data archive made by one clean run first (CDS: about
40% off the start-up); and both backends run at once, each in a thread of its own, since two
starting JVMs share the machine's two cores well.

On Kafka, a quarter of the fetches are cut short at random (``tests/short_reads.py``), as Tansu
once cut one: the source and the sink's tail read must read each range whole all the same.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exactly.errors import UnknownTopic
from exactly.log import Log, Record, open_log
from tests import short_reads
from tests.seeds import crash_seed
from tests.spark_helpers import assert_copied

KILLS = 20  # per backend, never fewer (issue 4)
PARTITIONS = 3
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class Growing:
    """Appends numbered records to the source from a thread, about 150 a second, until stopped."""

    def __init__(self, log: Log, topic: str, seed: str) -> None:
        self.log, self.topic = log, topic
        self.rng = random.Random(seed)
        self.count = [0] * PARTITIONS
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Growing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(0.02, 0.1)):
            partition = self.rng.randrange(PARTITIONS)
            first = self.count[partition]
            records = [
                Record(
                    b"%d:%d:" % (partition, n) + b"v" * self.rng.randrange(200),
                    key=b"k%d" % n,
                    headers=(("n", b"%d" % n),) if n % 2 else (),
                )
                for n in range(first, first + self.rng.choice([1, 2, 5, 20]))
            ]
            self.log.append(self.topic, partition, records)
            self.count[partition] += len(records)


@dataclass
class Report:
    backend: str
    kills: int = 0
    after_progress: int = 0
    seconds_to_progress: list[float] = field(default_factory=list)
    final: str = ""


def copied(log: Log, destination: str) -> int:
    try:
        return sum(log.end_offsets(destination).values())
    except UnknownTopic:  # the first run creates it
        return 0


def crash_and_resume(
    backend: str, log_url: str, work: Path, seed: str, jvm: str, faults: dict[str, str]
) -> Report:
    """Start, kill and restart ``exactly copy`` KILLS times while the source grows; finish it.

    ``faults``: more environment for the runs (the fetches cut short on Kafka)."""
    rng = random.Random(seed)
    name = f"crash-{uuid.uuid4().hex[:8]}"
    source, destination = f"{name}-src", f"{name}-dst"
    command = [
        *(sys.executable, "-m", "exactly", "--data-dir", str(work / "data"), "--log", log_url),
        *("copy", source, destination, "--checkpoint", str(work / "checkpoint")),
    ]
    streaming = [*command, "--trigger-seconds", "0.1", "--max-records-per-trigger", "300"]
    env = {**os.environ, "JDK_JAVA_OPTIONS": jvm, "EXACTLY_SPARK__MASTER": "local[2]", **faults}
    report = Report(backend)
    work.mkdir(parents=True, exist_ok=True)
    stderr = work / "stderr.txt"
    with open_log(log_url) as log:
        log.create_topic(source, PARTITIONS)
        with Growing(log, source, seed):
            for _ in range(KILLS):
                before = copied(log, destination)
                began = time.monotonic()
                appends = ["--append-records", str(rng.choice([7, 7, 7, 5000]))]
                with stderr.open("w") as errors:
                    process = subprocess.Popen(
                        [*streaming, *appends],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=errors,
                        env=env,
                        start_new_session=True,  # the kill takes the JVM and its workers too
                    )
                try:
                    if rng.random() < 0.25:
                        time.sleep(rng.uniform(0.5, 6.0))  # start-up, planning or a first batch
                    else:
                        deadline = began + 180
                        while copied(log, destination) <= before and process.poll() is None:
                            assert time.monotonic() < deadline, f"{backend}: no progress"
                            time.sleep(0.05)
                        report.after_progress += 1
                        report.seconds_to_progress.append(round(time.monotonic() - began, 1))
                        time.sleep(rng.uniform(0.0, 1.0))
                    assert process.poll() is None, f"{backend}: the copy died: {stderr.read_text()}"
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                report.kills += 1
        finished = subprocess.run(
            [*command, "--until-caught-up"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
        assert finished.returncode == 0, f"{backend}: {finished.stderr}"
        report.final = finished.stdout.strip()
        assert_copied(log, source, destination)
        assert sum(log.end_offsets(source).values()) > 1000  # the source grew meanwhile
    return report


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(1800)  # about 5 minutes on an idle 2-core machine; far more under load
def test_copy_killed_at_random_points_copies_exactly_once(kafka_url: str, tmp_path: Path) -> None:
    backends = {"sqlite": f"sqlite://{tmp_path / 'sqlite' / 'log'}", "kafka": kafka_url}
    cuts = tmp_path / "short-reads.txt"
    faults = {"sqlite": {}, "kafka": short_reads.environment(0.25, cuts)}
    seed = crash_seed("1")
    with ThreadPoolExecutor(len(backends)) as pool:
        futures = {
            name: pool.submit(
                crash_and_resume,
                name,
                url,
                tmp_path / name,
                f"{name}-{seed}",
                FAST_JVM,
                faults[name],
            )
            for name, url in backends.items()
        }
        reports = [future.result() for future in futures.values()]
    cut = short_reads.cuts(cuts)
    print(f"kafka: fetches cut short {dict(cut)}")
    # the source's reads and the sink's tail reads met them
    assert sum(n for topic, n in cut.items() if topic.endswith("-src")) >= 5, cut
    assert sum(n for topic, n in cut.items() if topic.endswith("-dst")) >= 5, cut
    for report in reports:
        print(report)
        assert report.kills >= KILLS
        assert report.after_progress >= KILLS // 2  # most kills hit a copy at work
