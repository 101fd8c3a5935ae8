"""Short reads on the Kafka log, as Tansu gave them: a fetch that stops inside committed records.

Reading ranges written by fenced transactional writers, Tansu once answered 1 record where 23
were (the next read of the same range got the other 22): a fetch can come back empty or short
with more records before the range's end. :func:`install` makes the Kafka log's fetches do that
at random (a prefix of what the broker gave, possibly none of it), so that a reader which takes
an empty read for the end of a range loses records. Every read still comes from the real broker.

In a process of its own (a Spark job, whose Python workers inherit the environment), set
``EXACTLY_TEST_SHORT_READS=RATE`` and put ``tests/faults`` on ``PYTHONPATH``
(:func:`environment`): its ``sitecustomize`` installs the fault at start-up, and every cut is
written as a line to the file ``EXACTLY_TEST_SHORT_READS_FILE`` names, so that the test can
assert that the fault fired in the processes it cannot see (:func:`cuts`).
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from pathlib import Path

RATE = "EXACTLY_TEST_SHORT_READS"
RECORD = "EXACTLY_TEST_SHORT_READS_FILE"
FAULTS = Path(__file__).resolve().parent / "faults"


class Counts:
    """How many fetches the fault cut short in this process (a test asserts it fired)."""

    cut = 0
    fetches = 0


def install(
    rate: float,
    seed: int | None = None,
    record: str | None = None,
    endings: dict[str, float] | None = None,
) -> None:
    """Cut a fraction ``rate`` of the Kafka log's fetches short, in this process; with
    ``record``, append a line to that file for each cut. ``endings`` gives the topics whose name
    ends so a rate of their own (a topic read only a few times a run)."""
    from exactly.log.kafka import KafkaLog

    original = KafkaLog._fetch
    if getattr(original, "short_reads", False):
        return
    by_ending = endings or {}
    rng = random.Random(f"{seed}-{os.getpid()}" if seed is not None else None)
    lock = threading.Lock()

    def fetch(
        self: KafkaLog,
        topic: str,
        partition: int,
        offset: int,
        limit: int,
        max_bytes: int,
        fresh: bool = False,
    ) -> tuple[list, int]:  # type: ignore[type-arg]
        records, position = original(self, topic, partition, offset, limit, max_bytes, fresh)
        with lock:
            Counts.fetches += 1
            rate_here = next((r for end, r in by_ending.items() if topic.endswith(end)), rate)
            if not records or rng.random() >= rate_here:
                return records, position
            Counts.cut += 1
            kept = records[: rng.randrange(len(records))]
            if record is not None:
                with open(record, "a") as cuts:
                    cuts.write(f"{os.getpid()} {topic} {partition} {offset}\n")
        return kept, kept[-1].offset + 1 if kept else offset

    fetch.short_reads = True  # type: ignore[attr-defined]
    KafkaLog._fetch = fetch  # type: ignore[method-assign]


def environment(
    rate: float, record: Path, endings: dict[str, float] | None = None
) -> dict[str, str]:
    """What to add to a child process's environment to have its Kafka fetches cut short, each
    cut recorded in ``record``; ``endings`` as :func:`install` takes it."""
    paths = [str(FAULTS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    rates = " ".join([str(rate), *(f"{end}={r}" for end, r in (endings or {}).items())])
    return {RATE: rates, RECORD: str(record), "PYTHONPATH": os.pathsep.join(paths)}


def rates(setting: str) -> tuple[float, dict[str, float]]:
    """The rate and the rates by topic ending of :data:`RATE`'s value ("0.25 -dst=0.6")."""
    rate, *endings = setting.split()
    return float(rate), {end: float(r) for end, _, r in (e.rpartition("=") for e in endings)}


def cuts(record: Path) -> Counter[str]:
    """How many fetches were cut short, by topic, in the processes that wrote ``record``."""
    lines = record.read_text().splitlines() if record.exists() else []
    return Counter(line.split(" ")[1] for line in lines)
