"""``exactly copy`` killed with SIGKILL at random points while its source grows, then resumed.

Each run is a real ``exactly copy`` process (driver, JVM, Python workers) in its own process
group, killed as a whole, as a machine crash would. Most kills come at a random moment (0 to
0.5 s) after a micro-batch of the run's own is in flight (its ``offsets`` file written, no
``commits`` file yet), so they land in every phase of a micro-batch (reading, appending, the
sink's commit, Spark's checkpoint writes); two, chosen at random, come during start-up. Where each
kill landed is read from the checkpoint once the run is dead (``tests/batches_in_flight.py``):
at least three quarters of each backend's kills must land inside a micro-batch. Three runs in four
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

from exactly.log import Log, Record, open_log
from tests import short_reads
from tests.batches_in_flight import BATCH_WAIT, Checkpoints, Landings
from tests.job_child import AFTER_START, FAST_JVM
from tests.seeds import crash_seed
from tests.spark_helpers import assert_copied

KILLS = 20  # per backend, never fewer (issue 4)
AT_START = 2  # of them, killed during start-up (0.5-6 s after it), the others inside a batch
PARTITIONS = 3


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


def spark_log_end(data: Path, lines: int = 12) -> str:
    """The last lines of the Spark log a run's driver wrote under ``data`` (its warnings: a
    batch falling behind and by how much, a Python worker that did not connect back)."""
    logs = [log for log in (data / "logs").glob("spark-*.log") if ".stderr." not in log.name]
    if not logs:
        return "(none)"
    return "\n".join(max(logs).read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class Running:
    """Whether a run is still alive, for :meth:`Checkpoints.wait_for_batch`."""

    process: subprocess.Popen[bytes]

    def __call__(self) -> bool:
        return self.process.poll() is None


@dataclass
class Report:
    backend: str
    kills: int = 0
    after_progress: int = 0
    seconds_to_progress: list[float] = field(default_factory=list)
    landings: Landings = field(default_factory=lambda: Landings("copy"), repr=False)
    final: str = ""


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
    report = Report(backend, landings=Landings(f"copy on {backend}"))
    checkpoints = Checkpoints({"copy": work / "checkpoint"})
    work.mkdir(parents=True, exist_ok=True)
    stderr = work / "stderr.txt"
    with open_log(log_url) as log:
        log.create_topic(source, PARTITIONS)
        with Growing(log, source, seed):
            at_start = set(rng.sample(range(KILLS), AT_START))
            for kill in range(KILLS):
                checkpoints.run_starts()
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
                    if kill in at_start:
                        time.sleep(rng.uniform(0.5, 6.0))  # start-up, planning or a first batch
                    else:
                        running = Running(process)
                        working = checkpoints.wait_for_batch(BATCH_WAIT, running)
                        assert working or process.poll() is not None, (
                            f"{backend}: no batch in {BATCH_WAIT:.0f} s; the run's stderr ends: "
                            + stderr.read_text()[-1500:]
                            + "\nits Spark log ends: "
                            + spark_log_end(work / "data")
                        )
                        report.after_progress += 1
                        report.seconds_to_progress.append(round(time.monotonic() - began, 1))
                        time.sleep(rng.uniform(0.0, AFTER_START))
                    assert process.poll() is None, f"{backend}: the copy died: {stderr.read_text()}"
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                report.kills += 1
                landing = report.landings.add(checkpoints.landing())  # the run is dead
                print(f"{backend}: kill {report.kills}: {landing}", flush=True)
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
    # the sink reads the destination's tail once a run: at 0.25, 4 cuts in 24 runs happened
    tails = {"-dst": 0.6}
    faults = {"sqlite": {}, "kafka": short_reads.environment(0.25, cuts, tails)}
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
    for report in reports:
        report.landings.check()
